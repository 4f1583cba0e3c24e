"""A JobSet pod's start command, run in a real shell, exports the TF_CONFIG and env of tflaunch's plan.

Each pod of each replicated job is started the way Kubernetes would start it: its container env
(``$(VAR)`` references expanded as the kubelet does, downward-API fields filled in), plus what
Kubernetes adds itself (``JOB_COMPLETION_INDEX`` for an Indexed Job, ``HOSTNAME``), then the
container's command and args as a subprocess. The command is ``env -0``, so the test reads the
environment the training program would see and compares it with ``plan_cluster`` for the same
cluster on the pods' DNS names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.cluster.plan import RunContext, plan_cluster
from launcher.export import ExportRequest, export
from launcher.export.pods import POD_RUN_DIR
from launcher.sources.file import ClusterFileSource
from launcher.sources.local import LocalSource
from test_export_schema import sources_of

pytestmark = pytest.mark.unit

RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
SHELLS = [s for s in ("/bin/sh", shutil.which("bash")) if s]  # /bin/sh is dash here: a strict POSIX shell

CLUSTER_FILES = {
    "chief-workers-ps-evaluator": """
chief: [localhost:auto]
worker: [localhost:auto, localhost:auto, localhost:auto]
ps: [localhost:auto, localhost:auto]
evaluator: [localhost:auto]
env: {USER_SETTING: "a b 'c'"}
""",
    "workers-evaluator": """
worker: [node1:2222, node2:2222, node3:2222, node4:2222, node5:2222]
evaluator: [localhost:auto]
threads: 3
""",
    "named": """
worker: [localhost:auto, localhost:auto]
kubernetes: {name: resnet, port: 3000, image: "train:1", env: {DATA: /data}}
""",
}
LOCAL = {"one": (1, False, 0), "two": (2, False, 0), "chief-one": (2, True, 0), "ps-one": (3, True, 1),
         "ps-three": (4, True, 3)}


def _clusters(tmp_path: Path) -> list[tuple[str, Any]]:
    return sources_of(tmp_path, CLUSTER_FILES, LOCAL)


def k8s_expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (third_party/forked/golang/expansion in kubernetes)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":  # "$$" is an escaped "$"
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                close = text.find(")", i + 2)
                if close == -1:
                    out.append("$(")
                    i += 2
                    continue
                name = text[i + 2:close]
                out.append(variables.get(name, f"$({name})"))  # unknown references stay as written
                i = close + 1
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def start_pod(job: dict, index: int, *, attempt: int = 0, shell: str = "/bin/sh",
              index_env: bool = True) -> subprocess.CompletedProcess[str]:
    """Start one pod of replicated job ``job`` the way Kubernetes would, with a bare environment.

    ``job["_jobset"]`` is the name of the JobSet the pod belongs to (for a Trainer runtime, the TrainJob's).
    """
    name = job["_jobset"]
    pod = job["template"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    labels = {RESTART_LABEL: str(attempt), JOBSET_NAME_LABEL: name}
    env: dict[str, str] = {"PATH": os.environ["PATH"], "HOSTNAME": f"{name}-{job['name']}-0-{index}"}
    if index_env:
        env["JOB_COMPLETION_INDEX"] = str(index)
    defined: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            value = k8s_expand(item["value"], defined)  # a value may refer to variables defined before it
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            label = path.removeprefix("metadata.labels['").removesuffix("']")
            assert path == f"metadata.labels['{label}']" and label in labels, path
            value = labels[label]
        defined[item["name"]] = value
    env.update(defined)
    argv = [k8s_expand(a, defined) for a in container["command"] + container.get("args", [])]
    assert argv[0] == "/bin/sh"
    return subprocess.run([shell, *argv[1:]], env=env, capture_output=True, text=True, timeout=20)


def jobs_of(text: str) -> list[dict]:
    (document,) = [d for d in yaml.safe_load_all(text) if d]
    assert document["kind"] == "JobSet"
    return [{**job, "_jobset": document["metadata"]["name"]} for job in document["spec"]["replicatedJobs"]]


def env_of(output: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in output.split("\0") if item)


def expected_plan(source: Any, name: str, port: int, command: tuple[str, ...], *, run_dir: str | None = None,
                  backup_dir: str | None = None, override_env: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """tflaunch's own plan for the cluster with every task on its JobSet pod: env by task name.

    ``run_dir`` is where the pods' run-folder paths point (default: inside each pod).
    """
    spec = source.spec(frozenset({"localhost"}))
    extra_env = dict((spec.kubernetes or {}).get("env") or {})
    tasks = tuple(replace(t, host=f"{name}-{t.role}-0-{t.index}.{name}", address=None, port=port) for t in spec.tasks)
    spec = replace(spec, tasks=tasks, env={**spec.env, **extra_env}, hosts={})
    context = RunContext(run_id=name, run_dir=run_dir or POD_RUN_DIR.format(name=name), backup_dir=backup_dir)
    plan = plan_cluster(spec, context, local_hosts=frozenset(), cores_by_host={},
                        default_python="python3", default_workdir="", command=command, override_env=override_env)
    return {launch.name: dict(launch.env) for launch in plan.launches}


@pytest.mark.parametrize("shell", SHELLS)
def test_each_pod_exports_the_plans_tf_config_and_env(tmp_path: Path, shell: str) -> None:
    pods = 0
    for label, source in _clusters(tmp_path):
        result = export(ExportRequest(source=source, image="train:1", command=("env", "-0")))
        jobs = jobs_of(result.text)
        name = jobs[0]["_jobset"]
        port = 3000 if label == "named" else 2222
        expected = expected_plan(source, name, port, ("env", "-0"))
        assert sum(job["template"]["spec"]["completions"] for job in jobs) == len(expected), label
        for job in jobs:
            for index in range(job["template"]["spec"]["completions"]):
                attempt = index % 3  # JobSet's restart count: TFLAUNCH_ATTEMPT is one more
                done = start_pod(job, index, attempt=attempt, shell=shell)
                assert done.returncode == 0, (label, done.stderr)
                seen = env_of(done.stdout)
                task = f"{job['name']}-{index}"
                want = {**expected[task], "TFLAUNCH_ATTEMPT": str(attempt + 1)}
                want.pop("TFLAUNCH_RUN_DIR")  # pods have no run folder
                assert seen["TF_CONFIG"] == want["TF_CONFIG"], (label, task)
                assert json.loads(seen["TF_CONFIG"]) == json.loads(want["TF_CONFIG"])
                assert {k: seen.get(k) for k in want} == want, (label, task)
                assert "TFLAUNCH_RUN_DIR" not in seen
                pods += 1
    assert pods == sum(n + c + p for n, c, p in LOCAL.values()) + 7 + 6 + 2


def test_tf_config_names_pods_by_jobset_dns(tmp_path: Path) -> None:
    (job, *_) = jobs_of(export(ExportRequest(source=LocalSource(2, chief=True, ps=1), image="i", name="mnist",
                                             command=("env", "-0"))).text)
    tf_config = json.loads(env_of(start_pod(job, 0).stdout)["TF_CONFIG"])
    assert tf_config == {"cluster": {"chief": ["mnist-chief-0-0.mnist:2222"],
                                     "worker": ["mnist-worker-0-0.mnist:2222", "mnist-worker-0-1.mnist:2222"],
                                     "ps": ["mnist-ps-0-0.mnist:2222"]},
                         "task": {"type": "chief", "index": 0}}


def test_pod_without_completion_index_stops_before_the_command() -> None:
    (job,) = jobs_of(export(ExportRequest(source=LocalSource(2), image="i", command=("env", "-0"))).text)
    done = start_pod(job, 0, index_env=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == ("tflaunch: JOB_COMPLETION_INDEX is ''; expected the pod's index in an "
                                   "Indexed Job")


def test_command_and_env_reach_the_program_unexpanded(tmp_path: Path) -> None:
    """Kubernetes expands $(VAR) in command, args and env values; the manifest escapes what it must."""
    path = tmp_path / "c.yaml"
    path.write_text('worker: [localhost:auto]\nenv: {PRICE: "$(DATA) $$5"}\n'
                    'kubernetes: {image: i, env: {DATA: /data}}\n')
    words = ("$(DATA)", "a$$b", "$(", "$", "'quoted' \"twice\"", "$(HOME)x")
    command = ("sh", "-c", 'printf "%s\\0" "$@" "$PRICE"', "argv0", *words)
    (job,) = jobs_of(export(ExportRequest(source=ClusterFileSource(str(path)), command=command)).text)
    done = start_pod(job, 0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\0")[:-1] == [*words, "$(DATA) $$5"]
