"""What a sealed or isolated run's tasks find inside its network namespace, and what is said of it.

The cluster may name this machine by an address of one of its interfaces or by its host name
(``-H 192.0.2.2:2``, a cluster file listing ``myhost``): TF_CONFIG keeps those names, as the user
gave them, and the namespace carries the addresses they resolve to on its loopback, so that a
task that dials a peer there reaches the run's own task and never leaves the run (outside the
namespace another user may listen on that address and port). :func:`own_names` and
:func:`carried` say which; :func:`dial_line` is what ``--dry-run`` and ``tflaunch check`` show.

A sealed run's outside network may be missing (neither slirp4netns nor pasta, or names that do not
resolve inside): most runs never need it, so a run does not say so at its start; ``--dry-run``,
``tflaunch check`` and the diagnosis of a task that failed of a name or network error do
(:func:`missing_outside`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Callable

from ...cluster.exposure import resolve, unique_names
from ...cluster.spec import ClusterSpec, Network, is_loopback
from ...options import given, name


def own_names(spec: ClusterSpec, resolver: Callable[[str], list[str]] = resolve) -> dict[str, tuple[str, ...]]:
    """The names a sealed or isolated cluster gives this machine (every task is here), each with the
    addresses it resolves to here: what a task that dials a peer by that name reaches. Loopback
    names are left out: every namespace has a loopback of its own."""
    import ipaddress

    found: dict[str, tuple[str, ...]] = {}
    for host in unique_names(each for task in spec.slots for each in (task.host, task.address)):
        if host == "localhost" or is_loopback(host):
            continue
        try:
            found[host] = (str(ipaddress.ip_address(host)),)
        except ValueError:
            found[host] = tuple(resolver(host))
    return found


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


def dial_line(spec: ClusterSpec, names: dict[str, tuple[str, ...]]) -> str:
    """Where the tasks' dials to each other lead inside the namespace, by the hosts of their TF_CONFIG
    addresses (``names``: :func:`own_names`)."""
    kept = set(carried(names))
    parts = []
    for host in unique_names(task.address or task.host for task in spec.slots):
        addresses = names.get(host)
        if addresses is None:  # loopback
            parts.append(f"{host} (the namespace's own loopback)")
        elif not addresses:
            parts.append(f"{host} (it does not resolve here: no task can dial it)")
        else:
            where = "carried on the namespace's loopback" if kept & set(addresses) else "the namespace's own loopback"
            shown = "" if addresses == (host,) else f"{', '.join(addresses)}, "
            parts.append(f"{host} ({shown}{where})")
    return f"inside the run's namespace the tasks dial each other at {'; '.join(parts)}: no task's connection " \
           "to a peer leaves the run"


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
    return [f"network: {dial_line(spec, own_names(spec))}", *([f"network: {outside}"] if outside else [])]
