"""``tflaunch export`` as a user runs it: a real subprocess, its stdout, stderr and exit code.

Bad input is one line naming the file or option, the key and the value, with exit code 2 and no
traceback; what a cluster file says that pods cannot honour is named in a note on stderr; the
``sh`` format's commands, run in a real shell, start each task with the plan's TF_CONFIG.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.cluster.machine import cpu_count, local_host_names
from launcher.cluster.plan import RunContext, plan_cluster
from launcher.export import default_name
from launcher.sources.local import LocalSource

ROOT = Path(__file__).resolve().parents[2]
TASK = str(ROOT / "tests" / "helpers" / "task.py")


def tflaunch(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def cluster_file(tmp_path: Path, text: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def assert_one_line_error(done: subprocess.CompletedProcess[str], *parts: str) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tflaunch: error: ")
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def test_missing_image_is_one_line() -> None:
    line = assert_one_line_error(tflaunch("export", "--local", "2"), "--image: missing")
    assert line.startswith("tflaunch: error: --local 2: --image: missing; expected the container image")


@pytest.mark.parametrize("section, parts", [
    ("{imgae: x}", ["kubernetes.imgae: unknown key; did you mean 'image'?"]),
    ("{image: x, resources: {cpu: two}}",
     ["kubernetes.resources.cpu: expected a Kubernetes quantity such as 2, 500m or 1.5, got 'two'"]),
    ("{image: x, resources: {memory: 4 GB}}", ["kubernetes.resources.memory", "'4 GB'"]),
    ("{image: x, resources: {cpu: -1}}", ["kubernetes.resources.cpu: expected a quantity >= 0, got '-1'"]),
    ("{image: x, resources: {gpu: 1}}", ["kubernetes.resources.gpu: unknown key"]),
    ("{image: x, name: My_Job}", ["kubernetes.name", "'My_Job'"]),
    ("{image: x, namespace: Team}", ["kubernetes.namespace", "'Team'"]),
    ("{image: x, port: 70000}", ["kubernetes.port: expected a port 1-65535, got 70000"]),
    ("{image: x, tolerations: [{key: a, operator: Maybe}]}",
     ["kubernetes.tolerations[0].operator: expected one of Exists, Equal, got 'Maybe'"]),
    ("{image: x, env: {TF_CONFIG: x}}", ["kubernetes.env.TF_CONFIG: is set by tflaunch"]),
    ("{image: x, image_pull_policy: sometimes}", ["kubernetes.image_pull_policy", "'sometimes'"]),
    ("[image]", ["kubernetes: expected a mapping of Kubernetes settings, got a list"]),
])
def test_bad_kubernetes_section_is_one_line(tmp_path: Path, section: str, parts: list[str]) -> None:
    path = cluster_file(tmp_path, f"worker: [localhost:auto]\nkubernetes: {section}\n")
    assert_one_line_error(tflaunch("export", path), f"{path}: ", *parts)


@pytest.mark.parametrize("options, parts", [
    (["--name", "Bad_Name"], ["--name", "'Bad_Name'"]),
    (["--name", "x" * 60], ["--name", "longer than 63 characters; expected a name of at most 52"]),
    (["--namespace", "a b"], ["--namespace", "'a b'"]),
    (["--image", " "], ["--image: expected a non-empty string"]),
])
def test_bad_options_are_one_line(options: list[str], parts: list[str]) -> None:
    assert_one_line_error(tflaunch("export", "--local", "2", "--image", "i", *options), *parts)


def test_tfjob_refuses_ps_with_evaluator(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, "chief: [localhost:auto]\nworker: [localhost:auto]\nps: [localhost:auto]\n"
                                  "evaluator: [localhost:auto]\n")
    assert_one_line_error(tflaunch("export", "--format", "tfjob", path, "--image", "i"),
                          f"{path}: evaluator:", "TensorFlow issue 46169", "--format jobset")
    assert tflaunch("export", "--format", "jobset", path, "--image", "i").returncode == 0


@pytest.mark.parametrize("workers, parts", [
    ("[{host: localhost, port: auto, env: {LR: '0.1'}}, {host: localhost, port: auto, env: {LR: '0.2'}}]",
     ["worker[1].env: LR is '0.2' here but '0.1' in worker[0]"]),
    ("[{host: localhost, port: auto, gpus: [0]}, {host: localhost, port: auto, gpus: [1, 2]}]",
     ["worker[1].gpus: 2 GPUs here but 1 in worker[0]"]),
    ("[{host: localhost, port: auto, gpus: [0, 1]}, {host: localhost, port: auto, gpus: [2]}]",
     ["worker[1].gpus: 1 GPU here but 2 in worker[0]"]),
])
def test_tasks_of_a_role_must_fit_one_template(tmp_path: Path, workers: str, parts: list[str]) -> None:
    path = cluster_file(tmp_path, f"worker: {workers}\n")
    for fmt in ("jobset", "tfjob"):
        assert_one_line_error(tflaunch("export", "--format", fmt, path, "--image", "i"), *parts)


def test_usage_mistakes_exit_2() -> None:
    done = tflaunch("export", "--image", "i")
    assert done.returncode == 2 and "give either a cluster file or --local N" in done.stderr
    done = tflaunch("export", "clusters/local_ps.yaml", "--chief", "--image", "i")
    assert done.returncode == 2 and "--chief" in done.stderr and "only apply to --local" in done.stderr
    done = tflaunch("export", "--local", "2", "--format", "helm", "--image", "i")
    assert done.returncode == 2 and "'helm' is not one of" in done.stderr


def test_what_cannot_carry_over_is_named(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, """
ssh: {user: root}
setup: source /opt/venv/bin/activate
workdir: /home/me/project
log_dir: runs
share_gpus: true
max_restarts: 1
hosts:
  node1: {python: /opt/py/bin/python, env: {NCCL_SOCKET_IFNAME: eth1}}
chief: [{host: localhost, port: auto, address: 10.0.0.5, gpus: all}]
worker:
  - {host: node1, port: 2222, gpus: [3]}
  - {host: node2, port: 2345, gpus: [0]}
spares: [{host: node3, port: 2222}]
min_workers: 1
kubernetes: {image: train:1}
""")
    done = tflaunch("export", path)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("tflaunch: note: ")]
    text = "\n".join(notes)
    for expected in ("port: every pod listens on port 2222 (kubernetes.port)", "(2345, auto)",
                     "host: each task runs in its own pod instead of on node1, node2",
                     "address: replaced by the pods' DNS names", "ssh: not used",
                     "setup: not run in pods", "workdir: not used", "hosts.node1.python: not used",
                     "hosts.node1.env: not used", "gpus: 'all' (chief[0]) requests no GPU",
                     "share_gpus: not used", "log_dir: not used", "restart_delay: not used",
                     "max_restarts: restarted pods train from scratch", "set kubernetes.storage ('claim: NAME')",
                     "spares, min_workers: not used"):
        assert expected in text, (expected, text)
    assert len(notes) == len(done.stderr.splitlines())
    (document,) = [d for d in yaml.safe_load_all(done.stdout) if d]
    worker = document["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == "0"  # GPU 3 of node1 is the pod's only GPU, index 0
    assert "NCCL_SOCKET_IFNAME" not in env
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert document["spec"]["failurePolicy"] == {"maxRestarts": 1}


def test_command_options_and_output_file(tmp_path: Path) -> None:
    out = tmp_path / "job.yaml"
    done = tflaunch("export", "--format", "tfjob", "--local", "3", "--chief", "--ps", "1", "--image", "reg/t:2",
                    "--name", "mnist", "--namespace", "ml", "--max-restarts", "4", "-o", str(out),
                    "--", "python", "train.py", "--lr", "0.1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1] == f"tflaunch: wrote {out}: TFJob mnist: chief 1, worker 3, ps 1"
    (document,) = [d for d in yaml.safe_load_all(out.read_text()) if d]
    assert document["metadata"] == {"name": "mnist", "namespace": "ml"}
    # 4 whole-cluster restarts plus 3 in-place restarts for each of the 3 ParameterServer workers.
    assert document["spec"]["runPolicy"] == {"backoffLimit": 4 + 3 * 3, "cleanPodPolicy": "Running"}
    assert "successPolicy" not in document["spec"]  # the operator's default: the chief decides
    replicas = document["spec"]["tfReplicaSpecs"]
    assert {k: (v["replicas"], v["restartPolicy"]) for k, v in replicas.items()} == {
        "Chief": (1, "OnFailure"), "Worker": (3, "OnFailure"), "PS": (1, "OnFailure")}
    container = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python3", "train.py", "--lr", "0.1"]
    assert not {"TF_CONFIG", "TFLAUNCH_TASK", "TFLAUNCH_ATTEMPT"} & {e["name"] for e in container["env"]}


def test_jobset_run_policy_follows_tflaunch_run(tmp_path: Path) -> None:
    def spec_of(*args: str) -> dict:
        done = tflaunch("export", *args, "--image", "i")
        assert done.returncode == 0, done.stderr
        return yaml.safe_load(done.stdout.split("\n", 1)[1])["spec"]

    with_ps = spec_of("--local", "2", "--ps", "1")
    assert with_ps["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    assert with_ps["failurePolicy"] == {"maxRestarts": 0}
    assert [(j["name"], j["template"]["spec"]["completions"]) for j in with_ps["replicatedJobs"]] == [
        ("chief", 1), ("worker", 2), ("ps", 1)]
    assert spec_of("--local", "3", "--chief")["successPolicy"]["targetReplicatedJobs"] == ["chief", "worker"]
    path = cluster_file(tmp_path, "worker: [localhost:auto, localhost:auto]\nevaluator: [localhost:auto]\n"
                                  "max_restarts: 5\n")
    workers = spec_of(path)
    assert workers["successPolicy"]["targetReplicatedJobs"] == ["worker"]
    assert workers["failurePolicy"] == {"maxRestarts": 5}


def test_export_help() -> None:
    done = tflaunch("export", "--help")
    assert done.returncode == 0 and "--format [jobset|tfjob|trainjob|sh]" in done.stdout


def _run_lines(text: str, cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    commands = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [subprocess.run(["sh", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=60)
            for line in commands]


def test_sh_commands_start_each_task_with_the_plans_env(tmp_path: Path) -> None:
    done = tflaunch("export", "--format", "sh", "--local", "2", "--chief", "--ps", "1", "--", "python", TASK, "env",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "port: 'auto' needs tflaunch to pick free ports at launch; fixed ports instead: chief-0 2222, " \
           "worker-0 2223, worker-1 2224, ps-0 2225" in done.stderr
    runs = _run_lines(done.stdout, tmp_path)
    assert len(runs) == 4
    seen = []
    for run in runs:
        assert run.returncode == 0, run.stderr
        (line,) = [l for l in run.stdout.splitlines() if l.startswith("ENV ")]
        seen.append(json.loads(line[4:]))
    spec = LocalSource(2, chief=True, ps=1).spec(frozenset({"localhost"}))
    spec = spec.with_ports({"chief-0": 2222, "worker-0": 2223, "worker-1": 2224, "ps-0": 2225})
    name = default_name("--local 2 --chief --ps 1", ("python", TASK, "env"), ("", None))
    context = RunContext(run_id=name, run_dir=str(Path("logs", name)))
    plan = plan_cluster(spec, context, local_hosts=local_host_names(),
                        cores_by_host={"localhost": cpu_count()}, default_python=sys.executable,
                        default_workdir=str(tmp_path), command=("python", TASK, "env"))
    for record, launch in zip(seen, plan.launches):
        for key in ("TF_CONFIG", "TFLAUNCH_TASK", "TFLAUNCH_ATTEMPT", "TFLAUNCH_RUN_ID", "CUDA_VISIBLE_DEVICES",
                    "TF_NUM_INTRAOP_THREADS", "PYTHONUNBUFFERED"):
            assert record[key] == launch.env.get(key), (launch.name, key)
        assert record.get("TFLAUNCH_RUN_DIR") is None


def test_sh_commands_keep_remote_setup_and_quote_values(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, """
setup: . /opt/venv/bin/activate
env: {MESSAGE: "it's $HOME; `x`"}
worker: [{host: node1, port: 2222}, localhost:auto]
""")
    done = tflaunch("export", "--format", "sh", path, "--image", "ignored")
    assert done.returncode == 0, done.stderr
    assert "--image: not used by --format sh" in done.stderr
    lines = [line for line in done.stdout.splitlines() if line and not line.startswith("#")]
    # node1's line: its setup, then its own python3 in the folder the line is started in.
    assert lines[0].startswith(". /opt/venv/bin/activate && env ") and lines[0].endswith(" python3 -m trainer")
    assert lines[1].startswith(f"cd -- {ROOT} && env ")  # this machine's: its folder and interpreter
    assert lines[1].endswith(f" {sys.executable} -m trainer")
    assert " && . /opt/venv" not in lines[1]  # setup runs on remote hosts only, as in a run
    assert "'MESSAGE=it'\"'\"'s $HOME; `x`'" in lines[0]
    assert "# worker-0 on node1 (listens on node1:2222)" in done.stdout


def test_sh_lines_for_other_hosts_hold_nothing_of_this_machine(tmp_path: Path) -> None:
    """No path of this machine (its folder, its venv) in another host's line; the file's own paths are kept."""
    path = cluster_file(tmp_path, """
hosts: {node2: {workdir: /srv/train, python: /opt/venv/bin/python}}
chief: [localhost:auto]
worker: [{host: node1, port: 2222}, {host: node2, port: 2222}]
""")
    done = tflaunch("export", "--format", "sh", path, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    blocks = dict(zip(re.findall(r"^# (\S+) on ", text, re.M), [b for b in text.split("\n\n")[1:]]))
    node1, node2 = blocks["worker-0"].splitlines()[1], blocks["worker-1"].splitlines()[1]
    for line in (node1, node2):
        assert str(tmp_path) not in line and sys.prefix not in line and str(ROOT) not in line, line
    assert node1.startswith("env ") and node1.endswith(" python3 -m trainer")
    assert "TFLAUNCH_TENSORBOARD_DIR=logs/c/tensorboard" in node1  # the run folder, relative to the line's folder
    assert node2.startswith("cd -- /srv/train && env ") and node2.endswith(" /opt/venv/bin/python -m trainer")
    assert "# On node1: 'python3' is that host's own (activate its venv first)" in text
    chief = blocks["chief-0"].splitlines()[1]
    assert chief.startswith(f"cd -- {tmp_path} && env ") and chief.endswith(f" {sys.executable} -m trainer")


def test_sh_comments_escape_what_the_file_says(tmp_path: Path) -> None:
    """A host name holding a newline stays inside its comment: the line after it runs nothing of it."""
    marker = tmp_path / "injected"
    path = cluster_file(tmp_path, f'worker:\n  - {{host: "node1\\ntouch {marker}", port: 2222}}\n'
                                  '  - {host: "node2\\u001b[31m", port: 2222}\n', name="a\nb.yaml")
    done = tflaunch("export", "--format", "sh", path, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"# worker-0 on node1\\ntouch {marker} (listens on node1\\ntouch {marker}:2222)" in lines
    assert "# worker-1 on node2\\x1b[31m (listens on node2\\x1b[31m:2222)" in lines
    assert lines[0] == f"# tflaunch export --format sh {path}".replace("\n", "\\n")
    assert not any(line.startswith("touch") for line in lines) and "\x1b" not in done.stdout
    subprocess.run(["sh", "-n", "-c", done.stdout], check=True)  # the whole text is shell, and parses
    comments = "\n".join(line for line in lines if line.startswith("#") or not line)
    subprocess.run(["sh", "-c", comments], check=True, cwd=tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("fmt", ["jobset", "tfjob", "trainjob"])
def test_gpus_go_to_each_chief_and_worker_pod(tmp_path: Path, fmt: str) -> None:
    done = tflaunch("export", "--format", fmt, "--local", "2", "--chief", "--ps", "1", "--gpus", "2", "--image", "i",
                    "--", "python", "t.py")
    assert done.returncode == 0, done.stderr
    assert "gpus: none asked for" not in done.stderr
    documents = [d for d in yaml.safe_load_all(done.stdout) if d]
    containers = {}
    for document in documents:
        spec = document["spec"]
        if "replicatedJobs" in spec.get("template", {}).get("spec", spec):
            jobs = spec.get("template", {}).get("spec", spec)["replicatedJobs"]
            containers.update({j["name"]: j["template"]["spec"]["template"]["spec"]["containers"][0] for j in jobs})
        elif "tfReplicaSpecs" in spec:
            containers.update({k.lower(): r["template"]["spec"]["containers"][0]
                               for k, r in spec["tfReplicaSpecs"].items()})
    assert set(containers) in ({"chief", "worker", "ps"}, {"node", "worker", "ps"}), containers.keys()
    for role, container in containers.items():
        env = {e["name"]: e.get("value") for e in container["env"]}
        if role == "ps":  # a parameter server holds variables only: no GPU, none visible
            assert "resources" not in container and env["CUDA_VISIBLE_DEVICES"] == "-1"
        else:
            assert container["resources"] == {"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": 2}}
            assert env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_without_gpus_export_says_every_task_trains_on_the_cpu(tmp_path: Path) -> None:
    for fmt, given in (("jobset", "each chief and worker pod N GPUs (nvidia.com/gpu)"),
                       ("sh", "each chief and worker N GPUs of its machine")):
        done = tflaunch("export", "--format", fmt, "--local", "2", "--image", "i", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert (f"tflaunch: note: gpus: none asked for, so every task trains on the CPU (CUDA_VISIBLE_DEVICES=-1); "
                f"--gpus N gives {given}") in done.stderr.splitlines()


def test_sh_gpus_are_each_tasks_own_on_its_machine(tmp_path: Path) -> None:
    done = tflaunch("export", "--format", "sh", "-H", "localhost:2,node1:2", "--chief", "--gpus", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    devices = re.findall(r"CUDA_VISIBLE_DEVICES=(\S+)", done.stdout)
    assert devices == ["0,1", "2,3", "0,1", "2,3"], done.stdout  # chief-0, worker-0 here; worker-1, worker-2 on node1


def test_evaluator_checkpoints_need_shared_storage(tmp_path: Path) -> None:
    """The evaluator reads what the chief writes: in pods that is a note until the user names shared storage."""
    text = "chief: [localhost:auto]\nworker: [localhost:auto]\nevaluator: [localhost:auto]\n"
    path = cluster_file(tmp_path, text + "kubernetes: {image: i}\n")
    done = tflaunch("export", path)
    assert done.returncode == 0, done.stderr
    assert ("tflaunch: note: evaluator: it evaluates the checkpoints the chief writes to TFLAUNCH_CHECKPOINT_DIR, "
            "which is /tmp/tflaunch/c/checkpoints inside each pod, where the evaluator pod never sees them; set "
            "kubernetes.storage ('claim: NAME') to a volume the chief and evaluator pods both mount") in done.stderr
    path = cluster_file(tmp_path, text + "kubernetes: {image: i, env: {TFLAUNCH_CHECKPOINT_DIR: /shared/ckpt}}\n")
    done = tflaunch("export", path)
    assert done.returncode == 0 and "evaluator:" not in done.stderr, done.stderr
    (document,) = [d for d in yaml.safe_load_all(done.stdout) if d]
    for job in document["spec"]["replicatedJobs"]:
        (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
        assert {"name": "TFLAUNCH_CHECKPOINT_DIR", "value": "/shared/ckpt"} in container["env"], job["name"]


def test_role_restart_policies_carry_over(tmp_path: Path) -> None:
    """'task' roles come back pod by pod (task_restarts each); 'cluster' roles fail the job or the JobSet."""
    def documents(*args: str) -> tuple[dict, dict]:
        out = []
        for fmt in ("jobset", "tfjob"):
            done = tflaunch("export", "--format", fmt, *args, "--image", "i")
            assert done.returncode == 0, done.stderr
            (document,) = [d for d in yaml.safe_load_all(done.stdout) if d]
            out.append(document)
        return out[0], out[1]

    def job_policies(jobset: dict) -> dict[str, dict]:
        keys = ("backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes")
        return {j["name"]: {k: j["template"]["spec"][k] for k in keys if k in j["template"]["spec"]}
                for j in jobset["spec"]["replicatedJobs"]}

    jobset, tfjob = documents("--local", "2", "--ps", "1")  # ParameterServer workers default to 'task'
    assert job_policies(jobset) == {"chief": {"backoffLimit": 0}, "ps": {"backoffLimit": 0},
                                    "worker": {"backoffLimitPerIndex": 3, "maxFailedIndexes": 0}}
    assert {k: v["restartPolicy"] for k, v in tfjob["spec"]["tfReplicaSpecs"].items()} == {
        "Chief": "Never", "Worker": "OnFailure", "PS": "Never"}
    assert tfjob["spec"]["runPolicy"]["backoffLimit"] == 2 * 3

    path = cluster_file(tmp_path, "chief: [localhost:auto]\nworker: [localhost:auto]\nps: [localhost:auto]\n"
                                  "restart_policy: {worker: cluster, ps: task}\ntask_restarts: 5\nmax_restarts: 1\n")
    jobset, tfjob = documents(path)
    assert job_policies(jobset) == {"chief": {"backoffLimit": 0}, "worker": {"backoffLimit": 0},
                                    "ps": {"backoffLimitPerIndex": 5, "maxFailedIndexes": 0}}
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 1}
    # With whole-cluster restarts allowed, which the operator cannot do, every role restarts in place.
    assert {v["restartPolicy"] for v in tfjob["spec"]["tfReplicaSpecs"].values()} == {"OnFailure"}
    assert tfjob["spec"]["runPolicy"]["backoffLimit"] == 1 + 5

    jobset, tfjob = documents("--local", "3")  # MultiWorkerMirrored: the whole cluster or nothing
    assert job_policies(jobset) == {"worker": {"backoffLimit": 0}}
    assert tfjob["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] == "Never"
    assert tfjob["spec"]["runPolicy"]["backoffLimit"] == 0


def test_env_option_reaches_every_task_and_refuses_what_tflaunch_sets(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, "env: {MODE: file}\nworker: [localhost:auto, localhost:auto]\n")
    done = tflaunch("export", "--format", "sh", path, "--env", "MODE=cli", "--env", "EXTRA=a b",
                    "--", "sh", "-c", 'echo "$TFLAUNCH_TASK|$MODE|$EXTRA"', cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    runs = _run_lines(done.stdout, tmp_path)
    assert [(run.returncode, run.stdout) for run in runs] == [(0, "worker-0|cli|a b\n"), (0, "worker-1|cli|a b\n")]
    for fmt in ("jobset", "trainjob", "sh"):
        assert_one_line_error(tflaunch("export", "--format", fmt, path, "--image", "i", "--env", "TF_CONFIG={}"),
                              "--env: TF_CONFIG: is set by tflaunch for every task and cannot be overridden")


def test_cluster_runtime_only_with_trainjob() -> None:
    assert_one_line_error(tflaunch("export", "--local", "2", "--image", "i", "--cluster-runtime"),
                          "--cluster-runtime", "only applies to --format trainjob, got --format jobset")
    done = tflaunch("export", "--format", "trainjob", "--local", "2", "--image", "i", "--cluster-runtime",
                    "--name", "mnist")
    assert done.returncode == 0, done.stderr
    kinds = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(done.stdout) if d]
    assert kinds == [("ClusterTrainingRuntime", "mnist"), ("TrainJob", "mnist")]
    assert ("tflaunch: note: trainjob: the ClusterTrainingRuntime mnist serves only a TrainJob named mnist, since "
            "TF_CONFIG names the pods by it") in done.stderr


@pytest.mark.parametrize("fmt", ["jobset", "tfjob", "trainjob"])
def test_the_built_in_trainer_needs_tflaunch_in_the_image(tmp_path: Path, fmt: str) -> None:
    note = ("the task command is tflaunch's built-in trainer (python -m trainer): the image img:1 must contain its "
            "'trainer' package (copy tflaunch's source folder into the image and pip install it there), or give "
            "your own command after '--'")
    done = tflaunch("export", "--format", fmt, "--local", "2", "--chief", "--image", "img:1")
    assert done.returncode == 0, done.stderr
    assert f"tflaunch: note: {note}" in done.stderr.splitlines()
    assert f"# {note}" in done.stdout.split("\n---\n", 1)[0].splitlines()  # the manifest's header says it too
    for own in (["--", "python", "train.py"], []):  # a command of its own, on the command line or in the file
        source = ["--local", "2"] if own else [cluster_file(tmp_path, "command: python train.py\nworker: [a, b]\n")]
        done = tflaunch("export", "--format", fmt, *source, "--image", "img:1", *own)
        assert done.returncode == 0 and "built-in trainer" not in done.stderr + done.stdout, done.stderr


def test_a_manifests_comments_escape_what_they_show(tmp_path: Path) -> None:
    """The header names the cluster file as given: a newline in its name stays inside the comment."""
    path = cluster_file(tmp_path, "worker: [localhost:auto]\n", name="a\nkind: Secret\n.yaml")
    done = tflaunch("export", path, "--image", "i", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    header = done.stdout.split("\n---\n", 1)[0].splitlines()
    assert header[0] == f"# tflaunch export --format jobset {path}".replace("\n", "\\n")
    assert all(line.startswith("# ") for line in header), header
    assert [d["kind"] for d in yaml.safe_load_all(done.stdout) if d] == ["JobSet"]
