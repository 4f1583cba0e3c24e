"""The version verdict of the preflight: the rule (pure), the probe script's answer on this machine
with a shadowing dist-info on PYTHONPATH, and real hosts over ssh where one host's Python sees other
versions (``tflaunch check`` and a run)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TASK
from test_mesh import cluster_file, on_test_hosts
from test_mesh import rows as table_rows

from launcher.cluster import probe
from launcher.run.checks.preflight import probed_versions
from launcher.run.checks.versions import Difference, VersionFinding, compare_versions, version_lines

ALIKE = {"python": "3.11.7", "tensorflow": "2.21.0", "tf_keras": "2.21.0", "keras": "3.15.1"}


def hosts(*changes: dict, names: tuple[str, ...] = ()) -> dict[str, dict]:
    """One host per change (node1, node2...), each ALIKE with its change applied (a value of ... drops the key)."""
    result = {}
    for i, change in enumerate(changes):
        versions = {**ALIKE, **change}
        result[names[i] if names else f"node{i + 1}"] = {k: v for k, v in versions.items() if v is not ...}
    return result


def lines(found: list[VersionFinding]) -> list[tuple[str, bool]]:
    return version_lines(found)


# ---- the rule ----

@pytest.mark.unit
def test_hosts_alike_give_nothing():
    assert compare_versions(hosts({}, {}, {})) == []
    assert compare_versions({}) == [] and compare_versions(hosts({})) == []


@pytest.mark.unit
def test_the_host_that_differs_is_named_with_each_difference_and_the_others_version():
    found = compare_versions(hosts({}, {}, {"tensorflow": "2.20.0", "tf_keras": None}))
    assert found == [VersionFinding("node3", (Difference("tensorflow", "2.20.0", "2.21.0", True),
                                              Difference("tf_keras", None, "2.21.0", True)))]
    assert lines(found) == [("node3 differs from the other hosts: tensorflow 2.20.0 (others 2.21.0), "
                             "tf_keras missing (others 2.21.0)", True)]


@pytest.mark.unit
@pytest.mark.parametrize("package, theirs, fails", [
    ("tensorflow", "2.21.1", False),  # a patch release: a warning
    ("tensorflow", "2.21.0rc1", False),
    ("tensorflow", "2.21.0.dev20260101", False),  # a nightly of the same minor release
    ("tensorflow", "2.20.0", True),
    ("tensorflow", "3.21.0", True),
    ("tf_keras", "2.21.3", False),
    ("tf_keras", "2.20.0", True),
    ("keras", "3.15.2", False),
    ("keras", "3.14.0", False),  # Keras 3's minor releases read each other's files
    ("keras", "2.15.0", True),  # Keras 2 against 3
    ("python", "3.11.9", None),  # Python is compared at major.minor: a patch release is no difference
    ("python", "3.10.14", True),
    ("tensorflow", "custom-build", True),  # no number to tell the level by: it fails
])
def test_what_fails_and_what_warns(package, theirs, fails):
    found = compare_versions(hosts({}, {}, {package: theirs}))
    if fails is None:
        assert found == []
        return
    (finding,) = found
    (difference,) = finding.differences
    assert (finding.host, difference.package, difference.fails, finding.fails) == ("node3", package, fails, fails)


@pytest.mark.unit
def test_python_is_shown_at_major_minor():
    assert lines(compare_versions(hosts({}, {"python": "3.11.2"}, {"python": "3.12.1"}))) == [
        ("node3 differs from the other hosts: python 3.12 (others 3.11)", True)]


@pytest.mark.unit
@pytest.mark.parametrize("package", ["tensorflow", "tf_keras", "keras"])
def test_a_package_missing_on_some_hosts_fails_either_way(package):
    (missing,) = compare_versions(hosts({}, {}, {package: None}))
    assert missing.differences == (Difference(package, None, ALIKE[package], True),)
    (present,) = compare_versions(hosts({package: None}, {package: None}, {package: None}, {}))
    assert present.host == "node4" and present.differences == (Difference(package, ALIKE[package], None, True),)


@pytest.mark.unit
def test_missing_everywhere_is_alike():
    assert compare_versions(hosts({"tf_keras": None}, {"tf_keras": None})) == []


@pytest.mark.unit
def test_the_majority_is_the_reference_whichever_host_comes_first():
    found = compare_versions(hosts({"tensorflow": "2.20.0"}, {}, {}), chief="node1")
    assert [(f.host, f.differences[0].reference) for f in found] == [("node1", "2.21.0")]


@pytest.mark.unit
def test_a_tie_goes_to_the_chiefs_host_else_the_first_host():
    two = hosts({"tensorflow": "2.20.0"}, {})
    assert [f.host for f in compare_versions(two, chief="node2")] == ["node1"]
    assert [f.host for f in compare_versions(two, chief="node1")] == ["node2"]
    assert [f.host for f in compare_versions(two)] == ["node2"]
    assert [f.host for f in compare_versions(two, chief="elsewhere")] == ["node2"]


@pytest.mark.unit
def test_a_chief_outside_the_tie_does_not_settle_it():
    five = hosts({"keras": "3.1.0"}, {"keras": "3.2.0"}, {"keras": "3.1.0"}, {"keras": "3.2.0"}, {"keras": "3.3.0"})
    found = compare_versions(five, chief="node5")
    assert [(f.host, f.differences[0].reference) for f in found] == [
        ("node2", "3.1.0"), ("node4", "3.1.0"), ("node5", "3.1.0")]


@pytest.mark.unit
def test_the_majority_of_python_counts_major_minor():
    # 3.11.2 and 3.11.9 are one vote-getter: 3.11 wins over 3.12 although 3.12.0 is the most frequent full version.
    three = hosts({"python": "3.12.0"}, {"python": "3.11.2"}, {"python": "3.11.9"})
    assert [(f.host, f.differences) for f in compare_versions(three)] == [
        ("node1", (Difference("python", "3.12", "3.11", True),))]


@pytest.mark.unit
def test_a_version_a_host_could_not_tell_is_left_out():
    # node1's probe had no importlib.metadata: only its Python is known; it neither votes nor differs.
    found = compare_versions(hosts({"tensorflow": ..., "tf_keras": ..., "keras": ...},
                                   {"tensorflow": "2.20.0"}, {"tensorflow": "2.20.0"}, {}))
    assert [(f.host, f.differences[0].text) for f in found] == [("node4", "tensorflow 2.21.0 (others 2.20.0)")]


@pytest.mark.unit
def test_hosts_that_differ_alike_share_one_line_and_many_are_counted():
    run = hosts({}, {}, {"keras": "3.15.2"}, {"keras": "3.15.2"}, {"tensorflow": "2.20.0"}, {})
    assert lines(compare_versions(run)) == [
        ("node3, node4 differ from the other hosts: keras 3.15.2 (others 3.15.1)", False),
        ("node5 differs from the other hosts: tensorflow 2.20.0 (others 2.21.0)", True)]
    many = hosts(*([{}] * 9), *([{"tf_keras": "2.21.1"}] * 7))
    assert lines(compare_versions(many)) == [
        ("node10, node11, node12, node13, node14 and 2 other hosts differ from the other hosts: "
         "tf_keras 2.21.1 (others 2.21.0)", False)]
    six = hosts(*([{}] * 9), *([{"tf_keras": "2.21.1"}] * 6))  # one more than are named: "1 other host"
    assert lines(compare_versions(six))[0][0].startswith("node10, node11, node12, node13, node14 and 1 other host differ")


@pytest.mark.unit
def test_candidates_are_compared_with_the_runs_hosts_but_do_not_vote():
    run = hosts({}, names=("node1",))
    spares = hosts({"tensorflow": "2.20.0"}, {"tensorflow": "2.20.0"}, {}, names=("spare1", "spare2", "spare3"))
    found = compare_versions(run, candidates=spares)
    assert [(f.host, f.candidate, f.fails) for f in found] == [("spare1", True, True), ("spare2", True, True)]
    assert lines(found) == [("spare1, spare2 differ from the run's hosts: tensorflow 2.20.0 (others 2.21.0)", True)]


@pytest.mark.unit
def test_run_hosts_come_first_then_candidates_and_unknown_references_skip_candidates():
    run = hosts({"keras": ...}, {"tf_keras": "2.21.1", "keras": ...})
    spares = hosts({"tf_keras": "2.20.0"}, names=("spare1",))
    found = compare_versions(run, candidates=spares)
    # No run host could tell its Keras: the spare's Keras is not judged; its tf_keras is, against node1's (a tie).
    assert [(f.host, f.candidate, [d.text for d in f.differences]) for f in found] == [
        ("node2", False, ["tf_keras 2.21.1 (others 2.21.0)"]),
        ("spare1", True, ["tf_keras 2.20.0 (others 2.21.0)"])]


@pytest.mark.unit
def test_a_probes_answer_becomes_the_versions_compared():
    answer = {"python": "3.11.7", "versions": {"tensorflow": "2.21.0", "tf_keras": None, "keras": "unknown"}}
    assert probed_versions(answer) == {"python": "3.11.7", "tensorflow": "2.21.0", "tf_keras": None}
    assert probed_versions({"python": "3.7.3", "versions": {}}) == {"python": "3.7.3"}


# ---- the probe script on this machine ----

def dist_info(folder: Path, name: str, version: str) -> Path:
    """A distribution's metadata alone, as pip leaves it: importlib.metadata finds it where PYTHONPATH puts it."""
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def run_probe(env: dict[str, str] | None = None) -> dict:
    request = base64.b64encode(json.dumps({}).encode()).decode()
    done = subprocess.run([sys.executable, "-c", Path(probe.__file__).read_text(), request], capture_output=True,
                          text=True, timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.split("TFLAUNCH_PROBE ", 1)[1])


def test_probe_reports_the_versions_the_tasks_python_finds_first(tmp_path, monkeypatch):
    from importlib import metadata

    plain = run_probe()["versions"]
    assert plain == {name: metadata.version(name.replace("_", "-")) for name in ("tensorflow", "tf_keras", "keras")}
    shadow = dist_info(tmp_path, "tensorflow", "2.0.0")
    dist_info(shadow, "tf_keras", "2.0.1")
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    shadowed = run_probe()["versions"]
    assert shadowed == {**plain, "tensorflow": "2.0.0", "tf_keras": "2.0.1"}


# ---- real hosts over ssh: node3's Python finds other versions through its host's PYTHONPATH ----

def three_hosts(tmp_path: Path, testhosts, node3_path: Path | None) -> Path:
    """A worker on each of node1-node3 (tflaunch's own Python everywhere); ``node3_path``: node3's PYTHONPATH."""
    port = testhosts.port()
    node3 = f"hosts:\n  node3:\n    env: {{PYTHONPATH: {node3_path}}}\n" if node3_path else ""
    workers = "".join(f"  - host: {h.name}\n    address: {h.address}\n    port: {port}\n" for h in testhosts.hosts[:3])
    return cluster_file(tmp_path, testhosts, f"{node3}worker:\n{workers}", name=f"{'node3' if node3 else 'alike'}.yaml")


def patch_release_of(version: str) -> str:
    major, minor, patch = version.split(".")[:3]
    return f"{major}.{minor}.{int(patch) + 9}"


@on_test_hosts
def test_a_host_with_another_tensorflow_fails_check_and_refuses_the_run(tflaunch, testhosts, tmp_path):
    from importlib import metadata

    ours = metadata.version("tensorflow")
    cluster = three_hosts(tmp_path, testhosts, dist_info(tmp_path / "shadow", "tensorflow", "2.0.0"))
    differs = f"node3 differs from the other hosts: tensorflow 2.0.0 (others {ours})"
    checked = tflaunch.run("check", str(cluster), timeout=60)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert table_rows(checked.stdout, "tensorflow") == {
        "node1": [f"ok  {ours} installed"], "node2": [f"ok  {ours} installed"], "node3": ["ok  2.0.0 installed"]}
    assert table_rows(checked.stdout, "versions") == {"*": [f"FAIL  {differs}"]}
    keras = f"ok  tf_keras {metadata.version('tf-keras')}, keras {metadata.version('keras')}"
    assert table_rows(checked.stdout, "keras") == {"node1": [keras], "node2": [keras], "node3": [keras]}
    assert checked.stdout.strip().endswith("1 check(s) failed")

    refused = tflaunch.run(str(cluster), "--", "python", TASK, "print:started", timeout=60)
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line == (f"tflaunch: error: {cluster}: preflight failed: {differs} "
                    f"(see 'tflaunch check {cluster}', or skip with --no-check)")
    assert tflaunch.latest_run() is None  # refused before any task started


@on_test_hosts
def test_a_patch_release_apart_warns_in_check_and_run_and_hosts_alike_say_nothing(tflaunch, testhosts, tmp_path):
    from importlib import metadata

    ours = metadata.version("tf-keras")
    theirs = patch_release_of(ours)
    differs = f"node3 differs from the other hosts: tf_keras {theirs} (others {ours})"
    cluster = three_hosts(tmp_path, testhosts, dist_info(tmp_path / "shadow", "tf_keras", theirs))
    checked = tflaunch.run("check", str(cluster), timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert table_rows(checked.stdout, "versions") == {"*": [f"WARN  {differs}"]}
    done = tflaunch.run(str(cluster), "--", "python", TASK, "print:started", timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"tflaunch: preflight: {differs}\n" in done.stderr

    alike = three_hosts(tmp_path, testhosts, None)
    checked = tflaunch.run("check", str(alike), timeout=60)
    assert checked.returncode == 0 and "versions" not in table_rows(checked.stdout, "versions") and \
        "differs" not in checked.stdout, checked.stdout
    done = tflaunch.run(str(alike), "--", "python", TASK, "print:started", timeout=60)
    assert done.returncode == 0 and "preflight" not in done.stderr, done.stderr
