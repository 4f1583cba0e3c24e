"""What a sealed or isolated run's tasks find inside its network namespace, and what is said of it.

The cluster may name this machine by an address of one of its interfaces or by its host name
(``-H 192.0.2.2:2``, a cluster file listing ``myhost``): TF_CONFIG keeps those names, as the user
gave them, and the namespace carries the addresses they resolve to on its loopback, so that a
task that dials a peer there reaches the run's own task and never leaves the run (outside the
namespace another user may listen on that address and port). :func:`own_names` and
:func:`carried` say which (at a run's start a name that does not resolve within
:data:`LOOKUP_WAIT` is left out: a silent name server must not hold the start); :func:`dial_line`
is what ``--dry-run`` and ``tflaunch check`` show.

A sealed run's outside network may be missing (neither slirp4netns nor pasta, or names that do not
resolve inside): most runs never need it, so a run does not say so at its start; ``--dry-run``,
``tflaunch check`` and the diagnosis of a task that failed of a name or network error do
(:func:`missing_outside`).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import Callable

from ...cluster.spec import ClusterSpec, Network, is_loopback
from ...options import given, name


# How long a run's start waits for the names its cluster gives this machine to resolve: /etc/hosts
# and a working name server answer in milliseconds; a name server that never answers must not hold
# the start (a name not resolved by then is not carried, and the run's trace says so).
LOOKUP_WAIT = 0.2


def own_names(spec: ClusterSpec, resolver: Callable[[str], list[str]] | None = None,
              wait: float | None = None) -> dict[str, tuple[str, ...]]:
    """The names a sealed or isolated cluster gives this machine (every task is here), each with the
    addresses it resolves to here: what a task that dials a peer by that name reaches. Loopback
    names are left out: every namespace has a loopback of its own. With ``wait``, the names are
    looked up side by side and one that has not resolved within ``wait`` seconds is left out."""
    import ipaddress
    import threading

    from ...cluster.exposure import resolve

    found: dict[str, tuple[str, ...]] = {}
    names = []
    for host in cluster_hosts(spec):
        try:
            found[host] = (str(ipaddress.ip_address(host)),)
        except ValueError:
            names.append(host)
    if wait is None:
        found.update((host, tuple((resolver or resolve)(host))) for host in names)
        return found
    answers: dict[str, tuple[str, ...]] = {}

    def look_up(host: str) -> None:
        answers[host] = tuple((resolver or resolve)(host))

    # Daemon threads: a lookup stuck on a silent name server must not hold tflaunch's exit either.
    threads = [threading.Thread(target=look_up, args=(host,), daemon=True) for host in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + wait
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    found.update((host, answers[host]) for host in names if host in answers)
    return found


def cluster_hosts(spec: ClusterSpec) -> list[str]:
    """The names and addresses a cluster's tasks are reached by, but loopback ones, each once."""
    from ...cluster.exposure import unique_names

    return [host for host in unique_names(each for task in spec.slots for each in (task.host, task.address))
            if host != "localhost" and not is_loopback(host)]


def carried(names: dict[str, tuple[str, ...]]) -> list[str]:
    """The addresses the run's namespace carries on its loopback, so that a peer dialled there is the
    run's own: every address of ``names`` but loopback (already there) and link-local ones (bound
    to an interface of this machine's, which the namespace does not have)."""
    import ipaddress

    kept = []
    for text in dict.fromkeys(a for addresses in names.values() for a in addresses):
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if not (address.is_loopback or address.is_link_local):
            kept.append(str(address))
    return kept


@dataclass(frozen=True)
class Offline:
    """Why a run's namespace has no way out, and what would give it one (each a clause)."""

    why: str
    fix: str


def missing_outside(mode: Network | None, lacking: str | None, names: str | None = None) -> Offline | None:
    """What the tasks of a run with network ``mode`` lack: ``lacking`` is why the outside network
    did not come up (None: it did), ``names`` why names do not resolve inside."""
    no_seal = f"or run with {given('no_seal', True)}"
    if mode is Network.ISOLATED:
        return Offline(f"the run is isolated ({name('isolate_network')}): it reaches nothing outside",
                       f"run without {name('isolate_network')} (or isolate_network: false in the cluster file)")
    if mode is not Network.SEALED:
        return None
    if lacking:
        from .outside import INSTALL, missing_tools

        return Offline(f"the sealed run has no outside network: {lacking}",
                       f"{INSTALL}, {no_seal}" if missing_tools() else f"mend that tool, {no_seal}")
    if names:
        return Offline(f"names do not resolve inside the sealed run (addresses do): {names}",
                       f"name a name server off loopback in /etc/resolv.conf, {no_seal}")
    return None


def dial_line(spec: ClusterSpec, names: dict[str, tuple[str, ...]], kept: list[str]) -> str:
    """Where the tasks' dials to each other lead inside the namespace, by the hosts of their TF_CONFIG
    addresses (``names``: :func:`own_names`; ``kept``: :func:`carried`)."""
    from ...cluster.exposure import unique_names

    kept_set, parts, leaving = set(kept), [], []
    for host in unique_names(task.address or task.host for task in spec.slots):
        addresses = names.get(host)
        if host == "localhost" or is_loopback(host):
            parts.append(f"{host} (the namespace's own loopback)")
        elif addresses is None:
            parts.append(f"{host} (not resolved within {LOOKUP_WAIT:g} s at the start: not carried)")
        elif not addresses:
            parts.append(f"{host} (it does not resolve here: no task can dial it)")
        else:
            shown = "" if addresses == (host,) else f"{', '.join(addresses)}, "
            if kept_set & set(addresses):
                parts.append(f"{host} ({shown}carried on the namespace's loopback)")
            elif all(_loopback_or_link_local(a) for a in addresses):
                parts.append(f"{host} ({shown}the namespace's own loopback)")
            else:
                parts.append(f"{host} ({shown}not this machine's)")
                leaving.append(host)
    ends = f"a dial to {', '.join(leaving)} leaves the run" if leaving else "no task's connection to a peer leaves the run"
    return f"inside the run's namespace the tasks dial each other at {'; '.join(parts)}: {ends}"


def _loopback_or_link_local(text: str) -> bool:
    import ipaddress

    address = ipaddress.ip_address(text.split("%", 1)[0])
    return address.is_loopback or address.is_link_local


def outside_line(mode: Network | None, offline: Offline | None, tool: str | None) -> str | None:
    """What the tasks have of the outside network, in one line; None for an open run."""
    if offline is not None:
        return f"{offline.why}; {offline.fix}"
    if mode is Network.SEALED and tool:
        return f"outside network through {tool} (downloads, name servers; nothing comes in)"
    return None


def plan_notes(spec: ClusterSpec) -> list[str]:
    """What ``--dry-run`` says of a sealed or isolated run's network, nothing made: where the tasks'
    dials lead, and what they have of the outside network (by the tools installed here)."""
    if spec.network not in (Network.SEALED, Network.ISOLATED):
        return []
    from .outside import TOOLS, missing_tools, name_problem

    lacking = missing_tools()
    offline = missing_outside(spec.network, lacking, None if lacking else name_problem())
    tool = next((tool for tool in TOOLS if shutil.which(tool)), None)
    outside = outside_line(spec.network, offline, tool)
    return [f"network: {dial_line(spec, names := own_names(spec), carried(names))}", *([f"network: {outside}"] if outside else [])]
