"""tests/suite.py, the tiers CI runs: every test falls in exactly one tier, cheapest first."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from suite import (ALONE, BESIDE, BESIDE_AFTER, FAVOURED, FAVOURED_SHARES, SLOWEST, STAGES, TIERS, WORKERS,  # noqa: E402
                   Favoured, TierRun, expressions, main, parts, queue_expressions, slowest, tier_environment,
                   Timed, costliest, timed_line, timings)

pytestmark = pytest.mark.project
MARKERS = ("unit", "project", "slow", "tensorflow", "ssh", "slurm", "gpu")


@pytest.fixture(autouse=True)
def reports_in_the_tests_folder(tmp_path, monkeypatch):
    """The JUnit reports and held output of the tier runs these tests make go to the test's own
    folder: the suite's main() removes its reports, and a test that makes a TierRun left its own in /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def tiers_of(markers: set[str]) -> list[str]:
    return [name for name, expression in expressions().items()
            if Expression.compile(expression).evaluate(lambda word, **_: word in markers)]


def test_every_mix_of_markers_runs_in_exactly_one_tier():
    for count in range(len(MARKERS) + 1):
        for markers in itertools.combinations(MARKERS, count):
            assert len(tiers_of(set(markers))) == 1, (markers, tiers_of(set(markers)))


def test_a_test_runs_in_the_first_tier_its_markers_name():
    assert tiers_of(set()) == ["fast"]
    assert tiers_of({"unit"}) == ["unit"]
    assert tiers_of({"project"}) == ["project"]
    assert tiers_of({"slow"}) == ["processes"]
    assert tiers_of({"slow", "ssh"}) == ["ssh"]
    assert tiers_of({"slow", "ssh", "slurm"}) == ["slurm"]
    assert tiers_of({"slow", "ssh", "tensorflow"}) == ["tensorflow"]
    assert tiers_of({"gpu", "tensorflow", "slow"}) == ["tensorflow"]
    assert [name for name, _ in TIERS][-1] == "rest"


def test_an_unknown_tier_is_one_line_and_exit_code_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--tiers", "unit,fastest"])
    assert exit_.value.code == 2
    assert "--tiers: no tier fastest (tiers: unit, project, fast, processes, ssh, slurm, ray, tensorflow, rest)" in capsys.readouterr().err


def test_every_tier_runs_in_one_stage_or_beside_them_in_the_tiers_order():
    staged = [name for stage in STAGES for name in stage]
    assert sorted(staged + list(BESIDE)) == sorted(name for name, _ in TIERS) and not set(staged) & set(BESIDE)
    assert staged == [name for name, _ in TIERS if name not in BESIDE]
    # Off the critical path: the source tree's checks; clusters of their own, tests that wait for the
    # scheduler (Slurm) or for Ray.
    assert BESIDE == ("project", "slurm", "ray")
    # The unit tier alone first, with both cores: a mistake in pure logic shows in seconds.
    assert STAGES[:BESIDE_AFTER] == (("unit",),)
    # The ssh tier, which mostly waits for its hosts, beside the processes tier.
    assert ("processes", "ssh") in STAGES


def test_every_tier_leaves_its_alone_and_favoured_tests_to_their_queues():
    (unit,) = parts(("unit",))
    assert unit == ("unit", f"{expressions()['unit']} and not alone and not favoured")
    assert "unit" in WORKERS
    ssh, slurm = parts(("ssh", "slurm"))
    assert ssh[1] == f"{expressions()['ssh']} and not alone and not favoured"
    assert not {ALONE, FAVOURED} & {name for name, _ in TIERS}

    def matches(expression: str, markers: set[str]) -> bool:
        return Expression.compile(expression).evaluate(lambda word, **_: word in markers)

    # The queues: the tests of the tiers chosen, and only theirs; a test marked both runs alone.
    queues = queue_expressions(["ssh", "tensorflow"], favoured=True)
    assert set(queues) == {ALONE, FAVOURED}
    assert matches(queues[ALONE], {"alone", "ssh"}) and not matches(queues[FAVOURED], {"alone", "ssh"})
    assert matches(queues[FAVOURED], {"favoured", "tensorflow", "slow"})
    assert not matches(queues[ALONE], {"favoured", "tensorflow"})
    assert matches(queues[ALONE], {"alone", "favoured", "ssh"}) and not matches(queues[FAVOURED], {"alone", "favoured", "ssh"})
    for name in (ALONE, FAVOURED):
        assert not matches(queues[name], {"ssh"}) and not matches(queues[name], {name, "slurm"})
        assert not matches(queues[name], {name})  # the fast tier's, not chosen
    # Without a cgroup to favour them in, the favoured tests wait with those that run alone.
    (only,) = queue_expressions(["ssh"], favoured=False).items()
    assert only[0] == ALONE and matches(only[1], {"favoured", "ssh"}) and matches(only[1], {"alone", "ssh"})
    everything = queue_expressions([name for name, _ in TIERS], favoured=True)
    for markers in itertools.chain.from_iterable(itertools.combinations(MARKERS, n) for n in range(3)):
        assert matches(everything[ALONE], {"alone", *markers}) and matches(everything[FAVOURED], {"favoured", *markers})
        assert not matches(everything[ALONE], set(markers)) and not matches(everything[FAVOURED], set(markers))


def test_the_suite_names_its_slowest_and_costliest_tests_from_every_run(tmp_path):
    first, second = tmp_path / "a.xml", tmp_path / "b.xml"
    first.write_text('<testsuites><testsuite><testcase classname="tests.run.test_a" name="test_x" time="3.5">'
                     '<properties><property name="cpu_seconds" value="12.25"/></properties></testcase>'
                     '<testcase classname="tests.run.test_a" name="test_y" time="0.1"/></testsuite></testsuites>')
    second.write_text('<testsuites><testsuite><testcase classname="tests.slurm.test_s" name="test_z[1]" time="9">'
                      '<properties><property name="cpu_seconds" value="0.5"/></properties></testcase>'
                      '</testsuite></testsuites>')
    found, unread = timings([("fast", first), ("slurm", second), ("ssh", tmp_path / "missing.xml")])
    x = Timed(3.5, 12.25, "fast", "tests/run/test_a.py::test_x")
    z = Timed(9.0, 0.5, "slurm", "tests/slurm/test_s.py::test_z[1]")
    assert slowest(found, count=2) == [z, x]
    assert costliest(found, count=5) == [x, z]  # a test without the property is not ranked by CPU
    assert timed_line(x) == "     3.5s    12.2s CPU  fast        tests/run/test_a.py::test_x"
    assert timed_line(Timed(0.1, None, "fast", "t")).startswith("     0.1s" + " " * 15 + "fast")
    assert len(unread) == 1 and unread[0].startswith(f"tier ssh: no test times ({tmp_path / 'missing.xml'}: ")
    assert SLOWEST == 15


@pytest.mark.timeout(120)
def test_each_test_reports_the_cpu_of_what_it_waited_for(tmp_path):
    # A test that waits for a child busy for about 0.3 s of CPU reports at least that; one that sleeps, little.
    (tmp_path / "test_sample.py").write_text(
        "import subprocess, sys, time\n"
        "def test_busy():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nend = time.process_time() + 0.3\\n"
        "while time.process_time() < end: pass'], check=True)\n"
        "def test_idle():\n    time.sleep(0.3)\n")
    report = tmp_path / "report.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "costs", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), f"--junitxml={report}", str(tmp_path / "test_sample.py")],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]
    found = {t.test_id.rsplit("::", 1)[1]: t for t in timings([("fast", report)])[0]}
    assert found["test_busy"].cpu >= 0.3, found
    assert found["test_idle"].cpu < 0.2, found

@pytest.mark.timeout(120)
def test_the_queues_run_only_their_tests_and_the_tiers_leave_them_out(tmp_path, capsys):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_beside():\n    pass\n"
        "@pytest.mark.alone\ndef test_alone():\n    pass\n"
        "@pytest.mark.alone\n@pytest.mark.parametrize('n', [1, 2])\ndef test_alone_twice(n):\n    pass\n"
        "@pytest.mark.favoured\ndef test_favoured():\n    pass\n")
    flags = ["-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    (fast,) = parts(("fast",))
    run = TierRun("fast", ["-m", fast[1], str(tmp_path)], 1, flags, held=True)
    assert run.wait() == 0
    shown = capsys.readouterr().out
    assert "1 passed, 4 deselected" in shown and "=== tier fast: passed" in shown
    queues = queue_expressions(["fast"], favoured=True)
    for name, passed, deselected in ((ALONE, 3, 2), (FAVOURED, 1, 4)):
        queue = TierRun(name, ["-m", queues[name], str(tmp_path)], 1, flags, held=True)
        assert queue.wait() == 0
        shown = capsys.readouterr().out
        assert f"{passed} passed, {deselected} deselected" in shown and f"=== tier {name}: passed" in shown


def test_no_cpu_controller_to_write_to_means_no_favoured_cgroup(tmp_path):
    (tmp_path / "cgroup").write_text("0::/user.slice\n")  # cgroup v2 only
    assert Favoured.make(str(tmp_path / "cgroup"), root=tmp_path) is None
    (tmp_path / "cgroup").write_text("4:cpu,cpuacct:/ci\n")  # a v1 controller, not mounted here
    assert Favoured.make(str(tmp_path / "cgroup"), root=tmp_path) is None
    assert Favoured.make(str(tmp_path / "missing"), root=tmp_path) is None


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup is made by root")
def test_the_queue_runs_in_a_cgroup_favoured_for_the_cpu_and_leaves_none_behind(tmp_path):
    favoured = Favoured.make()
    if favoured is None:
        pytest.skip("no cgroup v1 CPU controller on this machine")
    try:
        assert int((favoured.folder / "cpu.shares").read_text()) == FAVOURED_SHARES == 262144
        # A daemon that outlives the queue, as a test's sshd may.
        out = subprocess.run(favoured.argv(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!; cat /proc/self/cgroup"]),
                             capture_output=True, text=True, timeout=30, check=True).stdout.split("\n")
        left = int(out[0])
        assert any("cpu" in line.split(":", 2)[1].split(",") and line.endswith("/" + favoured.folder.name)
                   for line in out[1:] if line), out
        assert str(left) in (favoured.folder / "cgroup.procs").read_text().split()
    finally:
        favoured.remove()
    try:
        assert not favoured.folder.exists()
        assert str(left) in (favoured.parent / "cgroup.procs").read_text().split()
    finally:
        os.kill(left, signal.SIGKILL)


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup is made by root")
def test_the_cgroup_of_a_suite_killed_before_its_end_goes_with_the_next_suite():
    favoured = Favoured.make()
    if favoured is None:
        pytest.skip("no cgroup v1 CPU controller on this machine")
    favoured.remove()
    dead = subprocess.Popen(["true"])  # a pid that has ended: a suite killed before its end
    dead.wait()
    stale = favoured.parent / f"tflaunch-suite-{dead.pid}"
    stale.mkdir()
    live = favoured.parent / f"tflaunch-suite-{os.getppid()}"  # a suite that still runs keeps its own
    made_live = not live.exists()
    if made_live:
        live.mkdir()
    try:
        again = Favoured.make()
        assert again is not None and not stale.exists() and live.exists()
        again.remove()
    finally:
        if made_live:
            live.rmdir()
        if stale.exists():
            stale.rmdir()


@pytest.mark.timeout(120)
def test_a_tier_waited_for_late_takes_the_time_it_ran_not_the_wait(tmp_path, capsys):
    (tmp_path / "test_quick.py").write_text("def test_quick():\n    pass\n")
    run = TierRun("slurm", [str(tmp_path)], 1, ["-p", "no:cacheprovider", "--rootdir", str(tmp_path)], held=True)
    run.exited.wait()
    finished = time.monotonic()
    time.sleep(3)  # the stages beside it go on
    assert run.wait() == 0
    assert run.took <= finished - run.started + 0.5, (run.took, finished - run.started)


@pytest.mark.timeout(120)
def test_the_tests_of_one_xdist_group_run_in_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
                                          "pytest_plugins = ['groups']\n")
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "@pytest.mark.xdist_group('shared')\n@pytest.mark.parametrize('n', range(6))\n"
        "def test_grouped(n):\n"
        f"    with open({str(tmp_path / 'workers')!r}, 'a') as out:\n"
        "        out.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n")
    import subprocess
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "2",
                           "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout[-2000:]
    workers = (tmp_path / "workers").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers


@pytest.mark.timeout(120)
def test_a_tiers_cpu_counts_the_processes_its_tests_start(tmp_path, capsys):
    (tmp_path / "test_busy.py").write_text(
        "import subprocess, sys\n"
        "def test_busy():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nend = time.process_time() + 1.0\\n"
        "while time.process_time() < end: pass'], check=True)\n")
    run = TierRun("fast", [str(tmp_path)], 1, ["-p", "no:cacheprovider", "--rootdir", str(tmp_path)], held=True)
    assert run.wait() == 0
    assert 1.0 <= run.cpu < 30, run.cpu  # the busy child's second, and pytest's own start
    assert f"=== tier fast: passed in {run.took:.0f} s ({run.cpu:.0f} s of CPU)" in capsys.readouterr().out


def test_the_tiers_write_bytecode_caches_where_this_machine_says_not_to():
    env = tier_environment({"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin", "TFLAUNCH_DEBUG": "1"})
    assert env == {"PATH": "/usr/bin", "TFLAUNCH_DEBUG": "1"}
