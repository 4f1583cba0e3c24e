"""``-H node1:4,node2:4`` and ``--hostfile FILE`` as a cluster source: task slots on named hosts.

The two forms people bring from horovodrun, DeepSpeed and MPI:

- ``-H/--hosts HOST[:SLOTS],...`` (a host without ``:SLOTS`` has one slot);
- a hostfile, one host per line as ``HOST slots=N`` (OpenMPI, DeepSpeed) or ``HOST:N`` (MPICH,
  Intel MPI); ``HOST`` alone is one slot; OpenMPI's ``max_slots=M`` is accepted and ignored, since
  tflaunch never puts more tasks on a host than its slots. ``#`` starts a comment; blank lines are
  skipped; a UTF-8 byte-order mark (Notepad writes one) is dropped. A bad line is one error naming
  the file, the line number and what was expected.

A host has at most :data:`MAX_SLOTS` slots: every slot is a TensorFlow process of its own, and
each task's TF_CONFIG lists every task, so the plan grows with the square of the task count; a
count beyond what any machine can run (``slots=100000``, a typo) is refused at once instead.

``localhost``, a loopback address or any name of this machine means this machine; every other
host is reached over ssh. A host may be named once (two names of this machine count as one).

Every slot becomes one task with ``port: auto``. Roles are carved out of the slots by the same rule
as in a Slurm allocation (:mod:`launcher.cluster.roles`): slots are numbered host by
host in the order given, the chief (``--chief``, implied by ``--ps``) takes the first, the ps tasks
the next ones, the evaluator (``--evaluator``) the last, workers the rest; at least one worker must
be left. ``--gpus LIST`` names each host's GPUs: they are dealt round-robin to that host's chief and
workers (ps and evaluator stay on the CPU), shared when a host has more such tasks than GPUs.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from pathlib import Path

from ..cluster.checks import check_cluster
from ..cluster.placement import SPARE_ROLE
from ..cluster.roles import carve_roles, deal_gpus, number_slots
from ..cluster.spec import AUTO, MAX_TASKS_PER_HOST, ClusterSpec, TaskSpec, is_local
from ..errors import ConfigError
from ..options import name
from ..options import label as options_label
from . import RoleOptions

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")  # a host name or an IPv4 address
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+")
_HOSTFILE_WORD = re.compile(r"^(?P<key>[a-z_]+)=(?P<value>.*)$")
HOSTFILE_FORM = "'HOST slots=N' or 'HOST:N' (N a whole number >= 1), 'HOST', a '#' comment or a blank line"
MAX_SLOTS = MAX_TASKS_PER_HOST  # a host's slot count above it is a typo, refused before anything is planned


@dataclass(frozen=True)
class HostSlots:
    """One host and how many tasks it runs; ``where`` names its origin for messages."""

    host: str
    slots: int
    where: str


def parse_hosts_option(value: str, option: str = "hosts") -> tuple[HostSlots, ...]:
    """``node1:4,node2:4`` as (host, slots) pairs, in order (``option``: the option that gave them)."""
    option = name(option)
    hosts = []
    for item in value.split(","):
        item = item.strip()
        host, slots = _split_item(item)
        if not host or slots is None:
            raise ConfigError(option, item or repr(value),  # an empty item: show where, in the whole value
                              "expected HOST or HOST:SLOTS with SLOTS a whole number >= 1, such as node1:4")
        _check_slots(slots, option, item)
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
    """A slot count >= 1 in ASCII digits, else None; one too long to read counts as over the cap."""
    if not (text.isascii() and text.isdecimal()):  # isdecimal() alone takes other scripts' digits
        return None
    # int() refuses thousands of digits; a count of ten or more is over the cap anyway
    count = int(text) if len(text.lstrip("0")) < 10 else MAX_SLOTS + 1
    return count if count >= 1 else None


def _check_slots(slots: int, source: str, key: str, shown: str | None = None) -> None:
    if slots > MAX_SLOTS:
        raise ConfigError(source, key, (f"{shown!r}: " if shown else "") + "more slots than tflaunch runs on one "
                          f"host; expected at most {MAX_SLOTS} (one TensorFlow task per slot: 8 for a host with 8 GPUs)")


def parse_hostfile(path: str) -> tuple[HostSlots, ...]:
    """The hosts of an MPI/DeepSpeed hostfile; ConfigError names the file and line of a bad line."""
    hosts = []
    for number, line in enumerate(_hostfile_text(path).splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"line {number}"
        bad = ConfigError(path, where, f"{line.strip()!r}: expected {HOSTFILE_FORM}")
        host, slots = _hostfile_host(words[0], path, where)
        if not host:
            raise bad
        seen = set()
        for word in words[1:]:
            match = _HOSTFILE_WORD.match(word)
            if not match or match["key"] not in ("slots", "max_slots") or match["key"] in seen:
                raise bad
            seen.add(match["key"])
            count = _slots(match["value"])
            if count is None:
                raise bad
            if match["key"] == "slots":
                if slots is not None:
                    raise ConfigError(path, where, f"{line.strip()!r}: gives the slots twice; expected "
                                                   "'HOST slots=N' or 'HOST:N'")
                slots = count
        slots = 1 if slots is None else slots
        _check_slots(slots, path, where, line.strip())
        hosts.append(HostSlots(host, slots, f"{path}: {where}"))
    if not hosts:
        raise ConfigError(path, "", f"no hosts; expected one {HOSTFILE_FORM.split(' (')[0]} per line")
    return tuple(hosts)


def _hostfile_text(path: str) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read the hostfile ({exc.strerror or exc})") from None
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ConfigError(path, "", "saved as UTF-16 text; expected UTF-8 (in Notepad: Save As, Encoding UTF-8)")
    try:
        return data.decode("utf-8-sig")  # without the byte-order mark Notepad puts first
    except UnicodeDecodeError:
        raise ConfigError(path, "", "not a text file; expected one 'HOST slots=N' per line") from None


def _hostfile_host(word: str, path: str, where: str) -> tuple[str, int | None]:
    """A hostfile line's first word: ``HOST``, ``[IPV6]``, a bare IPv6 address, or one of the first
    two with ``:N`` (MPICH's form); the host ("" when it is not one) and the slots ``:N`` gave."""
    if word.startswith("["):
        host, _, rest = word[1:].partition("]")
        count = rest[1:] if rest.startswith(":") else None
        if (rest and count is None) or host.count(":") < 2:
            return "", None
    elif word.count(":") == 1:
        host, _, count = word.partition(":")
    else:  # a name, or a bare IPv6 address (whose last group cannot be told from a slot count)
        host, count = word, None
    if not _valid_host(host):
        return "", None
    if count is None:
        return host, None
    slots = _slots(count)
    if slots is None:
        raise ConfigError(path, where, f"{word!r}: expected HOST:N with N a whole number >= 1 (the host's slots), "
                                       f"got {count!r}")
    return host, slots


@dataclass(frozen=True)
class HostsSource(RoleOptions):
    """Task slots on named hosts, from ``-H`` (``hosts``) or a hostfile (``hostfile``); exactly one is
    set. The roles (``chief``, ``ps``, ``evaluator``, ``gpus``) are :class:`~launcher.sources.RoleOptions`'."""

    hosts: str | None = None
    hostfile: str | None = None
    spares: str | None = None  # HOST[:SLOTS],... as -H takes them: one spare slot per slot

    @property
    def label(self) -> str:
        """The options as the user gave them: ``-H node1:4 --chief``, or ``launch(hosts='node1:4', chief=True)``."""
        named = ("hosts", self.hosts) if self.hosts is not None else ("hostfile", self.hostfile)
        return options_label([named, *self.role_words(), *([("spares", self.spares)] if self.spares else [])])

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
        spec = ClusterSpec(source=self.label, tasks=tasks, share_gpus=share, spares=self._spare_slots(hosts, local_hosts))
        check_cluster(spec, local_hosts)
        return spec

    def _spare_slots(self, hosts: tuple[HostSlots, ...], local_hosts: frozenset[str]) -> tuple[TaskSpec, ...]:
        """One spare slot per slot of ``--spares`` (port auto, the --gpus dealt round-robin per host)."""
        if self.spares is None:
            return ()
        spares = parse_hosts_option(self.spares, option="spares")
        _check_distinct(hosts + spares, local_hosts)
        slots = []
        for entry in spares:
            for place_ in range(entry.slots):
                gpus = (self.gpus[place_ % len(self.gpus)],) if self.gpus else ()
                slots.append(TaskSpec(SPARE_ROLE, len(slots), entry.host, AUTO, gpus=gpus, key=f"spares[{len(slots)}]"))
        return tuple(slots)


def place(hosts: tuple[HostSlots, ...], *, chief: bool = False, ps: int = 0, evaluator: bool = False,
          gpus: tuple[int, ...] = (), source: str = "-H") -> tuple[TaskSpec, ...]:
    """One task per slot, roles and GPUs by the rule in the module docstring, every port ``auto`` (pure)."""
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ConfigError(source, name("gpus"), f"expected distinct GPU indices >= 0, got {','.join(map(str, gpus))}")
    slots = number_slots([(h.host, h.slots) for h in hosts])
    roles = carve_roles(slots, chief=chief, ps=ps, evaluator=evaluator, source=source,
                        room=f"slots; the hosts have {len(slots)} (add slots or hosts)")
    dealt = deal_gpus(roles, len(gpus))  # positions in each host's list, round-robin per host
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
