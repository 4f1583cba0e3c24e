"""``--nodes-from PLATFORM``: the node count, this node's rank and rank 0's address, read from the
variables a platform that starts one process per node sets (pure: the environment is passed in).

=============  ==========================================================================
platform       variables read
=============  ==========================================================================
skypilot       ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_IPS`` (one
               address a line, rank 0's first)
dstack         ``DSTACK_NODE_RANK``, ``DSTACK_NODES_NUM``, ``DSTACK_MASTER_NODE_IP``
kubernetes     ``JOB_COMPLETION_INDEX`` (an Indexed Job or a JobSet's pods); the node count
               is ``--nnodes``; rank 0 is this pod's stable name with index 0
               (``NAME-0.SUBDOMAIN``, from this pod's own host name)
aws-batch      ``AWS_BATCH_JOB_NODE_INDEX``, ``AWS_BATCH_JOB_NUM_NODES``,
               ``AWS_BATCH_JOB_MAIN_NODE_INDEX`` (which node is rank 0) and
               ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`` (set on the others only)
sagemaker      ``SM_HOSTS`` (a JSON list of host names, rank 0's first) and ``SM_CURRENT_HOST``
slurm          ``SLURM_NODEID``, ``SLURM_NNODES``, ``SLURM_LAUNCH_NODE_IPADDR`` (one
               ``srun --ntasks-per-node=1 tflaunch ...`` per node; rank 0 is the batch node)
=============  ==========================================================================

``auto`` takes the one platform whose variables are set (and says which). The port is
:data:`DEFAULT_PORT` unless ``--rdzv-endpoint`` gives one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError, OptionsError

DEFAULT_PORT = 29455  # rank 0 listens here unless --rdzv-endpoint names a port
DEFAULT_TIMEOUT = 600.0  # seconds rank 0 waits for every node, and a node for rank 0 (--rdzv-timeout)
AUTO = "auto"


@dataclass(frozen=True)
class NodesFound:
    """What a platform says: the node count, this node's rank, and rank 0's host (None: this
    machine is rank 0 and the platform names no address of it)."""

    platform: str
    nnodes: int
    rank: int
    host: str | None


def _number(environ: Mapping[str, str], variable: str, low: int = 0) -> int:
    text = environ.get(variable, "")
    if not (text.strip().isascii() and text.strip().isdigit()) or int(text) < low:
        raise ConfigError("environment", variable, f"expected a whole number >= {low}, got {text!r}")
    return int(text)


def _lines(environ: Mapping[str, str], variable: str) -> list[str]:
    found = [line.strip() for line in environ.get(variable, "").splitlines() if line.strip()]
    if not found:
        raise ConfigError("environment", variable, f"expected one address a line, got {environ.get(variable, '')!r}")
    return found


def _address(environ: Mapping[str, str], variable: str, wanted: str) -> str:
    """The address in ``variable``; a ConfigError saying it ``wanted`` when empty."""
    address = environ.get(variable, "").strip()
    if not address:
        raise ConfigError("environment", variable, f"expected {wanted}, got ''")
    return address


def _in_range(rank: int, nnodes: int, variable: str) -> int:
    if rank >= nnodes:
        raise ConfigError("environment", variable, f"expected a rank below the node count {nnodes}, got {rank}")
    return rank


def skypilot(environ: Mapping[str, str], nnodes: int | None, hostname: str) -> NodesFound:
    count = _number(environ, "SKYPILOT_NUM_NODES", 1)
    addresses = _lines(environ, "SKYPILOT_NODE_IPS")
    rank = _in_range(_number(environ, "SKYPILOT_NODE_RANK"), count, "SKYPILOT_NODE_RANK")
    return NodesFound("skypilot", count, rank, addresses[0])


def dstack(environ: Mapping[str, str], nnodes: int | None, hostname: str) -> NodesFound:
    count = _number(environ, "DSTACK_NODES_NUM", 1)
    rank = _in_range(_number(environ, "DSTACK_NODE_RANK"), count, "DSTACK_NODE_RANK")
    return NodesFound("dstack", count, rank, _address(environ, "DSTACK_MASTER_NODE_IP", "rank 0's address"))


def kubernetes(environ: Mapping[str, str], nnodes: int | None, hostname: str) -> NodesFound:
    index = _number(environ, "JOB_COMPLETION_INDEX")
    if nnodes is None:
        raise OptionsError("--nodes-from kubernetes: give --nnodes N (the Job's completions; no variable says it)")
    rank = _in_range(index, nnodes, "JOB_COMPLETION_INDEX")
    name, dot, domain = hostname.partition(".")
    stem, dash, own = name.rpartition("-")
    if not dash or own != str(index):
        raise ConfigError("environment", "hostname", f"expected a pod host name ending in -{index} (an Indexed "
                          f"Job's pod with a subdomain), got {hostname!r}")
    return NodesFound("kubernetes", nnodes, rank, f"{stem}-0{dot}{domain}")


def aws_batch(environ: Mapping[str, str], nnodes: int | None, hostname: str) -> NodesFound:
    count = _number(environ, "AWS_BATCH_JOB_NUM_NODES", 1)
    index = _in_range(_number(environ, "AWS_BATCH_JOB_NODE_INDEX"), count, "AWS_BATCH_JOB_NODE_INDEX")
    main = _in_range(_number(environ, "AWS_BATCH_JOB_MAIN_NODE_INDEX"), count, "AWS_BATCH_JOB_MAIN_NODE_INDEX")
    rank = (index - main) % count  # the main node is rank 0, the others follow in index order
    if rank == 0:
        return NodesFound("aws-batch", count, 0, None)  # the main node has no variable naming its address
    address = _address(environ, "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS",
                       "the main node's address on a child node")
    return NodesFound("aws-batch", count, rank, address)


def sagemaker(environ: Mapping[str, str], nnodes: int | None, hostname: str) -> NodesFound:
    try:
        hosts = json.loads(environ.get("SM_HOSTS", ""))
    except ValueError:
        hosts = None
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise ConfigError("environment", "SM_HOSTS", f"expected a JSON list of host names, got "
                          f"{environ.get('SM_HOSTS', '')!r}")
    current = environ.get("SM_CURRENT_HOST", "")
    if current not in hosts:
        raise ConfigError("environment", "SM_CURRENT_HOST", f"expected one of SM_HOSTS {hosts}, got {current!r}")
    return NodesFound("sagemaker", len(hosts), hosts.index(current), hosts[0])


def slurm(environ: Mapping[str, str], nnodes: int | None, hostname: str) -> NodesFound:
    count = _number(environ, "SLURM_NNODES", 1)
    rank = _in_range(_number(environ, "SLURM_NODEID"), count, "SLURM_NODEID")
    return NodesFound("slurm", count, rank, _address(environ, "SLURM_LAUNCH_NODE_IPADDR", "the batch node's address"))


# platform -> (the variable whose presence says it is this platform, its reader)
PLATFORMS: dict[str, tuple[str, Callable[[Mapping[str, str], int | None, str], NodesFound]]] = {
    "skypilot": ("SKYPILOT_NODE_RANK", skypilot),
    "dstack": ("DSTACK_NODE_RANK", dstack),
    "kubernetes": ("JOB_COMPLETION_INDEX", kubernetes),
    "aws-batch": ("AWS_BATCH_JOB_NODE_INDEX", aws_batch),
    "sagemaker": ("SM_CURRENT_HOST", sagemaker),
    "slurm": ("SLURM_NODEID", slurm),
}
CHOICES = (*PLATFORMS, AUTO)


def nodes_from(platform: str, environ: Mapping[str, str], hostname: str, nnodes: int | None = None) -> NodesFound:
    """The nodes ``platform`` (or, for ``auto``, the one whose variables are set) says this run has."""
    if platform == AUTO:
        present = [name for name, (variable, _) in PLATFORMS.items() if environ.get(variable, "") != ""]
        if len(present) != 1:
            said = f"the variables of {', '.join(present)} are all set" if present else "none of their variables is set"
            raise OptionsError(f"--nodes-from auto: expected the variables of one of {', '.join(PLATFORMS)}; {said} "
                               "(name the platform instead)")
        platform = present[0]
    if platform not in PLATFORMS:
        raise OptionsError(f"--nodes-from: expected one of {', '.join(CHOICES)}, got {platform!r}")
    return PLATFORMS[platform][1](environ, nnodes, hostname)
