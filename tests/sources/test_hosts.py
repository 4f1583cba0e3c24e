"""-H/--hosts and --hostfile: parsing, placement of roles and GPUs, and real runs on this machine."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import TASK, env_lines_of
from launcher.cluster.plan import RunContext, plan_cluster
from launcher.cluster.spec import AUTO
from launcher.errors import ConfigError
from launcher.sources.hosts import MAX_SLOTS, HostSlots, HostsSource, parse_hostfile, parse_hosts_option, place

LOCAL = frozenset({"localhost", "127.0.0.1", "::1", "thishost"})


def placed(hosts: str, **roles) -> list[tuple[str, str, tuple[int, ...] | None]]:
    return [(t.name, t.host, t.gpus) for t in place(parse_hosts_option(hosts), **roles)]


# -- the -H option ------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    ("node1:4,node2:4", [("node1", 4), ("node2", 4)]),
    ("node1", [("node1", 1)]),
    ("node1:2, node2", [("node1", 2), ("node2", 1)]),
    ("10.0.0.5:3", [("10.0.0.5", 3)]),
    ("[::1]:2", [("::1", 2)]),
    ("::1", [("::1", 1)]),
    ("localhost:8", [("localhost", 8)]),
])
def test_hosts_option_forms(value, expected):
    assert [(h.host, h.slots) for h in parse_hosts_option(value)] == expected


@pytest.mark.parametrize("value, item", [
    ("node1:0", "node1:0"), ("node1:x", "node1:x"), ("node1:-2", "node1:-2"), ("node1:", "node1:"),
    ("node1:4,,node2", "'node1:4,,node2'"), ("fe80::1::zz", "fe80::1::zz"), ("[node1]:2", "[node1]:2"), (":4", ":4"), ("no de:2", "no de:2"), ("[::1]x", "[::1]x"),
])
def test_bad_hosts_option_is_one_error_naming_the_item(value, item):
    with pytest.raises(ConfigError) as error:
        parse_hosts_option(value)
    assert str(error.value) == (f"-H: {item}: expected HOST or HOST:SLOTS with SLOTS a whole number >= 1, "
                                "such as node1:4")


# -- the hostfile ---------------------------------------------------------------------------

def test_hostfile_reads_the_mpi_and_deepspeed_form(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# the cluster\n\nnode1 slots=4\n  node2   slots=2   # two GPUs\nnode3\n"
                    "node4 slots=2 max_slots=8\nlocalhost slots=1\n\t\n10.0.0.7 slots=2\nfd00::7 slots=3\n"
                    "[fd00::8] slots=1\n")
    hosts = parse_hostfile(str(path))
    assert [(h.host, h.slots) for h in hosts] == [("node1", 4), ("node2", 2), ("node3", 1), ("node4", 2),
                                                  ("localhost", 1), ("10.0.0.7", 2), ("fd00::7", 3), ("fd00::8", 1)]
    assert hosts[1].where == f"{path}: line 4"


@pytest.mark.parametrize("line", [
    "node1 slots=0", "node1 slots=four", "node1 slots=", "node1 slots 4", "node1 cpus=4", "node1:4:2",
    "node1 slots=2 slots=3", "slots=4", "node1 slots=2 max_slots=x", "[node1] slots=2", "[fd00::8]2", "nö:2",
])
def test_bad_hostfile_line_names_file_line_and_form(tmp_path, line):
    path = tmp_path / "hostfile"
    path.write_text(f"# ok\nnode0 slots=1\n\n{line}\n")
    with pytest.raises(ConfigError) as error:
        parse_hostfile(str(path))
    assert str(error.value) == (f"{path}: line 4: {line!r}: expected 'HOST slots=N' or 'HOST:N' (N a whole number "
                                ">= 1), 'HOST', a '#' comment or a blank line")


def test_hostfile_saved_by_notepad_and_the_mpich_form(tmp_path):
    path = tmp_path / "hostfile"
    # Notepad: a UTF-8 byte-order mark first and CRLF line ends; MPICH and Intel MPI: HOST:N.
    path.write_bytes("\ufeffnode1:4\r\nnode2 slots=2\r\n[fd00::8]:3\r\nnode3:1 max_slots=4  # spare\r\n"
                     "fd00::7\r\n".encode())
    assert [(h.host, h.slots) for h in parse_hostfile(str(path))] == [
        ("node1", 4), ("node2", 2), ("fd00::8", 3), ("node3", 1), ("fd00::7", 1)]
    path.write_bytes("\ufeff# BOM before a comment\nnode1 slots=2\n".encode())
    assert [(h.host, h.slots) for h in parse_hostfile(str(path))] == [("node1", 2)]


@pytest.mark.parametrize("line, count", [
    ("node1:0", "0"), ("node1:x", "x"), ("node1:", ""), ("node1:-2", "-2"), ("node1:2.5", "2.5"), ("node1:\u00b2", "\u00b2"),
    ("[fd00::8]:0", "0"),
])
def test_host_colon_n_with_a_bad_count_names_file_line_and_value(tmp_path, line, count):
    path = tmp_path / "hostfile"
    path.write_text(f"node0:1\n{line}\n")
    with pytest.raises(ConfigError) as error:
        parse_hostfile(str(path))
    word = line.split()[0]
    assert str(error.value) == (f"{path}: line 2: {word!r}: expected HOST:N with N a whole number >= 1 (the "
                                f"host's slots), got {count!r}")


def test_hostfile_refuses_slots_given_twice_and_utf16(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("node1:4 slots=4\n")
    with pytest.raises(ConfigError) as error:
        parse_hostfile(str(path))
    assert str(error.value) == f"{path}: line 1: 'node1:4 slots=4': gives the slots twice; expected 'HOST slots=N' or 'HOST:N'"
    path.write_text("node1 slots=4\n", encoding="utf-16")  # Notepad's "Unicode"
    with pytest.raises(ConfigError) as error:
        parse_hostfile(str(path))
    assert str(error.value) == f"{path}: saved as UTF-16 text; expected UTF-8 (in Notepad: Save As, Encoding UTF-8)"


def test_slot_counts_beyond_any_machine_are_refused_naming_file_line_and_value(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text(f"node0 slots=8\nnode-a slots={MAX_SLOTS + 1}\n")
    with pytest.raises(ConfigError) as error:
        parse_hostfile(str(path))
    assert str(error.value) == (f"{path}: line 2: 'node-a slots={MAX_SLOTS + 1}': more slots than tflaunch "
                                f"runs on one host; expected at most {MAX_SLOTS} (one TensorFlow task per "
                                "slot: 8 for a host with 8 GPUs)")
    path.write_text("node-a:100000\n")
    with pytest.raises(ConfigError, match=r": line 1: 'node-a:100000': more slots than"):
        parse_hostfile(str(path))
    with pytest.raises(ConfigError) as error:
        parse_hosts_option("node0:2,node-a:100000")
    assert str(error.value).startswith("-H: node-a:100000: more slots than tflaunch runs on one host")
    # Too many digits for int() to read is still this one-line error, never a traceback.
    for line in (f"node-a slots={'9' * 5000}", f"node-a:{'9' * 5000}"):
        path.write_text(line + "\n")
        with pytest.raises(ConfigError, match=r": line 1: .*: more slots than tflaunch runs on one host"):
            parse_hostfile(str(path))
    with pytest.raises(ConfigError, match=r"^-H: node-a:9+: more slots than"):
        parse_hosts_option(f"node-a:{'9' * 5000}")
    path.write_text(f"node-a slots={MAX_SLOTS}\nnode-b:{'0' * 20}8\n")
    assert [h.slots for h in parse_hostfile(str(path))] == [MAX_SLOTS, 8]


def test_empty_and_missing_hostfiles(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(ConfigError, match=rf"^{empty}: no hosts; expected one 'HOST slots=N' .* per line$"):
        parse_hostfile(str(empty))
    with pytest.raises(ConfigError, match=rf"^{tmp_path}/nope: cannot read the hostfile \(No such file"):
        parse_hostfile(str(tmp_path / "nope"))


# -- placement ------------------------------------------------------------------------------

def test_workers_spread_over_hosts_by_slots_with_auto_ports():
    tasks = place(parse_hosts_option("node1:2,node2:3"))
    assert [(t.name, t.host) for t in tasks] == [("worker-0", "node1"), ("worker-1", "node1"), ("worker-2", "node2"),
                                                 ("worker-3", "node2"), ("worker-4", "node2")]
    assert {t.port for t in tasks} == {AUTO}
    assert all(t.gpus == () for t in tasks)  # no --gpus: every task on the CPU


def test_roles_come_from_the_slots_as_in_an_allocation():
    assert placed("node1:2,node2:2", chief=True, ps=1, evaluator=True) == [
        ("chief-0", "node1", ()), ("ps-0", "node1", ()), ("worker-0", "node2", ()), ("evaluator-0", "node2", ())]
    # --ps implies the chief.
    assert [name for name, _, _ in placed("node1:3", ps=1)] == ["chief-0", "ps-0", "worker-0"]


def test_gpus_are_dealt_per_host_to_chief_and_workers():
    assert placed("node1:3,node2:2", chief=True, ps=1, gpus=(0, 1)) == [
        ("chief-0", "node1", (0,)), ("ps-0", "node1", ()), ("worker-0", "node1", (1,)),
        ("worker-1", "node2", (0,)), ("worker-2", "node2", (1,))]
    assert placed("node1:3", gpus=(4, 7)) == [("worker-0", "node1", (4,)), ("worker-1", "node1", (7,)),
                                              ("worker-2", "node1", (4,))]


@pytest.mark.parametrize("roles, message", [
    ({"chief": True}, "--chief: a chief and at least one worker need 2 slots; the hosts have 1 (add slots or hosts)"),
    ({"ps": 1}, "--ps: a chief, 1 ps task and at least one worker need 3 slots; the hosts have 1 (add slots or hosts)"),
    ({"evaluator": True}, "--evaluator: an evaluator and at least one worker need 2 slots; the hosts have 1 "
                          "(add slots or hosts)"),
])
def test_a_worker_must_be_left(roles, message):
    with pytest.raises(ConfigError) as error:
        place(parse_hosts_option("node1:1"), source="-H node1:1", **roles)
    assert str(error.value) == f"-H node1:1: {message}"


def test_spec_on_this_machine_shares_gpus_when_tasks_outnumber_them():
    spec = HostsSource(hosts="localhost:3", chief=True, gpus=(0, 1)).spec(LOCAL)
    assert spec.source == "-H localhost:3 --chief --gpus 0,1"
    assert [(t.name, t.gpus) for t in spec.tasks] == [("chief-0", (0,)), ("worker-0", (1,)), ("worker-1", (0,))]
    assert spec.share_gpus
    assert not HostsSource(hosts="localhost:2", gpus=(0, 1)).spec(LOCAL).share_gpus


def test_each_host_once_and_names_of_this_machine_count_as_one(tmp_path):
    with pytest.raises(ConfigError) as error:
        HostsSource(hosts="localhost:2,thishost:1").spec(LOCAL)
    assert str(error.value) == ("-H thishost:1: 'localhost' and 'thishost' both name this machine; "
                                "expected each host once, with all its slots")
    path = tmp_path / "hostfile"
    path.write_text("node1 slots=2\nnode2 slots=2\nnode1 slots=1\n")
    with pytest.raises(ConfigError) as error:
        HostsSource(hostfile=str(path)).spec(LOCAL)
    assert str(error.value) == (f"{path}: line 3: 'node1' is also named in {path}: line 1; "
                                "expected each host once, with all its slots")


def test_plan_of_a_two_host_cluster_names_each_host():
    # The plan once every host has reported its ports (here filled in by hand).
    hosts = (HostSlots("localhost", 1, "-H"), HostSlots("node2", 2, "-H"))
    from launcher.cluster.spec import ClusterSpec

    tasks = place(hosts, chief=True)
    spec = ClusterSpec(source="-H", tasks=tasks).with_ports({t.name: 2220 + n for n, t in enumerate(tasks)})
    plan = plan_cluster(spec, RunContext("r", "/logs/r"), local_hosts=LOCAL, cores_by_host={},
                        default_python="/py", default_workdir="/w")
    assert [(l.name, l.local, l.transport) for l in plan.launches] == [
        ("chief-0", True, "local"), ("worker-0", False, "ssh"), ("worker-1", False, "ssh")]
    assert json.loads(plan.launches[0].env["TF_CONFIG"])["cluster"] == {
        "chief": ["localhost:2220"], "worker": ["node2:2221", "node2:2222"]}


# -- real runs on this machine -------------------------------------------------------------

def test_hosts_option_runs_tasks_on_this_machine(tflaunch):
    done = tflaunch.run("-H", "localhost:3", "--chief", "--", "python", TASK, "bind", "env")
    assert done.returncode == 0, done.stderr
    record = done.record
    assert record["source"] == "-H localhost:3 --chief"
    assert [t["name"] for t in record["tasks"]] == ["chief-0", "worker-0", "worker-1"]
    for task in record["tasks"]:
        (seen,) = env_lines_of(done.task_output(task["name"]))
        config = json.loads(seen["TF_CONFIG"])
        assert config["task"] == {"type": task["role"], "index": task["index"]}
        assert len(config["cluster"]["worker"]) == 2 and len(config["cluster"]["chief"]) == 1


def test_hostfile_runs_tasks_on_this_machine(tflaunch, tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# this machine only\nlocalhost slots=2\n")
    done = tflaunch.run("--hostfile", str(path), "--", "python", TASK, "bind", "env")
    assert done.returncode == 0, done.stderr
    assert [t["name"] for t in done.record["tasks"]] == ["worker-0", "worker-1"]


def test_bad_hostfile_is_one_line_and_exit_2_for_run_check_and_export(tflaunch, tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("localhost slots=2\nnode2 slots=two\n")
    expected = (f"tflaunch: error: {path}: line 2: 'node2 slots=two': expected 'HOST slots=N' or 'HOST:N' "
                "(N a whole number >= 1), 'HOST', a '#' comment or a blank line")
    for args in (["--hostfile", str(path)], ["check", "--hostfile", str(path)],
                 ["export", "--format", "sh", "--hostfile", str(path)]):
        done = subprocess.run(tflaunch.argv(*args), cwd=tflaunch.cwd, env=tflaunch.env(), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.splitlines() == [expected], args
    assert tflaunch.latest_run() is None


def test_usage_of_hosts_with_other_sources_and_options(tflaunch):
    both = tflaunch.run("-H", "localhost:2", "--local", "2")
    assert both.returncode == 2
    assert "give either a cluster file or --local N, -H HOST:SLOTS,... or --hostfile FILE" in both.stderr
    evaluator = tflaunch.run("--local", "2", "--evaluator")
    assert evaluator.returncode == 2 and "--evaluator applies to -H, --hostfile and --slurm" in evaluator.stderr
    assert "Traceback" not in both.stderr + evaluator.stderr
    # check and export have no --slurm: their message names only the options they have.
    for command in (["check"], ["export", "--format", "sh"]):
        done = subprocess.run(tflaunch.argv(*command, "--local", "2", "--evaluator"), cwd=tflaunch.cwd,
                              env=tflaunch.env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.splitlines() == ["tflaunch: error: --evaluator applies to -H and --hostfile, "
                                            "not to --local"], command


def test_dry_run_and_export_take_hosts(tflaunch):
    dry = tflaunch.run("-H", "localhost:3", "--ps", "1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [line.split(":")[0] for line in dry.stdout.splitlines() if line.endswith(tuple("0123456789"))
            and ": host " in line] == ["chief-0", "ps-0", "worker-0"]
    export = subprocess.run(tflaunch.argv("export", "--format", "sh", "-H", "localhost:2", "--chief"),
                            cwd=tflaunch.cwd, env=tflaunch.env(), capture_output=True, text=True, timeout=60)
    assert export.returncode == 0, export.stderr
    assert "# chief-0 on this machine" in export.stdout and "# worker-0 on this machine" in export.stdout


def test_notepad_hostfile_in_the_mpich_form_runs_and_dry_runs(tflaunch, tmp_path):
    path = tmp_path / "hostfile"
    path.write_bytes("\ufeff# saved by Notepad\r\nlocalhost:2\r\n".encode())
    dry = tflaunch.run("--hostfile", str(path), "--chief", "--dry-run", "--", "python", TASK, "env")
    assert dry.returncode == 0, dry.stderr
    assert [line.split(":")[0] for line in dry.stdout.splitlines() if ": host " in line] == ["chief-0", "worker-0"]
    done = tflaunch.run("--hostfile", str(path), "--chief", "--", "python", TASK, "bind", "env")
    assert done.returncode == 0, done.stderr
    assert done.record["source"] == f"--hostfile {path} --chief"
    assert [(t["name"], t["state"]) for t in done.record["tasks"]] == [("chief-0", "succeeded"), ("worker-0", "succeeded")]
    (seen,) = env_lines_of(done.task_output("worker-0"))
    assert json.loads(seen["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}


CAP = f"more slots than tflaunch runs on one host; expected at most {MAX_SLOTS} (one TensorFlow task per slot: 8 " \
      "for a host with 8 GPUs)"


@pytest.mark.parametrize("source, where", [
    (["--hostfile", "FILE"], "FILE: line 1: 'node-a slots=100000': " + CAP),
    (["-H", "node-a:100000"], "-H: node-a:100000: " + CAP),
    (["--local", "100000"], f"--local 100000: --local: expected at most {MAX_SLOTS} tasks on this machine in all, "
                            "got 100000"),
])
def test_an_absurd_slot_count_is_refused_at_once_not_planned(tflaunch, tmp_path, source, where):
    path = tmp_path / "hostfile"
    path.write_text("node-a slots=100000\n")
    args = [str(path) if word == "FILE" else word for word in source]
    # Before the cap, planning 100000 tasks (each TF_CONFIG naming all of them) printed nothing for minutes.
    done = subprocess.run(tflaunch.argv(*args, "--dry-run"), cwd=tmp_path, env=tflaunch.env(), capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"tflaunch: error: {where.replace('FILE', str(path))}"]


def test_local_counts_share_the_cap_of_one_host():
    from launcher.cluster.local import local_cluster

    assert len(local_cluster(MAX_SLOTS - 2, chief=True, ps=1).tasks) == MAX_SLOTS
    for workers, roles in ((MAX_SLOTS + 1, {}), (MAX_SLOTS, {"chief": True}), (MAX_SLOTS - 1, {"ps": 1})):
        with pytest.raises(ConfigError) as error:
            local_cluster(workers, **roles)
        assert str(error.value) == (f"--local {workers}: --local: expected at most {MAX_SLOTS} tasks on this machine "
                                    f"in all, got {MAX_SLOTS + 1}")
