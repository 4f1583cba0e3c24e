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



def platform_nodes(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with --nnodes, --node-rank and --rdzv-endpoint filled from --nodes-from's
    platform (what was given wins), after one line saying what was found."""
    options = {**options, **_node_count(options["nnodes"])}
    if not options.get("nodes_from"):
        if options["nnodes"] is None and (options["node_rank"] is not None or options["rdzv_endpoint"]):
            raise click.UsageError("--node-rank and --rdzv-endpoint go with --nnodes N (or --nodes-from PLATFORM)")
        return {**options, "node_rank": options["node_rank"] or 0}
    import os
    import socket

    from ..sources.platforms import DEFAULT_PORT, nodes_from

    found = nodes_from(options["nodes_from"], os.environ, socket.getfqdn(), options["nnodes"])
    host = found.host or _own_address()
    given_port = options["rdzv_endpoint"].rpartition(":")[2] if options["rdzv_endpoint"] else ""
    endpoint = options["rdzv_endpoint"] if options["rdzv_endpoint"] and not options["rdzv_endpoint"].startswith(":") \
        else f"{host}:{given_port or DEFAULT_PORT}"
    filled = {**options, "nnodes": options["nnodes"] or found.nnodes,
              "node_rank": found.rank if options["node_rank"] is None else options["node_rank"],
              "rdzv_endpoint": endpoint}
    click.echo(f"tflaunch: --nodes-from {options['nodes_from']}: {found.platform}, node rank {filled['node_rank']} "
               f"of {filled['nnodes']}, rank 0 at {endpoint}", err=True)
    return filled


def _node_count(text: str | None) -> dict[str, int | None]:
    """``--nnodes N`` or ``MIN:MAX`` as nnodes (MAX) and nnodes_min (None for N)."""
    if text is None:
        return {"nnodes": None, "nnodes_min": None}
    low, sep, high = text.partition(":")
    words = [low, high] if sep else [low]
    if not all(w.strip().isascii() and w.strip().isdigit() and int(w) >= 1 for w in words) or \
            (sep and int(low) > int(high)):
        raise click.UsageError(f"--nnodes: expected N or MIN:MAX (whole numbers, 1 <= MIN <= MAX), got {text!r}")
    return {"nnodes": int(words[-1]), "nnodes_min": int(low) if sep else None}


def _own_address() -> str:
    """This machine's address for the others (a platform that names none for rank 0): its first
    address that is not loopback."""
    from ..cluster.machine import local_host_names
    from ..cluster.spec import is_loopback

    import ipaddress

    addresses = []
    for name in local_host_names():
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            continue
        if address.version == 4 and not is_loopback(name) and not address.is_link_local:
            addresses.append(address)
    return str(min(addresses)) if addresses else "127.0.0.1"


def join_options(command: Callable) -> Callable:
    """The rendezvous options, added to ``tflaunch run``."""
    # Light modules only: the options are made whenever tflaunch starts.
    from ..options import DEFAULT_REJOIN_WAIT
    from ..sources.platforms import CHOICES, DEFAULT_PORT, DEFAULT_TIMEOUT
    from ..taskenv import RDZV_TOKEN as TOKEN_VARIABLE

    options = [
        click.option("--nnodes", metavar="N|MIN:MAX",
                     help="Every node runs this same command: N nodes in all (no ssh between them); MIN:MAX: "
                          "MAX, or at least MIN that came within --rdzv-timeout, and never fewer."),
        click.option("--node-rank", metavar="R", type=click.IntRange(min=0),
                     help="With --nnodes: this node's rank (default 0); rank 0 owns the run and listens at "
                          "--rdzv-endpoint."),
        click.option("--rdzv-endpoint", metavar="HOST:PORT",
                     help="With --nnodes: where node rank 0 listens (an address of rank 0's host)."),
        click.option("--rdzv-token-file", metavar="FILE",
                     help=f"With --nnodes: the run's token, which every node has (or set {TOKEN_VARIABLE})."),
        click.option("--rdzv-timeout", metavar="SECONDS", type=click.FloatRange(min=0, min_open=True),
                     default=DEFAULT_TIMEOUT, show_default=True,
                     help="With --nnodes: how long the nodes wait for each other."),
        click.option("--rdzv-rejoin-wait", metavar="SECONDS", type=click.FloatRange(min=0),
                     default=DEFAULT_REJOIN_WAIT, show_default=True,
                     help="With --nnodes, on rank 0: before a restart, how long a lost node may take to join "
                          "again (its tflaunch restarted) before the attempt runs without it."),
        click.option("--nodes-from", metavar="PLATFORM", type=click.Choice(CHOICES),
                     help="Fill --nnodes, --node-rank and --rdzv-endpoint from the platform's variables "
                          f"(rank 0's address, port {DEFAULT_PORT} unless --rdzv-endpoint gives one); "
                          "auto: the platform whose variables are set."),
        click.option("--tasks-per-node", metavar="K", type=click.IntRange(min=1), default=1, show_default=True,
                     help="With --nnodes: tasks on each node (roles: --chief, --ps, --evaluator)."),
        click.option("--ray", metavar="ADDRESS",
                     help="Run on a Ray cluster (HOST:PORT, ray://HOST:PORT, or auto: RAY_ADDRESS, else the "
                          "cluster on this machine): --nnodes Ray nodes, one placement group bundle each "
                          "(needs pip install 'tflaunch[ray]')."),
        click.option("--gpus-per-task", metavar="G", type=click.IntRange(min=0), default=0, show_default=True,
                     help="With --ray: GPUs each task gets from its bundle (CUDA_VISIBLE_DEVICES)."),
    ]
    return functools.reduce(lambda wrapped, option: option(wrapped), reversed(options), command)


def _checked(choice: ClusterChoice, options: dict[str, Any]) -> tuple[str, int, str]:
    from ..sources.joined import parse_endpoint, read_token

    if any(value is not None for value in (choice.cluster, choice.local, choice.hosts, choice.hostfile)) \
            or options.get("slurm"):
        raise click.UsageError("--nnodes takes its hosts from the nodes that join; drop the cluster file, --local, "
                               "-H, --hostfile and --slurm")
    if not options["rdzv_endpoint"]:
        raise click.UsageError("--nnodes needs --rdzv-endpoint HOST:PORT (where node rank 0 listens)")
    spares = spare_nodes(choice.spares)
    if options["node_rank"] >= options["nnodes"] + spares and not (options["node_rank"] and choice.spares is None):
        raise click.UsageError(f"--node-rank: expected 0 to {options['nnodes'] + spares - 1} with --nnodes "
                               f"{options['nnodes']}{f' --spares {spares}' if spares else ''}, "
                               f"got {options['node_rank']}")
    host, port = parse_endpoint(options["rdzv_endpoint"])
    return host, port, read_token(options["rdzv_token_file"], host)


def spare_nodes(text: str | None) -> int:
    """``--spares K`` with --nnodes: K spare nodes, ranks N to N+K-1."""
    if text is None:
        return 0
    if not (text.strip().isascii() and text.strip().isdigit()) or int(text) < 1:
        raise click.UsageError(f"--spares: with --nnodes, expected a number of spare nodes K >= 1 (ranks N to "
                               f"N+K-1), got {text!r}")
    return int(text)


def joined_source(choice: ClusterChoice, options: dict[str, Any]):
    """Node rank 0's source: the rendezvous at the endpoint, then the nodes that joined it."""
    from ..sources.joined import JoinedNodes, JoinedSource

    host, port, token = _checked(choice, options)
    return JoinedNodes(JoinedSource(nnodes=options["nnodes"], host=host, port=port, token=token,
                                    timeout=options["rdzv_timeout"], tasks_per_node=options["tasks_per_node"],
                                    spares=spare_nodes(choice.spares), minimum=options["nnodes_min"],
                                    rejoin_wait=options["rdzv_rejoin_wait"],
                                    chief=choice.chief, ps=choice.ps, evaluator=choice.evaluator, gpus=choice.gpus))


def join_run(choice: ClusterChoice, options: dict[str, Any], given: RunOptions) -> int:
    """A node of rank R > 0: this process becomes the node's agent, which joins the run at the
    endpoint, serves its tasks here and exits with the run's exit code (saying so in one line)."""
    from ..transports.nodeagent import become_agent

    host, port, token = _checked(choice, options)
    rank = options["node_rank"]
    click.echo(f"tflaunch: node rank {rank} of {options['nnodes']}: joining the run at {host}:{port}", err=True)
    try:
        become_agent(host, port, rank, token, options["rdzv_timeout"], given.grace, options["nnodes"])
    except OSError as exc:
        click.echo(f"tflaunch: node rank {rank}: cannot start the node's agent: {exc.strerror or exc}", err=True)
    return 1


def ray_source(choice: ClusterChoice, options: dict[str, Any], given: RunOptions):
    """The Ray nodes of one placement group (--ray ADDRESS --nnodes N)."""
    from ..errors import OptionsError
    from ..sources.ray import ray_nodes

    if options.get("slurm"):
        raise OptionsError("--ray takes its hosts from the Ray cluster; drop --slurm")
    if options["node_rank"] is not None or options["rdzv_endpoint"] or options.get("nodes_from"):
        raise OptionsError("--ray places every node itself; drop --node-rank, --rdzv-endpoint and --nodes-from")
    return ray_nodes(choice, options["ray"], options["nnodes"], tasks_per_node=options["tasks_per_node"],
                     gpus_per_task=options["gpus_per_task"], spares=spare_nodes(choice.spares),
                     start_timeout=given.start_timeout)
