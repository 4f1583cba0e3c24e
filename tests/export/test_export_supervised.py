"""``export --supervised``: a JobSet whose pods run tflaunch (--nodes-from kubernetes), valid
against the JobSet CRD and Kubernetes' own schemas (the validator of test_export_schema)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launcher.errors import ConfigError
from launcher.export import ExportRequest, export
from launcher.sources.hosts import HostsSource
from launcher.sources.local import LocalSource
from launcher.sources.platforms import nodes_from
from test_export_schema import check_document


def documents(source, **options) -> tuple[list[dict], tuple[str, ...]]:
    result = export(ExportRequest(source=source, format="jobset", supervised=True, image="img:1", **options))
    return [d for d in yaml.safe_load_all(result.text) if d is not None], result.notes


def node_container(document: dict) -> dict:
    (job,) = document["spec"]["replicatedJobs"]
    return job["template"]["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.slow
@pytest.mark.parametrize("source", [LocalSource(3, chief=True), HostsSource(hosts="a:2,b:2", ps=1, evaluator=True)])
def test_the_supervised_jobset_is_valid_and_every_pod_runs_the_same_tflaunch(source):
    (document,), notes = documents(source, name="mnist", max_restarts=2)
    check_document(document)
    (job,) = document["spec"]["replicatedJobs"]
    count = len(source.spec(frozenset()).tasks)
    assert job["name"] == "node" and job["template"]["spec"]["completions"] == count
    command = node_container(document)["command"]
    assert command[:5] == ["tflaunch", "--nodes-from", "kubernetes", "--nnodes", str(count)]
    assert command[command.index("--max-restarts") + 1] == "2"
    assert document["spec"]["failurePolicy"]["maxRestarts"] == 2
    token = node_container(document)["env"][0]
    assert token == {"name": "TFLAUNCH_RDZV_TOKEN", "valueFrom": {"secretKeyRef": {"name": "mnist-rdzv", "key": "token"}}}
    assert any("kubectl create secret generic mnist-rdzv" in note for note in notes)


@pytest.mark.unit
def test_the_roles_go_to_tflaunch_and_each_pod_finds_rank_0_from_its_own_name():
    (document,), _ = documents(HostsSource(hosts="a:2,b:2", ps=1, evaluator=True), name="mnist")
    command = node_container(document)["command"]
    assert command[5:command.index("--max-restarts")] == ["--ps", "1", "--evaluator"]
    # The name JobSet gives pod 2 (its subdomain the JobSet's name) leads --nodes-from to pod 0's.
    found = nodes_from("kubernetes", {"JOB_COMPLETION_INDEX": "2"}, "mnist-node-0-2.mnist.default.svc.cluster.local", 4)
    assert found.host == "mnist-node-0-0.mnist.default.svc.cluster.local" and found.rank == 2


@pytest.mark.unit
def test_the_run_folder_goes_to_the_mounted_storage(tmp_path: Path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("worker: [localhost:auto, localhost:auto]\nkubernetes:\n  image: img:1\n  storage:\n"
                       "    claim: shared\n    path: /shared\n")
    from launcher.sources.file import ClusterFileSource

    (document,), notes = documents(ClusterFileSource(str(cluster)), name="mnist")
    command = node_container(document)["command"]
    assert command[command.index("--log-dir") + 1] == "/shared/mnist/runs"
    assert node_container(document)["volumeMounts"] == [{"name": "tflaunch-storage", "mountPath": "/shared"}]
    assert not any("stays in pod 0" in note for note in notes)


@pytest.mark.unit
def test_supervised_is_a_jobset_only():
    with pytest.raises(ConfigError, match="--supervised: only applies to --format jobset"):
        export(ExportRequest(source=LocalSource(2), format="tfjob", supervised=True, image="img:1"))
