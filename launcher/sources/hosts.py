"""``-H node1:4,node2:4`` and ``--hostfile FILE`` as a cluster source: task slots on named hosts.

The two forms people bring from horovodrun, DeepSpeed and MPI:

- ``-H/--hosts HOST[:SLOTS],...`` (a host without ``:SLOTS`` has one slot);
- a hostfile, one host per line as ``HOST slots=N`` (``HOST`` alone is one slot; MPI's
  ``max_slots=M`` is accepted and ignored, since tflaunch never puts more tasks on a host than its
  slots). ``#`` starts a comment; blank lines are skipped. A bad line is one error naming the file,
  the line number and what was expected.

``localhost``, a loopback address or any name of this machine means this machine; every other
host is reached over ssh. A host may be named once (two names of this machine count as one).

Every slot becomes one task with ``port: auto``. Roles are carved out of the slots by the same rule
as in a Slurm allocation (:func:`launcher.slurm.allocation.carve_roles`): slots are numbered host by
host in the order given, the chief (``--chief``, implied by ``--ps``) takes the first, the ps tasks
the next ones, the evaluator (``--evaluator``) the last, workers the rest; at least one worker must
be left. ``--gpus LIST`` names each host's GPUs: they are dealt round-robin to that host's chief and
workers (ps and evaluator stay on the CPU), shared when a host has more such tasks than GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..cluster.checks import check_cluster
from ..cluster.spec import AUTO, ClusterSpec, TaskSpec, is_local
from ..errors import ConfigError
from ..slurm.allocation import Allocation, carve_roles, gpus_for

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")  # a host name or an IPv4 address
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+")
_HOSTFILE_WORD = re.compile(r"^(?P<key>[a-z_]+)=(?P<value>.*)$")
HOSTFILE_FORM = "'HOST slots=N' (N a whole number >= 1), 'HOST', a '#' comment or a blank line"


@dataclass(frozen=True)
class HostSlots:
    """One host and how many tasks it runs; ``where`` names its origin for messages."""

    host: str
    slots: int
    where: str


def parse_hosts_option(value: str, option: str = "-H") -> tuple[HostSlots, ...]:
    """``node1:4,node2:4`` as (host, slots) pairs, in order."""
    hosts = []
    for item in value.split(","):
        item = item.strip()
        host, slots = _split_item(item)
        if not host or slots is None:
            raise ConfigError(option, item or repr(value),  # an empty item: show where, in the whole value
                              "expected HOST or HOST:SLOTS with SLOTS a whole number >= 1, such as node1:4")
        hosts.append(HostSlots(host, slots, f"{option} {item}"))
    return tuple(hosts)


def _split_item(item: str) -> tuple[str, int | None]:
    if item.startswith("["):  # [::1]:2
        host, _, rest = item[1:].partition("]")
        if (rest and not rest.startswith(":")) or host.count(":") < 2 or not _valid_host(host):
            return "", None
        return host, _slots(rest[1:]) if rest else 1
    if item.count(":") > 1:  # a bare IPv6 address has no slot count
        return (item, 1) if _valid_host(item) else ("", None)
    host, sep, slots = item.partition(":")
    if not _NAME.fullmatch(host):
        return "", None
    return host, _slots(slots) if sep else 1


def _valid_host(text: str) -> bool:
    """A host name, an IPv4 address or an IPv6 address (which has at least two colons)."""
    return bool(_NAME.fullmatch(text) or (text.count(":") >= 2 and _IPV6.fullmatch(text)))


def _slots(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) >= 1 else None


def parse_hostfile(path: str) -> tuple[HostSlots, ...]:
    """The hosts of an MPI/DeepSpeed hostfile; ConfigError names the file and line of a bad line."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read the hostfile ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(path, "", "not a text file; expected one 'HOST slots=N' per line") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        bad = ConfigError(path, f"line {number}", f"{line.strip()!r}: expected {HOSTFILE_FORM}")
        host, slots = words[0], 1
        bracketed = host.startswith("[") and host.endswith("]")  # only an IPv6 address: [fd00::7]
        host = host[1:-1] if bracketed else host
        if not _valid_host(host) or (bracketed and host.count(":") < 2):
            raise bad
        seen = set()
        for word in words[1:]:
            match = _HOSTFILE_WORD.match(word)
            if not match or match["key"] not in ("slots", "max_slots") or match["key"] in seen:
                raise bad
            seen.add(match["key"])
            if _slots(match["value"]) is None:
                raise bad
            if match["key"] == "slots":
                slots = int(match["value"])
        hosts.append(HostSlots(host, slots, f"{path}: line {number}"))
    if not hosts:
        raise ConfigError(path, "", f"no hosts; expected one {HOSTFILE_FORM.split(',')[0]} per line")
    return tuple(hosts)


@dataclass(frozen=True)
class HostsSource:
    """Task slots on named hosts, from ``-H`` (``hosts``) or a hostfile (``hostfile``); exactly one is set."""

    hosts: str | None = None
    hostfile: str | None = None
    chief: bool = False
    ps: int = 0
    evaluator: bool = False
    gpus: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        words = [f"-H {self.hosts}" if self.hosts is not None else f"--hostfile {self.hostfile}"]
        if self.chief or self.ps:
            words.append("--chief")
        if self.ps:
            words.append(f"--ps {self.ps}")
        if self.evaluator:
            words.append("--evaluator")
        if self.gpus:
            words.append("--gpus " + ",".join(map(str, self.gpus)))
        return " ".join(words)

    def host_slots(self) -> tuple[HostSlots, ...]:
        if self.hosts is not None:
            return parse_hosts_option(self.hosts)
        return parse_hostfile(str(self.hostfile))

    def spec(self, local_hosts: frozenset[str]) -> ClusterSpec:
        hosts = self.host_slots()
        _check_distinct(hosts, local_hosts)
        tasks = place(hosts, chief=self.chief, ps=self.ps, evaluator=self.evaluator, gpus=self.gpus, source=self.label)
        share = bool(self.gpus) and any(sum(1 for t in tasks if t.host == h.host and t.gpus) > len(self.gpus)
                                        for h in hosts)
        spec = ClusterSpec(source=self.label, tasks=tasks, share_gpus=share)
        check_cluster(spec, local_hosts)
        return spec


def place(hosts: tuple[HostSlots, ...], *, chief: bool = False, ps: int = 0, evaluator: bool = False,
          gpus: tuple[int, ...] = (), source: str = "-H") -> tuple[TaskSpec, ...]:
    """One task per slot, roles and GPUs by the rule in the module docstring, every port ``auto`` (pure)."""
    if ps < 0:
        raise ConfigError(source, "--ps", f"expected 0 or more ps tasks, got {ps}")
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ConfigError(source, "--gpus", f"expected distinct GPU indices >= 0, got {','.join(map(str, gpus))}")
    chief = chief or ps > 0  # ParameterServerStrategy needs a coordinator: the chief
    _check_room(hosts, chief, ps, evaluator, source)
    allocation = Allocation(job_id="", nodes=tuple(h.host for h in hosts), tasks_per_node=tuple(h.slots for h in hosts),
                            gpus_per_node=len(gpus) or None)
    roles = carve_roles(allocation, chief=chief, ps=ps, evaluator=evaluator, source=source)
    dealt = gpus_for(roles, allocation)  # positions in each host's list, round-robin per host
    return tuple(TaskSpec(r.role, r.index, r.slot.node, AUTO, gpus=tuple(gpus[i] for i in dealt[r.name]),
                          key=f"{r.role}[{r.index}]")
                 for r in roles)


def _check_distinct(hosts: tuple[HostSlots, ...], local_hosts: frozenset[str]) -> None:
    seen: dict[str, HostSlots] = {}
    for entry in hosts:
        key = "this machine" if is_local(entry.host, local_hosts) else entry.host
        if key in seen:
            first = seen[key]
            same = f"{first.host!r} and {entry.host!r} both name this machine" if key == "this machine" \
                else f"{entry.host!r} is also named in {first.where}"
            raise ConfigError(entry.where, "", f"{same}; expected each host once, with all its slots")
        seen[key] = entry


def _check_room(hosts: tuple[HostSlots, ...], chief: bool, ps: int, evaluator: bool, source: str) -> None:
    """At least one worker must be left once the chief, ps and evaluator have their slots."""
    fixed = int(chief) + ps + int(evaluator)
    total = sum(h.slots for h in hosts)
    if total - fixed >= 1:
        return
    asked = (["a chief"] if chief else []) + ([f"{ps} ps task{'s' if ps != 1 else ''}"] if ps else []) \
        + (["an evaluator"] if evaluator else [])
    key = "--ps" if ps else ("--evaluator" if evaluator else "--chief")
    raise ConfigError(source, key, f"{', '.join(asked)} and at least one worker need {fixed + 1} slots; "
                                   f"the hosts have {total} (add slots or hosts)")
