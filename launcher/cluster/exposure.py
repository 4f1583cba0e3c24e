"""Whether a cluster's tasks are reachable from the internet, and the warning that says so.

TensorFlow's gRPC server (MultiWorkerMirroredStrategy, ``tf.distribute.Server``) listens on every
interface of its host, has no authentication, and runs the graphs that reach it. A cluster whose
hosts have globally routable addresses is therefore open to anyone who can reach those addresses.
The names are resolved here, on the launcher, as a user would see them; a name that does not
resolve in time is left out (tflaunch cannot tell, and ssh will say so soon enough).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable, Iterable, Mapping

from .spec import ClusterSpec, is_loopback

RESOLVE_TIMEOUT = 2.0  # all names together; a slow resolver must not hold a launch up
RESOLVE_TIMEOUT_VARIABLE = "TFLAUNCH_RESOLVE_TIMEOUT"  # seconds, for a resolver known to be slower
RESOLVERS = 16  # names resolved at once, each on a thread of its own
LOOPBACK_NAMES = ("localhost", "ip6-localhost", "::1")

Resolver = Callable[[str], list[str]]


def resolve_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """How long the lookups of one check may take, all names together: ``TFLAUNCH_RESOLVE_TIMEOUT``
    in tflaunch's environment (seconds), else RESOLVE_TIMEOUT; a value that is not a number is ignored."""
    try:
        seconds = float(environ.get(RESOLVE_TIMEOUT_VARIABLE, ""))
    except ValueError:
        return RESOLVE_TIMEOUT
    return seconds if 0 <= seconds < float("inf") else RESOLVE_TIMEOUT


def resolve(name: str) -> list[str]:
    """Every address ``name`` resolves to ([] when it does not)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(info[4][0] for info in infos))


def cluster_names(spec: ClusterSpec) -> list[str]:
    """The names tasks are reached by: each task's host and the address in TF_CONFIG, in order."""
    return unique_names(name for task in spec.tasks for name in (task.host, task.address))


def unique_names(names: Iterable[str | None]) -> list[str]:
    """Host names without IPv6 brackets, each once, in order."""
    return list(dict.fromkeys(name.strip("[]") for name in names if name))


def public_addresses(names: Iterable[str], resolver: Resolver = resolve,
                     timeout: float | None = None) -> dict[str, list[str]]:
    """The names with at least one globally routable address, with those addresses, looked up for
    ``timeout`` seconds at most (default: :func:`resolve_timeout`)."""
    import ipaddress

    names = [n for n in names if n not in LOOPBACK_NAMES and not is_loopback(n)]
    found: dict[str, list[str]] = {name: [name] for name in names if _is_address(name)}  # nothing to resolve
    pending = iter([name for name in names if name not in found])
    lock = threading.Lock()

    def resolve_pending() -> None:
        while True:
            with lock:
                name = next(pending, None)
            if name is None:
                return
            found[name] = resolver(name)

    # A few daemon threads, not one per name (a thousand hosts, a thousand threads) nor an
    # executor: a resolver stuck on an unreachable DNS server must not hold up tflaunch's exit.
    threads = [threading.Thread(target=resolve_pending, daemon=True)
               for _ in range(min(RESOLVERS, len(names) - len(found)))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + (resolve_timeout() if timeout is None else timeout)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    public: dict[str, list[str]] = {}
    for name in names:
        addresses = []
        for address in found.get(name, []):
            try:
                if ipaddress.ip_address(address.split("%", 1)[0]).is_global:
                    addresses.append(address)
            except ValueError:
                continue
        if addresses:
            public[name] = addresses
    return public


def _is_address(name: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


def exposure_warning(spec: ClusterSpec, resolver: Resolver = resolve) -> str | None:
    """One line naming the cluster's hosts that have public addresses; None when there are none."""
    text = exposure_text(cluster_names(spec), resolver)
    return f"warning: {text}" if text else None


def exposure_text(names: Iterable[str], resolver: Resolver = resolve) -> str | None:
    """What is exposed among ``names`` and why it matters, or None when nothing is."""
    public = public_addresses(names, resolver)
    if not public:
        return None
    hosts = ", ".join(name if addresses == [name] else f"{name} ({', '.join(addresses)})"
                      for name, addresses in public.items())
    verb = "has a public address" if len(public) == 1 else "have public addresses"
    return (f"{hosts} {verb}: TensorFlow's gRPC servers listen on every interface without "
            "authentication and run whatever reaches them; run this cluster on a private network or "
            "behind a firewall that admits only its own hosts")
