"""Which hosts' task Python would import another Python, TensorFlow, tf_keras or Keras than the
others do: a pure verdict on the preflight probes' answers (see :mod:`launcher.cluster.probe`).

The rule (docs/multi-host.md, "Preflight"), for each of :data:`PACKAGES`:

- the reference is the version most of the run's hosts have, "missing" counting as one; on a tie,
  the chief's host's version if it is among the tied ones, else that of the first host (in the
  order given) that has one of them;
- Python is compared at major.minor (a patch release keeps the ABI), the packages at their whole version;
- a host differs where its version is not the reference, also where the package is missing on one
  side only;
- a difference fails the preflight when the versions differ at :data:`FAILS_AT` or above, or when
  the package is missing on one side; any other difference (a patch release) is a warning.

A host whose probe could not tell a version (its mapping has no such key) is left out of that
package's vote and comparison.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...records.states import plural

PACKAGES = ("python", "tensorflow", "tf_keras", "keras")
MAJOR, MINOR, PATCH = 0, 1, 2  # the part in which two versions first differ
# A difference at this part or above fails: MultiWorkerMirroredStrategy's collective protocol and
# the checkpoint formats change between TensorFlow (and tf_keras, which follows it) minor releases,
# and a Python minor release changes the bytecode and the ABI of compiled packages. Keras 3's minor
# releases come on their own schedule and read each other's files; Keras 2 and 3 do not.
FAILS_AT = {"python": MINOR, "tensorflow": MINOR, "tf_keras": MINOR, "keras": MAJOR}
HOSTS_NAMED = 5  # a line names at most this many hosts, then counts the rest

Versions = Mapping[str, "str | None"]  # package -> version, None: not installed; no key: unknown


@dataclass(frozen=True)
class Difference:
    """One package whose version on a host is not the reference (None: not installed)."""

    package: str
    version: str | None
    reference: str | None
    fails: bool

    @property
    def text(self) -> str:
        return f"{self.package} {self.version or 'missing'} (others {self.reference or 'missing'})"


@dataclass(frozen=True)
class VersionFinding:
    """A host that differs from the reference; ``candidate``: not one of the run's hosts."""

    host: str
    differences: tuple[Difference, ...]
    candidate: bool = False

    @property
    def fails(self) -> bool:
        return any(d.fails for d in self.differences)


def compare_versions(hosts: Mapping[str, Versions], candidates: Mapping[str, Versions] | None = None,
                     chief: str | None = None) -> list[VersionFinding]:
    """The hosts that differ, the run's ``hosts`` (in their order) first, then ``candidates``.

    ``hosts``: each of the run's hosts' versions as its probe found them, keyed by :data:`PACKAGES`
    (the probe's ``python`` and ``versions``). ``chief``: the host the chief runs on, which settles
    a tie. Only ``hosts`` vote for the reference. ``candidates`` are hosts that may join the run
    later (spare hosts): each is compared with the run's reference and found here when it differs;
    a caller that fails a run on the run's findings should leave out a candidate with a finding
    that ``fails`` rather than fail the run (``candidate`` tells the two apart).
    """
    candidates = candidates or {}
    references = {package: _reference(package, hosts, chief) for package in PACKAGES}
    findings = []
    for group, is_candidate in ((hosts, False), (candidates, True)):
        for host, versions in group.items():
            differences = tuple(d for package in PACKAGES
                                if (d := _difference(package, versions, references[package])) is not None)
            if differences:
                findings.append(VersionFinding(host, differences, is_candidate))
    return findings


def version_lines(findings: Sequence[VersionFinding]) -> list[tuple[str, bool]]:
    """One line per set of hosts that differ alike, with whether it fails, e.g.
    ``node3 differs from the other hosts: tensorflow 2.20.0 (others 2.21.0), tf_keras missing (others 2.21.0)``."""
    groups: dict[tuple[bool, tuple[Difference, ...]], list[str]] = {}
    for finding in findings:
        groups.setdefault((finding.candidate, finding.differences), []).append(finding.host)
    lines = []
    for (candidate, differences), names in groups.items():
        shown = ", ".join(names[:HOSTS_NAMED])
        if len(names) > HOSTS_NAMED:
            shown += f" and {plural(len(names) - HOSTS_NAMED, 'other host')}"
        verb = "differs" if len(names) == 1 else "differ"
        others = "the run's hosts" if candidate else "the other hosts"
        text = f"{shown} {verb} from {others}: {', '.join(d.text for d in differences)}"
        lines.append((text, any(d.fails for d in differences)))
    return lines


def _compared(package: str, version: str | None) -> str | None:
    """The part of a version that is compared: Python's major.minor, a package's whole version."""
    if version is None or package != "python":
        return version
    return ".".join(version.split(".")[:2])


def _reference(package: str, hosts: Mapping[str, Versions], chief: str | None) -> tuple[bool, str | None]:
    """(whether any host told, the reference version)."""
    known = [(host, _compared(package, versions[package])) for host, versions in hosts.items() if package in versions]
    if not known:
        return False, None
    counts = Counter(version for _, version in known)
    most = max(counts.values())
    tied = {version for version, count in counts.items() if count == most}
    by_host = dict(known)
    if chief in by_host and by_host[chief] in tied:
        return True, by_host[chief]
    return True, next(version for _, version in known if version in tied)


def _difference(package: str, versions: Versions, reference: tuple[bool, str | None]) -> Difference | None:
    told, wanted = reference
    if not told or package not in versions:
        return None
    version = _compared(package, versions[package])
    if version == wanted:
        return None
    fails = version is None or wanted is None or _differs_at(version, wanted) <= FAILS_AT[package]
    return Difference(package, version, wanted, fails)


def _differs_at(a: str, b: str) -> int:
    """MAJOR, MINOR or PATCH: the first part in which two different versions differ; MAJOR when
    either does not start with a number (nothing else can be told of it)."""
    parts = []
    for version in (a, b):
        match = re.match(r"(\d+)(?:\.(\d+))?", version)
        if match is None:
            return MAJOR
        parts.append((int(match.group(1)), int(match.group(2) or 0)))
    (a_major, a_minor), (b_major, b_minor) = parts
    if a_major != b_major:
        return MAJOR
    return MINOR if a_minor != b_minor else PATCH
