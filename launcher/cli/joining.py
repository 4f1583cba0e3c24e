"""``--nnodes N --node-rank R --rdzv-endpoint HOST:PORT``: every node runs the same command.

Node rank 0 owns the run (:class:`launcher.sources.joined.JoinedSource`); every other rank joins
it (:func:`join_run`): its agent serves the run's tasks of this node and it exits with the run's
exit code. Options only parse here; the source checks the token and the endpoint.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import click

from ..options import RunOptions
from ..sources.choose import ClusterChoice

JOIN_OPTIONS = ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_token_file", "rdzv_timeout", "tasks_per_node")


def join_options(command: Callable) -> Callable:
    """The rendezvous options, added to ``tflaunch run``."""
    from ..sources.joined import DEFAULT_TIMEOUT, TOKEN_VARIABLE

    options = [
        click.option("--nnodes", metavar="N", type=click.IntRange(min=1),
                     help="Every node runs this same command: N nodes in all (no ssh between them)."),
        click.option("--node-rank", metavar="R", type=click.IntRange(min=0), default=0, show_default=True,
                     help="With --nnodes: this node's rank; rank 0 owns the run and listens at --rdzv-endpoint."),
        click.option("--rdzv-endpoint", metavar="HOST:PORT",
                     help="With --nnodes: where node rank 0 listens (an address of rank 0's host)."),
        click.option("--rdzv-token-file", metavar="FILE",
                     help=f"With --nnodes: the run's token, which every node has (or set {TOKEN_VARIABLE})."),
        click.option("--rdzv-timeout", metavar="SECONDS", type=click.FloatRange(min=0, min_open=True),
                     default=DEFAULT_TIMEOUT, show_default=True,
                     help="With --nnodes: how long the nodes wait for each other."),
        click.option("--tasks-per-node", metavar="K", type=click.IntRange(min=1), default=1, show_default=True,
                     help="With --nnodes: tasks on each node (roles: --chief, --ps, --evaluator)."),
    ]
    return functools.reduce(lambda wrapped, option: option(wrapped), reversed(options), command)


def _checked(choice: ClusterChoice, options: dict[str, Any]) -> tuple[str, int, str]:
    from ..sources.joined import parse_endpoint, read_token

    if any(value is not None for value in (choice.cluster, choice.local, choice.hosts, choice.hostfile, choice.spares)) \
            or options.get("slurm"):
        raise click.UsageError("--nnodes takes its hosts from the nodes that join; drop the cluster file, --local, "
                               "-H, --hostfile, --spares and --slurm")
    if not options["rdzv_endpoint"]:
        raise click.UsageError("--nnodes needs --rdzv-endpoint HOST:PORT (where node rank 0 listens)")
    if options["node_rank"] >= options["nnodes"]:
        raise click.UsageError(f"--node-rank: expected 0 to {options['nnodes'] - 1} with --nnodes "
                               f"{options['nnodes']}, got {options['node_rank']}")
    host, port = parse_endpoint(options["rdzv_endpoint"])
    return host, port, read_token(options["rdzv_token_file"], host)


def joined_source(choice: ClusterChoice, options: dict[str, Any]):
    """Node rank 0's source: the rendezvous at the endpoint, then the nodes that joined it."""
    from ..sources.joined import JoinedNodes, JoinedSource

    host, port, token = _checked(choice, options)
    return JoinedNodes(JoinedSource(nnodes=options["nnodes"], host=host, port=port, token=token,
                                    timeout=options["rdzv_timeout"], tasks_per_node=options["tasks_per_node"],
                                    chief=choice.chief, ps=choice.ps, evaluator=choice.evaluator, gpus=choice.gpus))


def join_run(choice: ClusterChoice, options: dict[str, Any], given: RunOptions) -> int:
    """A node of rank R > 0: join the run at the endpoint and serve its tasks here; the run's exit code."""
    from ..agent.protocol import LOST_RUN
    from ..transports.joined import join

    host, port, token = _checked(choice, options)
    rank = options["node_rank"]
    click.echo(f"tflaunch: node rank {rank} of {options['nnodes']}: joining the run at {host}:{port}", err=True)
    code = join(host, port, rank, token, options["rdzv_timeout"], given.grace, options["nnodes"])
    if code == LOST_RUN:
        click.echo(f"tflaunch: node rank {rank}: the run's owner (node rank 0) went away; this node's tasks were "
                   "stopped", err=True)
    elif code == 2:
        click.echo(f"tflaunch: node rank {rank}: no owner at {host}:{port} proved itself within --rdzv-timeout "
                   f"{options['rdzv_timeout']:g} s", err=True)
    else:
        click.echo(f"tflaunch: node rank {rank}: the run ended with exit code {code}", err=True)
    return code
