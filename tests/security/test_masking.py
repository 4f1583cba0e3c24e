"""The masking rule beyond variables' names: data source names and access tokens, URL passwords,
secret options and assignments in commands and ``setup`` lines, and error messages; and that a run,
a dry run and the Python API show and record none of them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, TASK
from launcher.cluster.reader import parse_cluster
from launcher.cluster.spec import masked_env
from launcher.errors import ConfigError, LaunchError
from launcher.masking import MASK, is_secret_name, masked_argv, masked_text
from test_secrets import _value, assert_nowhere, files_holding, one_error_line, run_tflaunch


@pytest.mark.unit
@pytest.mark.parametrize("name", ["SENTRY_DSN", "database_dsn", "DSN", "GITHUB_PAT", "PAT", "gitlab_pat"])
def test_data_source_names_and_access_tokens_mark_a_secret(name):
    assert is_secret_name(name)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["DSN_HOST", "PATTERN", "COMPAT", "PATH", "MY_DSNX", "PATIENCE"])
def test_names_that_only_hold_dsn_or_pat_are_ordinary(name):
    assert not is_secret_name(name)


@pytest.mark.unit
def test_a_urls_password_is_masked_in_every_word_and_every_value():
    argv = ["tflaunch", "--env", "DB_URL=postgres://app:pw1@db:5432/x", "--", "python", "t.py",
            "--source", "https://user:pw2@example.com/data", "--mirror=s3://k:pw3@host/b", "ssh://git@host/repo"]
    assert masked_argv(argv) == [
        "tflaunch", "--env", f"DB_URL=postgres://app:{MASK}@db:5432/x", "--", "python", "t.py",
        "--source", f"https://user:{MASK}@example.com/data", f"--mirror=s3://k:{MASK}@host/b", "ssh://git@host/repo"]
    env = {"DB_URL": "postgresql://u:secret@h/db", "PLAIN": "http://example.com/a:b@c", "HF_TOKEN": "t"}
    assert masked_env(env, ()) == {"DB_URL": f"postgresql://u:{MASK}@h/db", "PLAIN": "http://example.com/a:b@c",
                                   "HF_TOKEN": MASK}


@pytest.mark.unit
def test_secret_options_of_a_command_are_masked_and_others_are_not():
    argv = ["python", "train.py", "--api-key", "k1", "--hf-token=k2", "--password", "--epochs", "3",
            "GITHUB_PAT=k3", "--use-token", "-v"]
    assert masked_argv(argv) == ["python", "train.py", "--api-key", MASK, f"--hf-token={MASK}", "--password",
                                 "--epochs", "3", f"GITHUB_PAT={MASK}", "--use-token", "-v"]


@pytest.mark.unit
def test_a_setup_line_is_shown_with_its_secrets_masked():
    line = ("source /opt/venv/bin/activate && export HF_TOKEN=hf1 WANDB_API_KEY='w 2' DATA=/d; "
            'SENTRY_DSN="https://k@s.io/1" run; pip download --index-url https://u:pw@pypi.example/simple x')
    assert masked_text(line) == (
        f"source /opt/venv/bin/activate && export HF_TOKEN={MASK} WANDB_API_KEY={MASK} DATA=/d; "
        f"SENTRY_DSN={MASK} run; pip download --index-url https://u:{MASK}@pypi.example/simple x")


@pytest.mark.unit
@pytest.mark.parametrize("text", [
    "worker: [localhost:auto]\nenv: 'HF_TOKEN={v}'\n",
    "worker: [localhost:auto]\nenv:\n  HF_TOKEN: 2024-01-{d}\n",
    "worker: [localhost:auto]\nthreads: 'DB_PASSWORD={v}'\n",
    "worker: [localhost:auto]\ncommand: {{url: 'https://u:{v}@h/'}}\n",
])
def test_a_cluster_files_errors_never_repeat_a_secret(text):
    value, day = _value("s"), "17"
    with pytest.raises(ConfigError) as error:
        parse_cluster(text.format(v=value, d=day), "c.yaml", frozenset({"localhost"}))
    assert value not in str(error.value) and "2024-01-17" not in str(error.value), str(error.value)


@pytest.mark.unit
def test_the_python_apis_errors_never_repeat_a_secret():
    from launcher import launch

    value = _value("s")
    for kwargs in ({"env": f"HF_TOKEN={value}"}, {"command": 7, "env": {"A": "b"}, "log_dir": 3},
                   {"command": [f"https://u:{value}@h", 3]}):
        with pytest.raises(LaunchError) as error:
            launch(local=1, **kwargs)
        assert value not in str(error.value), str(error.value)


def test_a_dry_run_shows_setup_and_command_with_their_secrets_masked(tmp_path):
    token, password, key = _value("hf"), _value("pw"), _value("key")
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"worker: [localhost:auto, localhost:auto]\n"
                       f"setup: 'export HF_TOKEN={token} && export DB_URL=postgres://u:{password}@h/d'\n")
    done = run_tflaunch(str(cluster), "--dry-run", "--", "python", "t.py", "--api-key", key, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert f"setup:   export HF_TOKEN={MASK} && export DB_URL=postgres://u:{MASK}@h/d" in out, out
    assert f" t.py --api-key '{MASK}'" in out, out
    assert_nowhere([token, password, key], out, done.stderr.decode())


# A program that calls the Python API, given secrets on its own command line.
API_CALLER = '''
import sys
from launcher import launch
result = launch(local=1, command=[sys.executable, {task!r}, "print:ok"], log_dir=sys.argv[1])
print("RUN", result.run_dir, result.exit_code)
'''


@pytest.mark.slow
def test_a_run_and_the_python_api_record_no_secret_of_a_command_line(tmp_path):
    key, password, pat, caller_token = _value("key"), _value("pw"), _value("pat"), _value("tok")
    done = run_tflaunch("--local", "1", "--log-dir", str(tmp_path / "logs"), "--env",
                        f"DB_URL=postgres://u:{password}@h/d", "--env", f"GITHUB_PAT={pat}",
                        "--", "python", "-c", "print('ok')", f"--api-key={key}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["launcher"]["argv"][-1] == f"--api-key={MASK}"
    assert record["tasks"][0]["argv"][-1] == f"--api-key={MASK}"
    assert record["tasks"][0]["env"]["DB_URL"] == f"postgres://u:{MASK}@h/d"
    assert files_holding(run_dir, [key, password, pat]) == []
    assert_nowhere([key, password, pat], done.stdout.decode(), done.stderr.decode())

    script = tmp_path / "caller.py"
    script.write_text(API_CALLER.format(task=TASK))
    called = subprocess.run([sys.executable, str(script), str(tmp_path / "api"), "--hf-token", caller_token,
                             f"https://u:{password}@h/"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert " 0" in called.stdout, called.stderr
    (api_dir,) = (tmp_path / "api").iterdir()
    argv = json.loads((api_dir / "run.json").read_text())["launcher"]["argv"]
    assert argv == ["caller.py", str(tmp_path / "api"), "--hf-token", MASK, f"https://u:{MASK}@h/"]
    assert files_holding(api_dir, [caller_token, password]) == []


def environ_of(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []  # gone meanwhile


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("by", ["setup", "name"])
def test_a_slurm_run_leaves_its_token_in_no_environment_and_its_setup_on_no_command_line(slurm, tmp_path, by):
    """HF_TOKEN comes from the host's setup line, or by name from tflaunch's environment (no setup)."""
    from test_secrets import SECRET_TASK, assert_on_no_command_line, hashes, merged, submitted_job

    cluster, token = tmp_path / "slurm.yaml", _value("hf")
    cluster.write_text("slurm:\n  nodes: 2\n" + (f"setup: export HF_TOKEN={token}\n" if by == "setup" else
                                                   "env:\n  HF_TOKEN:\n"))
    release = tmp_path / "release"
    args = ["submit", str(cluster), "--log-dir", str(tmp_path / "logs"), "--",
            "python", SECRET_TASK, "HF_TOKEN,TFLAUNCH_SETUP", str(release)]
    env = {**slurm.env, "PYTHONPATH": str(ROOT), **({"HF_TOKEN": token} if by == "name" else {})}

    def while_up(run_dir: Path) -> None:
        on_nodes = {pid for node in slurm.nodes for pid in slurm.pids(node)}
        assert_on_no_command_line([token], {
            "srun": lambda pid, line: line.startswith(b"srun\0") and b"tflaunch-agents" in line,
            "agent on a node": lambda pid, line: pid in on_nodes and b"-I\0-S\0-c" in line})
        holders = {pid: [v[:40] for v in environ_of(pid) if v.startswith(b"TFLAUNCH_AGENT_TOKEN=")]
                   for pid in map(int, filter(str.isdigit, os.listdir("/proc")))}
        assert not {pid: found for pid, found in holders.items() if found}, "a token in a process's environment"
        # srun itself holds it (the step's environment): each node's shell takes it out before the agent starts.
        setup_in = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in on_nodes
                    if any(v.startswith(b"TFLAUNCH_SETUP=") for v in environ_of(pid))}
        assert all(line.startswith(b"srun\0") for line in setup_in.values()), setup_in

    done, run_dir = submitted_job(args, env, tmp_path, release, while_up=while_up)
    slurm.wait_idle(timeout=60)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded", record
    seen = hashes(merged(run_dir.parent))
    for task in ("worker-0", "worker-1"):  # the value arrived, and no setup line was left to the tasks
        assert seen[(task, "HF_TOKEN")] == hashlib.sha256(token.encode()).hexdigest(), seen
        assert seen[(task, "TFLAUNCH_SETUP")] == "unset", seen
    assert files_holding(run_dir, [token]) == []


@pytest.mark.slow
@pytest.mark.ssh
@pytest.mark.timeout(240)
def test_an_ssh_hosts_setup_line_is_on_no_command_line(testhosts, tmp_path):
    """The cluster's setup line is each host's; worker-2, node2's second task, has a setup of its own."""
    from polling import wait_for
    from test_secrets import SECRET_TASK, Run, assert_on_no_command_line, hashes, merged

    token, own = _value("hf"), _value("own")
    node1, node2 = testhosts.hosts[:2]
    release, log_dir = tmp_path / "release", tmp_path / "logs"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"ssh:\n  options: {json.dumps(testhosts.ssh_options)}\n  connect_timeout: 3\n"
                       f"setup: |\n  echo setting up\n  export HF_TOKEN={token}\n"
                       "worker:\n"
                       f"  - {{host: node1, address: {node1.address}, port: auto}}\n"
                       f"  - {{host: node2, address: {node2.address}, port: auto}}\n"
                       f"  - {{host: node2, address: {node2.address}, port: auto, setup: 'export HF_TOKEN={own}'}}\n")
    run = Run(tmp_path, [str(cluster), "--log-dir", str(log_dir), "--", "python", SECRET_TASK,
                         "HF_TOKEN,TFLAUNCH_SETUP", str(release)], {})
    try:
        wait_for(lambda: len(hashes(merged(log_dir))) == 6, timeout=120, message=lambda: run.console()[-2000:])
        on_hosts = {pid for host in ("node1", "node2") for pid in testhosts.pids(host)}
        assert_on_no_command_line([token, own], {
            "ssh client": lambda pid, line: line.startswith(b"ssh\0") and b"node1" in line,
            "remote agent": lambda pid, line: pid in on_hosts and b"-I\0-S\0-c" in line})
    finally:
        release.touch()
        code = run.wait()
    assert code == 0, run.console()[-3000:]
    digest = {value: hashlib.sha256(value.encode()).hexdigest() for value in (token, own)}
    seen = hashes(merged(log_dir))
    assert {task: seen[(task, "HF_TOKEN")] for task in ("worker-0", "worker-1", "worker-2")} == {
        "worker-0": digest[token], "worker-1": digest[token], "worker-2": digest[own]}
    assert {seen[(task, "TFLAUNCH_SETUP")] for task in ("worker-0", "worker-1", "worker-2")} == {"unset"}
    assert "setting up" in merged(log_dir)  # the setup's output still reaches each task's log


@pytest.mark.unit
def test_a_tasks_own_setup_line_travels_in_its_environment_not_its_command_line():
    from launcher.cluster.plan import TaskLaunch
    from launcher.transports.shipping import SETUP_VARIABLE, task_fields

    launch = TaskLaunch(name="worker-1", role="worker", index=1, host="h", address="h:2222", local=False,
                        argv=("python", "t.py"), env={"A": "b"}, workdir="/w", setup="export HF_TOKEN=t0k")
    fields = task_fields(launch, grace=5, host_setup="source /opt/env.sh")
    assert not any("t0k" in word for word in fields["argv"]) and fields["argv"][-2:] == ["python", "t.py"]
    assert fields["env"] == {"A": "b", SETUP_VARIABLE: "export HF_TOKEN=t0k"}
    assert task_fields(launch, grace=5, host_setup="export HF_TOKEN=t0k")["argv"] == ["python", "t.py"]


def test_the_hint_for_a_misplaced_command_masks_its_secrets(tmp_path):
    key = _value("key")
    done = run_tflaunch("--local", "1", "python", "t.py", f"--api-key={key}", cwd=tmp_path)
    one_error_line(done, "the task command goes after '--'", f"--api-key={MASK}")
    assert key not in done.stderr.decode()


@pytest.mark.unit
@pytest.mark.parametrize("name", ["KAGGLE_KEY", "openai_key", "KEY", "MY_APP_SECRET", "SLACK_TOKEN", "DB_PASSWORD",
                                  "SENTRY_DSN", "GITHUB_PAT"])
def test_names_ending_as_keys_secrets_tokens_passwords_dsns_and_pats_mark_a_secret(name):
    assert is_secret_name(name)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["MONKEY", "KEYBOARD_LAYOUT", "HOCKEY_TEAM", "KEYS_DIR"])
def test_names_that_only_hold_key_are_ordinary(name):
    assert not is_secret_name(name)


@pytest.mark.unit
@pytest.mark.parametrize("url, shown", [
    ("postgres://app:p@ss@w0rd@db:5432/x", f"postgres://app:{MASK}@db:5432/x"),
    ('postgres://app:pa"ss\'wd@db/x', f"postgres://app:{MASK}@db/x"),
    ("mysql://u:it's@h", f"mysql://u:{MASK}@h"),
    ("https://u:a@b@host/p?q=a@b", f"https://u:{MASK}@host/p?q=a@b"),
    ("ssh://git@host/repo", "ssh://git@host/repo"),
    ("https://host:8080/x@y", "https://host:8080/x@y"),
])
def test_a_urls_password_is_masked_whole_whatever_it_holds(url, shown):
    assert masked_text(url) == shown
    assert masked_argv(["t.py", f"--db={url}", url]) == ["t.py", f"--db={shown}", shown]
    assert masked_env({"DB": url}, ()) == {"DB": shown}


@pytest.mark.unit
def test_known_secret_forms_are_masked_in_values_and_commands():
    azure = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=abc+/9==;EndpointSuffix=core.windows.net"
    shown = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={MASK};EndpointSuffix=core.windows.net"
    assert masked_env({"AZURE_STORAGE_CONNECTION_STRING": azure}, ()) == {"AZURE_STORAGE_CONNECTION_STRING": shown}
    assert masked_argv(["t.py", "--conn", azure]) == ["t.py", "--conn", shown]
    assert masked_text("Server=db;Uid=u;Pwd=p4ss;") == f"Server=db;Uid=u;Pwd={MASK};"
    sas = "https://a.blob.core.windows.net/c?sv=2022&sig=AbC%2Bd&se=2030"
    assert masked_text(sas) == f"https://a.blob.core.windows.net/c?sv=2022&sig={MASK}&se=2030"


@pytest.mark.unit
def test_submits_job_script_header_repeats_no_secret_of_its_command_line():
    from launcher.slurm.script import JobRequest, render_script
    from launcher.slurm.section import SlurmSettings

    argv = ("tflaunch", "submit", "--env", "KAGGLE_KEY", "--", "python", "t.py", "--db",
            "postgres://u:pw@ss@db/x", "--api-key", "k-123")
    request = JobRequest(run_dir="/r/logs/run1", workdir="/r", python="/p", settings=SlurmSettings(nodes=1),
                         command=argv[5:], submitted_argv=argv)
    comments = [line for line in render_script(request).splitlines() if line.startswith("#")]
    assert not any("pw@ss" in line or "k-123" in line for line in comments), comments
    assert any(f"--api-key '{MASK}'" in line for line in comments)  # masked, not left out
