"""``--format trainjob``: a Kubeflow Trainer v2 runtime and its TrainJob, checked as the Trainer would.

Each document is validated against the Trainer's official CRDs (``tests/schemas/k8s/``) and its
Jobs and pod templates against Kubernetes' own schemas; the rules the Trainer's webhook and
controller add (the ``trainer`` step is one Job with a container named ``node``, its pod count
is ``mlPolicy.numNodes``, the JobSet is named after the TrainJob) are asserted here. Each pod's
start script then runs in a real ``sh`` with the env Kubernetes would give it under the JobSet
the Trainer creates, and must export the TF_CONFIG and env of tflaunch's plan.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.export import ExportRequest, export
from launcher.sources.file import ClusterFileSource
from launcher.sources.local import LocalSource
from test_export_jobset import _clusters, env_of, expected_plan, start_pod
from test_export_schema import check_document, crd_errors

pytestmark = pytest.mark.unit

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINJOB_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ENV = {"FROM_CLI": "cli $(X) 'q'", "USER_SETTING": "the command line wins"}


def documents(source: Any, **options: Any) -> tuple[dict, dict]:
    result = export(ExportRequest(source=source, format="trainjob", **options))
    runtime, trainjob = [d for d in yaml.safe_load_all(result.text) if d]
    return runtime, trainjob


def jobs_of(runtime: dict, trainjob: dict) -> list[dict]:
    """The runtime's replicated jobs, each knowing its JobSet's name: the Trainer names the JobSet after the TrainJob."""
    return [{**job, "_jobset": trainjob["metadata"]["name"]} for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]]


def test_runtime_and_trainjob_follow_the_trainer_api(tmp_path: Path) -> None:
    checked = 0
    for label, source in _clusters(tmp_path):
        for cluster_runtime in (False, True):
            runtime, trainjob = documents(source, image="train:1", namespace="ml", cluster_runtime=cluster_runtime)
            check_document(runtime, core=not cluster_runtime)  # kubernetes-validate is slow: core checks once
            check_document(trainjob)
            kind = "ClusterTrainingRuntime" if cluster_runtime else "TrainingRuntime"
            assert runtime["kind"] == kind
            assert ("namespace" in runtime["metadata"]) is not cluster_runtime  # a ClusterTrainingRuntime has none
            assert trainjob["metadata"]["namespace"] == "ml"
            # The TrainJob CRD's own rules (CEL, which jsonschema does not run) on its name.
            assert TRAINJOB_NAME.match(trainjob["metadata"]["name"]) and len(trainjob["metadata"]["name"]) <= 63
            assert trainjob["spec"] == {"runtimeRef": {"name": runtime["metadata"]["name"],
                                                       "apiGroup": "trainer.kubeflow.org", "kind": kind}}
            jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
            steps = [j for j in jobs if j["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR) == "trainer"]
            assert len(steps) == 1, label
            (step,) = steps
            assert step["name"] == ("worker" if any(j["name"] == "worker" for j in jobs) else "chief")
            # The runtime webhook: the trainer step has one replica and a container named node.
            assert step["replicas"] == 1
            assert runtime["spec"]["mlPolicy"] == {"numNodes": step["template"]["spec"]["completions"]}
            for job in jobs:
                assert [c["name"] for c in job["template"]["spec"]["template"]["spec"]["containers"]] == ["node"]
            # The JobSet's subdomain is left to JobSet: the TrainJob's name, which TF_CONFIG uses.
            assert "subdomain" not in runtime["spec"]["template"]["spec"]["network"]
            checked += 1
    assert checked == 2 * len(_clusters(tmp_path))


def test_runtime_keeps_the_jobset_exports_run_policy(tmp_path: Path) -> None:
    """What JobSet can express about restarts and success, the runtime's template says the same way."""
    path = tmp_path / "c.yaml"
    path.write_text("chief: [localhost:auto]\nworker: [localhost:auto, localhost:auto]\nps: [localhost:auto]\n"
                    "restart_policy: {ps: task}\ntask_restarts: 4\nmax_restarts: 2\nkubernetes: {image: i}\n")
    source = ClusterFileSource(str(path))
    runtime, _ = documents(source)
    (jobset,) = [d for d in yaml.safe_load_all(export(ExportRequest(source=source)).text) if d]
    template, plain = runtime["spec"]["template"]["spec"], jobset["spec"]
    for key in ("failurePolicy", "successPolicy"):
        assert template[key] == plain[key], key
    assert template["failurePolicy"] == {"maxRestarts": 2}
    policy_keys = ("backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes", "podReplacementPolicy")

    def policies(spec: dict) -> dict:
        return {j["name"]: {k: j["template"]["spec"].get(k) for k in policy_keys} for j in spec["replicatedJobs"]}

    assert policies(template) == policies(plain)
    assert policies(template)["ps"]["backoffLimitPerIndex"] == 4
    assert policies(template)["worker"]["backoffLimitPerIndex"] == 4  # ParameterServer workers: 'task' by default


@pytest.mark.parametrize("shell", ["/bin/sh"])
def test_each_pod_exports_the_plans_tf_config_and_env(tmp_path: Path, shell: str) -> None:
    storage = tmp_path / "storage.yaml"
    storage.write_text("chief: [localhost:auto]\nworker: [localhost:auto, localhost:auto]\nevaluator: [localhost:auto]\n"
                       "max_restarts: 1\nenv: {USER_SETTING: file}\n"
                       "kubernetes: {storage: {claim: shared-ckpt, path: /mnt/ckpt/}}\n")
    pods = 0
    for label, source in [*_clusters(tmp_path), ("storage", ClusterFileSource(str(storage)))]:
        runtime, trainjob = documents(source, image="train:1", command=("env", "-0"), env=ENV)
        name = trainjob["metadata"]["name"]
        port = 3000 if label == "named" else 2222
        if label == "storage":
            # The run folder is on the volume: checkpoints for the evaluator, a backup for restarts.
            expected = expected_plan(source, name, port, ("env", "-0"), run_dir=f"/mnt/ckpt/{name}",
                                     backup_dir=f"/mnt/ckpt/{name}/backup", override_env=ENV)
        else:
            expected = expected_plan(source, name, port, ("env", "-0"), override_env=ENV)
        for job in jobs_of(runtime, trainjob):
            for index in range(job["template"]["spec"]["completions"]):
                done = start_pod(job, index, attempt=index % 2, shell=shell)
                assert done.returncode == 0, (label, done.stderr)
                seen = env_of(done.stdout)
                task = f"{job['name']}-{index}"
                want = {**expected[task], "TFLAUNCH_ATTEMPT": str(index % 2 + 1)}
                want.pop("TFLAUNCH_RUN_DIR")
                assert json.loads(seen["TF_CONFIG"]) == json.loads(want["TF_CONFIG"]), (label, task)
                assert {k: seen.get(k) for k in want} == want, (label, task)
                assert seen["FROM_CLI"] == ENV["FROM_CLI"] and seen["USER_SETTING"] == ENV["USER_SETTING"]
                if label == "storage":
                    assert seen["TFLAUNCH_CHECKPOINT_DIR"] == f"/mnt/ckpt/{name}/checkpoints"
                    assert seen["TFLAUNCH_BACKUP_DIR"] == f"/mnt/ckpt/{name}/backup"
                pods += 1
    assert pods == sum(n + c + p for n, c, p in ((1, 0, 0), (2, 0, 0), (2, 1, 0), (3, 1, 1), (4, 1, 3))) + 7 + 6 + 2 + 4


def test_pod_under_a_trainjob_of_another_name_stops_before_the_command() -> None:
    runtime, trainjob = documents(LocalSource(2), image="i", name="mnist", command=("env", "-0"))
    (job,) = jobs_of(runtime, trainjob)
    done = start_pod({**job, "_jobset": "other"}, 0)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == ("tflaunch: this pod's JobSet is 'other'; expected mnist, the name its TF_CONFIG "
                                   "was exported for (tflaunch export --name)")
    tf_config = json.loads(env_of(start_pod(job, 1).stdout)["TF_CONFIG"])
    assert tf_config == {"cluster": {"worker": ["mnist-worker-0-0.mnist:2222", "mnist-worker-0-1.mnist:2222"]},
                         "task": {"type": "worker", "index": 1}}


def test_trainer_crd_validation_is_not_vacuous() -> None:
    runtime, trainjob = documents(LocalSource(2, chief=True), image="i")
    assert crd_errors(runtime) == [] and crd_errors(trainjob) == []
    bad = copy.deepcopy(runtime)
    bad["spec"]["mlPolicy"]["numNodes"] = "2"
    assert crd_errors(bad)
    bad = copy.deepcopy(runtime)
    bad["spec"]["mlPolicy"]["tensorflow"] = {}  # Trainer has no TensorFlow policy
    assert any("tensorflow" in e for e in crd_errors(bad))
    bad = copy.deepcopy(trainjob)
    del bad["spec"]["runtimeRef"]
    assert any("runtimeRef" in e for e in crd_errors(bad))
    bad = copy.deepcopy(trainjob)
    del bad["spec"]["runtimeRef"]["name"]
    assert any("'name' is a required property" in e for e in crd_errors(bad))
