"""Secrets: a variable passed by name (``--env KEY``, ``KEY:`` in a cluster file, None in the Python
API) or whose name marks a secret reaches its tasks, but its value is in no file of the run folder,
no console line, no ``--dry-run`` line, no export and no command line; and text no process could
receive (a NUL, bytes that are not UTF-8) is refused at check time.

The runs are real: tasks on this machine, on the ssh test hosts and on the test Slurm. Each task
prints a hash of each value it received (helpers/secret_task.py), never the value itself, and stays
up until the test has read every process's command line.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import HELPERS, ROOT
from polling import wait_for
from launcher.cluster.plan import RunContext, plan_cluster
from launcher.cluster.reader import parse_cluster
from launcher.cluster.spec import MASK, check_launch_input, hidden_names, is_secret_name, masked_env, text_problem
from launcher.masking import masked_argv
from launcher.errors import ConfigError
from launcher.export import ExportRequest, export
from launcher.sources.local import LocalSource

SECRET_TASK = str(HELPERS / "secret_task.py")
FORMATS = ("jobset", "tfjob", "trainjob", "sh")
LOCAL = frozenset({"localhost"})


def _value(kind: str) -> str:
    """A value no file or process could hold by chance."""
    return f"{kind}-{secrets.token_hex(12)}"


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def hashes(text: str) -> dict[tuple[str, str], str]:
    """(task, variable) -> the hash that task printed."""
    found = {}
    for line in text.splitlines():
        if "HASH " in line:
            task, name, digest = line.split("HASH ", 1)[1].split()[:3]
            found[(task, name)] = digest
    return found


def command_lines() -> dict[int, bytes]:
    """Every process's command line on this machine (the test hosts and Slurm nodes share its pids)."""
    lines = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                lines[int(entry.name)] = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                pass  # gone meanwhile
    return lines


def assert_on_no_command_line(values: list[str], expected: dict[str, object]) -> None:
    """No process's command line holds any of ``values``; each ``expected`` predicate (what -> test of a
    pid and its line) matches some process, so the look covered the processes that matter."""
    lines = command_lines()
    leaks = {pid: line[:200] for pid, line in lines.items() if any(v.encode() in line for v in values)}
    assert not leaks, f"a secret on a command line: {leaks}"
    for what, matches in expected.items():
        assert any(matches(pid, line) for pid, line in lines.items()), f"no {what} among the processes"


def files_holding(folder: Path, values: list[str]) -> list[str]:
    return [str(path) for path in folder.rglob("*")
            if path.is_file() and any(v.encode() in path.read_bytes() for v in values)]


def assert_nowhere(values: list[str], *texts: str) -> None:
    for text in texts:
        for value in values:
            assert value not in text, f"a secret in: {text[:2000]}"


def tflaunch_argv(*args) -> list:
    return [sys.executable, "-m", "launcher", *args]


def run_tflaunch(*args, env: dict | None = None, cwd: Path | None = None, timeout: float = 120):
    return subprocess.run(tflaunch_argv(*args), capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                                          **(env or {})},
                          cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)


def one_error_line(done, *parts: str) -> str:
    err = done.stderr.decode(errors="replace") if isinstance(done.stderr, bytes) else done.stderr
    assert done.returncode == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tflaunch: error: ") and "Traceback" not in err, err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


# -- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "hf_token", "DB_PASSWORD", "MYSQL_PASSWD",
                                  "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "OPENAI_APIKEY", "SSH_PRIVATE_KEY",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "Client_Secret", "GITHUB_TOKEN"])
def test_names_that_mark_a_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "DATA_DIR", "TF_CONFIG", "API_URL", "KEYBOARD", "PASS", "TOKE", "ACCESS"])
def test_ordinary_names(name):
    assert not is_secret_name(name)


def test_masked_argv_hides_every_form_of_a_secret_env_option_and_nothing_else():
    argv = ["tflaunch", "--local", "2", "--env", "HF_TOKEN=abc", "-e", "DB_PASSWORD=pw", "--env=MY_SECRET=s=1",
            "-eWANDB_API_KEY=k", "--env", "DATA=/d", "-e", "GITHUB_TOKEN", "--log-dir", "logs",
            "--", "python", "train.py", "--env", "HF_TOKEN=the task's own", "--epochs", "3"]
    # The task's command follows the same rule: run.json and --dry-run show it too.
    assert masked_argv(argv) == [
        "tflaunch", "--local", "2", "--env", f"HF_TOKEN={MASK}", "-e", f"DB_PASSWORD={MASK}",
        f"--env=MY_SECRET={MASK}", f"-eWANDB_API_KEY={MASK}", "--env", "DATA=/d", "-e", "GITHUB_TOKEN",
        "--log-dir", "logs", "--", "python", "train.py", "--env", f"HF_TOKEN={MASK}", "--epochs", "3"]


def test_masked_env_and_hidden_names():
    env = {"HF_TOKEN": "t", "DATA": "d", "BY_NAME": "v", "TF_CONFIG": "{}"}
    hidden = hidden_names(env, ["BY_NAME"])
    assert hidden == {"HF_TOKEN", "BY_NAME"}
    assert masked_env(env, hidden) == {"HF_TOKEN": MASK, "DATA": "d", "BY_NAME": MASK, "TF_CONFIG": "{}"}
    assert masked_env(env, ()) == {**env, "HF_TOKEN": MASK}  # a secret's name is masked whatever the caller knew


def test_text_problem_names_the_byte_and_never_the_value():
    assert text_problem("plain ü ✓") is None
    assert text_problem("ab\0c") == "contains a NUL byte at position 2"
    assert text_problem(b"abc\xff".decode("utf-8", "surrogateescape")) == "is not valid UTF-8 (byte 0xff at position 3)"
    assert text_problem("x\ud800") == "is not valid UTF-8 (character U+D800 at position 1)"


def _plan(text: str, environ: dict, override: dict | None = None, pass_values: bool = True):
    spec = parse_cluster(text, "c.yaml", LOCAL)
    return plan_cluster(spec, RunContext("r", "/runs/r"), local_hosts=LOCAL, cores_by_host={}, default_python="python3",
                        default_workdir="/w", inherited_env=environ, override_env=override, pass_values=pass_values)


CLUSTER = ("env: {WANDB_API_KEY: , DATA: /d, HF_TOKEN: inline}\n"
           "hosts: {localhost: {env: {HOST_VAR: null}}}\n"
           "worker: [{host: localhost, port: 2222, env: {TASK_VAR: ~}}]\n")


def test_by_name_values_come_from_tflaunchs_environment_and_are_hidden():
    environ = {"WANDB_API_KEY": "w", "HOST_VAR": "h", "TASK_VAR": "t", "CLI_VAR": "c", "UNUSED_TOKEN": "u"}
    (launch,) = _plan(CLUSTER, environ, {"CLI_VAR": None, "A_TOKEN": "a", "DATA": "/cli"}).launches
    assert {k: launch.env[k] for k in ("WANDB_API_KEY", "HOST_VAR", "TASK_VAR", "CLI_VAR", "HF_TOKEN", "A_TOKEN",
                                       "DATA")} == {"WANDB_API_KEY": "w", "HOST_VAR": "h", "TASK_VAR": "t",
                                                    "CLI_VAR": "c", "HF_TOKEN": "inline", "A_TOKEN": "a",
                                                    "DATA": "/cli"}
    assert "UNUSED_TOKEN" not in launch.env  # only what was asked for is passed
    assert launch.hidden == {"WANDB_API_KEY", "HOST_VAR", "TASK_VAR", "CLI_VAR", "HF_TOKEN", "A_TOKEN"}
    shown = launch.shown_env()
    assert all(shown[k] == MASK for k in launch.hidden) and shown["DATA"] == "/cli"
    assert shown["TF_CONFIG"] == launch.env["TF_CONFIG"]


def test_a_value_given_later_replaces_a_by_name_one_and_is_shown():
    (launch,) = _plan(CLUSTER, {"WANDB_API_KEY": "w", "HOST_VAR": "h"}, {"TASK_VAR": "given"}).launches
    assert launch.env["TASK_VAR"] == "given" and "TASK_VAR" not in launch.hidden


@pytest.mark.parametrize("missing, where", [("WANDB_API_KEY", "c.yaml: env.WANDB_API_KEY: "),
                                            ("HOST_VAR", "c.yaml: hosts.localhost.env.HOST_VAR: "),
                                            ("TASK_VAR", "c.yaml: worker[0].env.TASK_VAR: ")])
def test_a_by_name_variable_missing_from_tflaunchs_environment_is_named(missing, where):
    environ = {k: "x" for k in ("WANDB_API_KEY", "HOST_VAR", "TASK_VAR") if k != missing}
    spec = parse_cluster(CLUSTER, "c.yaml", LOCAL)
    for check in (lambda: check_launch_input(spec, {}, None, environ), lambda: _plan(CLUSTER, environ)):
        with pytest.raises(ConfigError) as error:
            check()
        assert str(error.value).startswith(where) and "is passed by name" in str(error.value)
        assert f"has no {missing}" in str(error.value)


def test_check_launch_input():
    spec = parse_cluster(CLUSTER, "c.yaml", LOCAL)
    environ = {"WANDB_API_KEY": "w", "HOST_VAR": "h", "TASK_VAR": "t"}
    check_launch_input(spec, {"DATA": "x"}, ["python", "t.py"], environ)
    check_launch_input(spec, {"TASK_VAR": "given"}, None, {"WANDB_API_KEY": "w", "HOST_VAR": "h"})  # --env wins
    check_launch_input(spec, {"CLI_VAR": None}, None, None)  # an export looks nothing up
    with pytest.raises(ConfigError, match=r"^--env: CLI_VAR: is passed by name"):
        check_launch_input(spec, {"CLI_VAR": None}, None, environ)
    bad = {**environ, "WANDB_API_KEY": b"s3cr3t\xfe".decode("utf-8", "surrogateescape")}
    with pytest.raises(ConfigError) as error:
        check_launch_input(spec, {}, None, bad)
    assert str(error.value) == ("c.yaml: env.WANDB_API_KEY: its value in tflaunch's environment is not valid UTF-8 "
                                "(byte 0xfe at position 6); expected UTF-8 text without NUL bytes")
    with pytest.raises(ConfigError, match=r"^--env: USER_X: contains a NUL byte at position 1;"):
        check_launch_input(spec, {"USER_X": "a\0b"}, None, environ)
    with pytest.raises(ConfigError, match=r"^command: argument 2: contains a NUL byte at position 0;"):
        check_launch_input(spec, {}, ["python", "\0"], environ)


def test_cluster_file_strings_with_a_nul_are_refused_where_they_are():
    cases = {'worker: [{host: localhost, port: 2222, env: {USER_X: "a\\0b"}}]': "worker[0].env.USER_X",
             'command: [python, "-c", "\\0"]\nworker: [localhost:2222]': "command[2]",
             'setup: "x\\0"\nworker: [localhost:2222]': "setup",
             'worker: [localhost:2222]\nenv: {"A\\0": x}': "env key"}
    for text, key in cases.items():
        with pytest.raises(ConfigError) as error:
            parse_cluster(text, "c.yaml", LOCAL)
        assert str(error.value).startswith(f"c.yaml: {key}") and "NUL byte" in str(error.value), str(error.value)


def test_cluster_text_that_no_file_can_hold_is_refused_in_one_line():
    # A lone surrogate reaches parse_cluster only from the Python API (a file is read as strict UTF-8);
    # the YAML reader cannot encode it, and the walk of a text without escapes is skipped.
    with pytest.raises(ConfigError) as error:
        parse_cluster('worker: [{host: localhost, port: 2222, env: {A: "x\udcff"}}]', "c.yaml", LOCAL)
    assert str(error.value) == ("c.yaml: is not valid UTF-8 (byte 0xff at position 50); "
                                "expected UTF-8 text without NUL bytes"), str(error.value)


def test_cluster_file_strings_are_checked_only_where_an_escape_can_make_a_bad_one():
    # A text without a backslash holds no escape: its strings are all fine, and a text with one is
    # walked, also where the escape makes nothing wrong.
    assert parse_cluster("worker: [{host: localhost, port: 2222, env: {A: x}}]", "c.yaml", LOCAL).tasks[0].env == {"A": "x"}
    assert parse_cluster('worker: [{host: localhost, port: 2222, env: {A: "x\\ty"}}]', "c.yaml",
                         LOCAL).tasks[0].env == {"A": "x\ty"}
    with pytest.raises(ConfigError, match=r"^c.yaml: worker\[1\].env.B: contains a NUL byte at position 1;"):
        parse_cluster('worker: [{host: localhost, port: 2222}, {host: localhost, port: 2223, env: {B: "y\\0"}}]',
                      "c.yaml", LOCAL)


# -- exports --------------------------------------------------------------------------------


def _container_env(document) -> list[dict]:
    found = []
    if isinstance(document, dict):
        for key, value in document.items():
            if key == "env" and isinstance(value, list):
                found += value
            else:
                found += _container_env(value)
    elif isinstance(document, list):
        for item in document:
            found += _container_env(item)
    return found


def test_every_export_refers_to_hidden_values_and_stays_valid(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "export"))  # run alone, too
    from test_export_schema import check_document

    inline = _value("inline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # an export never reads a value passed by name
    env = {"WANDB_API_KEY": None, "HF_TOKEN": inline, "USER_PLAIN": "shown"}
    for fmt in FORMATS:
        options = {} if fmt == "sh" else {"image": "registry.example/train:1", "namespace": "ml"}
        result = export(ExportRequest(LocalSource(2, chief=True), format=fmt, name="mnist", env=env, **options))
        assert_nowhere([inline], result.text, *result.notes)
        if fmt == "sh":
            commands = [line for line in result.text.splitlines() if line.startswith("cd -- ")]
            assert len(commands) == 3
            assert all('WANDB_API_KEY="$WANDB_API_KEY"' in c and 'HF_TOKEN="$HF_TOKEN"' in c
                       and "USER_PLAIN=shown" in c for c in commands)
            assert any("secret: HF_TOKEN, WANDB_API_KEY" in note for note in result.notes)
            continue
        documents = [d for d in yaml.safe_load_all(result.text) if d is not None]
        for document in documents:
            check_document(document)
        variables = _container_env(documents)
        for name in ("WANDB_API_KEY", "HF_TOKEN"):
            refs = [v for v in variables if v["name"] == name]
            assert refs and all(v == {"name": name, "valueFrom": {"secretKeyRef": {"name": "mnist-env", "key": name}}}
                                for v in refs), refs
        assert {v.get("value") for v in variables if v["name"] == "USER_PLAIN"} == {"shown"}
        create = ("kubectl create secret generic mnist-env --namespace ml --from-literal=HF_TOKEN=... "
                  "--from-literal=WANDB_API_KEY=...")
        assert create in result.text.splitlines()[1] and any(create in note for note in result.notes)


def test_a_role_whose_tasks_differ_in_a_secret_is_refused_without_showing_it():
    values = [_value("a"), _value("b")]
    text = (f"worker: [{{host: localhost, port: 1, env: {{HF_TOKEN: {values[0]}}}}}, "
            f"{{host: localhost, port: 2, env: {{HF_TOKEN: {values[1]}}}}}]\n")
    from launcher.sources.choose import ClusterMappingSource

    with pytest.raises(ConfigError) as error:
        export(ExportRequest(ClusterMappingSource(yaml.safe_load(text)), format="jobset", image="i"))
    assert "HF_TOKEN is hidden" in str(error.value)
    assert_nowhere(values, str(error.value))


# -- refused at check time -------------------------------------------------------------------


@pytest.mark.parametrize("args, environ, expected", [
    (["--local", "1", "--dry-run", "--", "python", "-c", b"print(1)\xff"], None,
     "command: argument 3: is not valid UTF-8 (byte 0xff at position 8)"),
    (["--local", "1", "--dry-run", b"--env", b"USER_X=a\xffb", "--", "true"], None,
     "--env: USER_X: is not valid UTF-8 (byte 0xff at position 1)"),
    (["--local", "1", "--dry-run", "--env", "USER_X", "--", "true"], {b"USER_X": b"s3\xfe"},
     "--env: USER_X: its value in tflaunch's environment is not valid UTF-8 (byte 0xfe at position 2)"),
    (["export", "--format", "sh", "--local", "1", b"-e", b"USER_X=\xff"], None, "--env: USER_X: is not valid UTF-8"),
    (["export", "--local", "1", "--image", "i", "--", "python", b"\xc3"], None, "command: argument 2: is not valid"),
])
def test_text_no_process_could_receive_is_refused_by_dry_run(tmp_path, args, environ, expected):
    env = {**os.environb, b"PYTHONPATH": str(ROOT).encode(), **(environ or {})}
    done = subprocess.run(tflaunch_argv(*args), capture_output=True, env=env, cwd=tmp_path, timeout=60,
                          stdin=subprocess.DEVNULL)
    one_error_line(done, expected)
    assert not (tmp_path / "logs").exists()


def test_a_nul_in_a_cluster_file_is_refused_by_dry_run(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text('worker: [localhost:auto]\nenv: {USER_X: "a\\0b"}\n')
    done = run_tflaunch(str(cluster), "--dry-run", cwd=tmp_path)
    one_error_line(done, f"{cluster}: env.USER_X: contains a NUL byte at position 1")


def test_a_missing_by_name_variable_is_one_line_and_nothing_starts(tmp_path):
    name = f"NOT_SET_{secrets.token_hex(4).upper()}"
    done = run_tflaunch("--local", "1", "--log-dir", str(tmp_path / "logs"), "--env", name, "--", "true", cwd=tmp_path)
    one_error_line(done, f"--env: {name}: is passed by name", f"has no {name}")
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"worker: [localhost:auto]\nenv:\n  {name}:\n")
    for extra in ((), ("--dry-run",)):
        done = run_tflaunch(str(cluster), "--log-dir", str(tmp_path / "logs"), *extra, "--", "true", cwd=tmp_path)
        one_error_line(done, f"{cluster}: env.{name}: is passed by name")
    assert not (tmp_path / "logs").exists()


# -- real runs --------------------------------------------------------------------------------


class Run:
    """tflaunch started in the background with its console in files, for a look while it runs."""

    def __init__(self, tmp_path: Path, args: list[str], env: dict[str, str]):
        self.out, self.err = tmp_path / "console.out", tmp_path / "console.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(tflaunch_argv(*args), cwd=tmp_path, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    def console(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")


def merged(log_dir: Path) -> str:
    runs = sorted(log_dir.glob("*/merged.log")) if log_dir.exists() else []
    return runs[-1].read_text(errors="replace") if runs else ""


def check_hashes(text: str, tasks: list[str], values: dict[str, str]) -> None:
    seen = hashes(text)
    assert seen == {(task, name): _digest(value) for task in tasks for name, value in values.items()}, seen


def check_record(run_dir: Path, hidden: list[str], plain: dict[str, str]) -> dict:
    record = json.loads((run_dir / "run.json").read_text())
    for task in record["tasks"]:
        assert all(task["env"][name] == MASK for name in hidden), task["env"]
        assert all(task["env"][name] == value for name, value in plain.items()), task["env"]
    return record


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_local_run_passes_values_by_name_and_masks_secret_names(tmp_path):
    by_name, by_name_2, inline, inline_2 = _value("wandb"), _value("url"), _value("hf"), _value("db")
    release = tmp_path / f"release-{secrets.token_hex(4)}"
    values = {"WANDB_API_KEY": by_name, "DATASET_URL": by_name_2, "HF_TOKEN": inline, "DB_PASSWORD": inline_2}
    env_options = ["--env", "WANDB_API_KEY", "-e", "DATASET_URL", "-e", f"HF_TOKEN={inline}",
                   f"--env=DB_PASSWORD={inline_2}", "--env", "USER_PLAIN=shown"]
    command = ["--", "python", SECRET_TASK, ",".join(values), str(release)]
    environ = {"WANDB_API_KEY": by_name, "DATASET_URL": by_name_2}
    log_dir = tmp_path / "logs"
    run = Run(tmp_path, ["--local", "2", "--log-dir", str(log_dir), *env_options, *command], environ)
    try:
        wait_for(lambda: len(hashes(merged(log_dir))) == 8, timeout=90, message=lambda: run.console()[-2000:])
        tflaunch_pid = run.proc.pid
        agent = [p.pid for p in psutil.Process(tflaunch_pid).children()]
        # The inline values are on tflaunch's own command line, where the user put them; the by-name ones are nowhere.
        assert_on_no_command_line([by_name, by_name_2], {
            "tflaunch": lambda pid, line: pid == tflaunch_pid,
            "agent": lambda pid, line: pid in agent and b"-I\0-S\0-c" in line,
            "task": lambda pid, line: str(release).encode() in line and b"launcher" not in line})
    finally:
        release.touch()
        code = run.wait()
    assert code == 0, run.console()[-3000:]
    (run_dir,) = log_dir.iterdir()
    check_hashes(merged(log_dir), ["worker-0", "worker-1"], values)
    record = check_record(run_dir, list(values), {"USER_PLAIN": "shown"})
    argv = record["launcher"]["argv"]
    assert argv[argv.index("--env") + 1] == "WANDB_API_KEY" and "USER_PLAIN=shown" in argv
    assert {"-e", f"HF_TOKEN={MASK}", f"--env=DB_PASSWORD={MASK}"} <= set(argv), argv
    secret_values = list(values.values())
    assert files_holding(tmp_path, secret_values) == []  # run folder, console files: nothing holds a value
    assert_nowhere(secret_values, run.console())

    dry = run_tflaunch("--local", "2", "--dry-run", *env_options, *command, env=environ, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    shown = dry.stdout.decode() + dry.stderr.decode()
    assert_nowhere(secret_values, shown)
    assert all(f"env: {name}='{MASK}'" in shown for name in values) and "env: USER_PLAIN=shown" in shown
    for fmt in FORMATS:
        image = [] if fmt == "sh" else ["--image", "registry.example/train:1"]
        done = run_tflaunch("export", "--format", fmt, "--local", "2", *image, *env_options, *command,
                            env=environ, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert_nowhere(secret_values, done.stdout.decode(), done.stderr.decode())
        assert "USER_PLAIN" in done.stdout.decode()


@pytest.mark.slow
def test_the_python_api_passes_a_value_by_name(tmp_path, monkeypatch):
    from launcher import launch

    by_name, inline = _value("wandb"), _value("hf")
    monkeypatch.setenv("WANDB_API_KEY", by_name)
    release = tmp_path / "release"
    release.touch()
    output = io.StringIO()
    result = launch(local=2, command=["python", SECRET_TASK, "WANDB_API_KEY,HF_TOKEN", str(release)],
                    env={"WANDB_API_KEY": None, "HF_TOKEN": inline, "USER_PLAIN": "shown"},
                    log_dir=tmp_path / "logs", output=output)
    assert result.exit_code == 0, output.getvalue()[-2000:]
    check_hashes(merged(tmp_path / "logs"), ["worker-0", "worker-1"], {"WANDB_API_KEY": by_name, "HF_TOKEN": inline})
    check_record(result.run_dir, ["WANDB_API_KEY", "HF_TOKEN"], {"USER_PLAIN": "shown"})
    assert files_holding(result.run_dir, [by_name, inline]) == []
    assert_nowhere([by_name, inline], output.getvalue())
    monkeypatch.delenv("WANDB_API_KEY")
    with pytest.raises(ConfigError, match=r"^env: WANDB_API_KEY: is passed by name") as error:
        launch(local=1, command=["true"], env={"WANDB_API_KEY": None}, log_dir=tmp_path / "other")
    assert error.value.exit_code == 2 and not (tmp_path / "other").exists()
    with pytest.raises(ConfigError, match=r"^env: USER_X: contains a NUL byte"):
        launch(local=1, command=["true"], env={"USER_X": "a\0b"}, log_dir=tmp_path / "other")


@pytest.mark.slow
@pytest.mark.ssh
@pytest.mark.timeout(240)
def test_tasks_over_ssh_get_values_by_name_through_the_agent(testhosts, tmp_path):
    by_name, by_name_2, inline = _value("wandb"), _value("url"), _value("hf")
    node1, node2 = testhosts.hosts[:2]
    release = tmp_path / f"release-{secrets.token_hex(4)}"
    values = {"WANDB_API_KEY": by_name, "DATASET_URL": by_name_2, "HF_TOKEN": inline}
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"ssh:\n  options: {json.dumps(testhosts.ssh_options)}\n  connect_timeout: 3\n"
                       f"env:\n  WANDB_API_KEY:\n  HF_TOKEN: {inline}\n  USER_PLAIN: shown\n"
                       "worker:\n"
                       f"  - {{host: node1, address: {node1.address}, port: auto}}\n"
                       f"  - {{host: node2, address: {node2.address}, port: auto}}\n")
    args = [str(cluster), "--env", "DATASET_URL", "--", "python", SECRET_TASK, ",".join(values), str(release)]
    environ = {"WANDB_API_KEY": by_name, "DATASET_URL": by_name_2}
    log_dir = tmp_path / "logs"
    run = Run(tmp_path, [*args[:1], "--log-dir", str(log_dir), *args[1:]], environ)
    try:
        wait_for(lambda: len(hashes(merged(log_dir))) == 6, timeout=120, message=lambda: run.console()[-2000:])
        on_hosts = {pid for host in ("node1", "node2") for pid in testhosts.pids(host)}
        tflaunch_pid = run.proc.pid
        assert_on_no_command_line([by_name, by_name_2, inline], {
            "tflaunch": lambda pid, line: pid == tflaunch_pid,
            "ssh client": lambda pid, line: line.startswith(b"ssh\0") and b"node1" in line,
            "remote agent": lambda pid, line: pid in on_hosts and b"-I\0-S\0-c" in line,
            "remote task": lambda pid, line: pid in on_hosts and str(release).encode() in line})
    finally:
        release.touch()
        code = run.wait()
    assert code == 0, run.console()[-3000:]
    check_hashes(merged(log_dir), ["worker-0", "worker-1"], values)
    (run_dir,) = log_dir.iterdir()
    record = check_record(run_dir, list(values), {"USER_PLAIN": "shown"})
    assert {t["host"] for t in record["tasks"]} == {"node1", "node2"}
    assert files_holding(log_dir, list(values.values())) == []
    assert_nowhere(list(values.values()), run.console())
    dry = run_tflaunch(*args[:1], "--dry-run", *args[1:], env=environ, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert_nowhere(list(values.values()), dry.stdout.decode(), dry.stderr.decode())
    assert f"env: WANDB_API_KEY='{MASK}'" in dry.stdout.decode()


def test_submit_writes_a_by_name_variable_as_its_name_and_refuses_what_would_write_a_secret(tmp_path):
    by_name = _value("wandb")
    environ = {"WANDB_API_KEY": by_name}
    dry = run_tflaunch("submit", "--nodes", "2", "-e", "WANDB_API_KEY", "--env", "USER_PLAIN=shown", "--dry-run",
                       env=environ, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    script = dry.stdout.decode()
    exec_line = next(line for line in script.splitlines() if line.startswith("exec "))
    assert exec_line.endswith("--env WANDB_API_KEY --env USER_PLAIN=shown"), exec_line
    assert_nowhere([by_name], script, dry.stderr.decode())
    # A by-name variable this environment lacks, or that sbatch's --export keeps from the job.
    missing = run_tflaunch("submit", "--nodes", "1", "-e", "NOT_SET_ANYWHERE_7", "--dry-run", cwd=tmp_path)
    one_error_line(missing, "submit: --env NOT_SET_ANYWHERE_7: is passed by name", "export NOT_SET_ANYWHERE_7=")
    for given in (["--sbatch-option=--export=NONE"], ["--sbatch-option=--export=PATH,HOME"]):
        refused = run_tflaunch("submit", "--nodes", "1", "-e", "WANDB_API_KEY", *given, "--dry-run",
                               env=environ, cwd=tmp_path)
        one_error_line(refused, "submit: --env WANDB_API_KEY: is passed by name, but --export=", "keeps WANDB_API_KEY")
    refused = run_tflaunch("submit", "--nodes", "1", "-e", "WANDB_API_KEY", "--dry-run",
                           env={**environ, "SBATCH_EXPORT": "NONE"}, cwd=tmp_path)
    one_error_line(refused, "but SBATCH_EXPORT=NONE keeps WANDB_API_KEY from the job")
    allowed = run_tflaunch("submit", "--nodes", "1", "-e", "WANDB_API_KEY",
                           "--sbatch-option=--export=PATH,WANDB_API_KEY", "--dry-run", env=environ, cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    # A value typed for a secret's name would be written into job.sbatch: refused, the value in no message.
    inline = _value("hf")
    refused = run_tflaunch("submit", "--nodes", "1", "-e", f"HF_TOKEN={inline}", "--dry-run", cwd=tmp_path)
    line = one_error_line(refused, "submit: --env HF_TOKEN: its name marks a secret", "pass it by name: --env HF_TOKEN")
    assert inline not in line and list(tmp_path.rglob("job.sbatch")) == []


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_submit_env_by_name_reaches_the_slurm_tasks_and_no_file(slurm, tmp_path):
    by_name = _value("wandb")
    release = tmp_path / f"release-{secrets.token_hex(4)}"
    args = ["submit", "--nodes", "2", "-e", "WANDB_API_KEY", "-e", "USER_PLAIN=shown", "--log-dir",
            str(tmp_path / "logs"), "--", "python", SECRET_TASK, "WANDB_API_KEY,USER_PLAIN", str(release)]
    env = {**slurm.env, "PYTHONPATH": str(ROOT), "WANDB_API_KEY": by_name}
    done, run_dir = submitted_job(args, env, tmp_path, release)
    slurm.wait_idle(timeout=60)
    record = check_record(run_dir, ["WANDB_API_KEY"], {"USER_PLAIN": "shown"})
    assert record["status"] == "succeeded", record
    check_hashes(merged(run_dir.parent), ["worker-0", "worker-1"], {"WANDB_API_KEY": by_name, "USER_PLAIN": "shown"})
    assert "--env WANDB_API_KEY --env USER_PLAIN=shown" in (run_dir / "job.sbatch").read_text()
    assert files_holding(run_dir, [by_name]) == []
    assert_nowhere([by_name], done.stdout, done.stderr)


def submitted_job(args: list[str], env: dict, cwd: Path, release: Path,
                  while_up=lambda run_dir: None) -> tuple[subprocess.CompletedProcess, Path]:
    """``tflaunch submit`` with ``args`` (two secret_task.py tasks each printing two hashes), then its job
    to the end: ``while_up(run_dir)`` runs once every hash is printed, before ``release`` lets the tasks end."""
    done = subprocess.run(tflaunch_argv(*args), capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    run_dir = Path(done.stdout.rsplit("run folder ", 1)[1].strip())
    try:
        wait_for(lambda: len(hashes(merged(run_dir.parent))) == 4, timeout=180,
                 message=lambda: "; ".join(p.read_text()[-1500:] for p in run_dir.glob("slurm-*.out")))
        while_up(run_dir)
    finally:
        release.touch()
    wait_for(lambda: json.loads((run_dir / "run.json").read_text()).get("status") in ("succeeded", "failed", "stopped"),
             timeout=120, message=f"the end of the job of {run_dir}")
    return done, run_dir


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_a_slurm_job_gets_values_by_name_and_writes_none(slurm, tmp_path):
    by_name, inline = _value("wandb"), _value("hf")
    release = tmp_path / f"release-{secrets.token_hex(4)}"
    values = {"WANDB_API_KEY": by_name, "HF_TOKEN": inline}
    cluster = tmp_path / "slurm.yaml"
    cluster.write_text(f"slurm:\n  nodes: 2\nenv:\n  WANDB_API_KEY:\n  HF_TOKEN: {inline}\n  USER_PLAIN: shown\n")
    args = ["submit", str(cluster), "--log-dir", str(tmp_path / "logs"), "--",
            "python", SECRET_TASK, ",".join(values), str(release)]
    # sbatch hands the job the environment it was called with (--export=ALL): the value travels there.
    env = {**slurm.env, "PYTHONPATH": str(ROOT), "WANDB_API_KEY": by_name}

    def on_no_command_line(run_dir: Path) -> None:
        on_nodes = {pid for node in slurm.nodes for pid in slurm.pids(node)}
        assert_on_no_command_line([by_name], {
            "tflaunch in the job": lambda pid, line: b"--slurm" in line and str(run_dir).encode() in line,
            "srun": lambda pid, line: line.startswith(b"srun\0") and b"tflaunch-agents" in line,
            "agent on a node": lambda pid, line: pid in on_nodes and b"-I\0-S\0-c" in line,
            "task on a node": lambda pid, line: pid in on_nodes and str(release).encode() in line})

    done, run_dir = submitted_job(args, env, tmp_path, release, while_up=on_no_command_line)
    slurm.wait_idle(timeout=60)
    record = check_record(run_dir, list(values), {"USER_PLAIN": "shown"})
    assert record["status"] == "succeeded", record
    assert sorted(t["host"] for t in record["tasks"]) == slurm.nodes
    check_hashes(merged(run_dir.parent), ["worker-0", "worker-1"], values)
    assert (run_dir / "job.sbatch").exists() and list(run_dir.glob("slurm-*.out"))
    assert files_holding(run_dir, list(values.values())) == []
    assert_nowhere(list(values.values()), done.stdout, done.stderr)
    dry = run_tflaunch("submit", str(cluster), "--dry-run", env=env, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert_nowhere(list(values.values()), dry.stdout.decode(), dry.stderr.decode())
