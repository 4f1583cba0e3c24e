"""Every manifest ``tflaunch export`` prints is valid for the API server that would receive it.

No API server runs here, so each JobSet and TFJob is validated against the official CRD schemas
vendored in ``tests/schemas/k8s/`` (the served version's openAPIV3Schema, with unknown fields
refused as ``kubectl apply`` does by default), and the core objects inside them (each Indexed
Job of a JobSet, each pod template) against Kubernetes' own schemas with kubernetes-validate in
strict mode. The CRDs' CEL rules only guard updates (immutability) and fields tflaunch never sets.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from launcher.export import ExportRequest, export
from launcher.export.settings import QUANTITY
from launcher.sources.file import ClusterFileSource
from launcher.sources.local import LocalSource

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas" / "k8s"
CRDS = {"JobSet": "jobset.x-k8s.io_jobsets.yaml", "TFJob": "kubeflow.org_tfjobs.yaml",
        "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
        "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
        "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml"}
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
KUBERNETES_VERSION = "1.34"  # podReplacementPolicy, used in each JobSet Job, is GA from 1.34
# What the TFJob CRD's descriptions allow (the CRD does not enumerate them).
TFJOB_REPLICA_TYPES = {"Chief", "Master", "Worker", "PS", "Evaluator"}
TFJOB_RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
TFJOB_CLEAN_POD_POLICIES = {"None", "Running", "All"}

FULL_SECTION = """
kubernetes:
  image: registry.example.com/team/train:1.0
  name: mnist
  namespace: ml-team
  port: 2345
  python: /opt/venv/bin/python
  workdir: /app
  resources: {cpu: 500m, memory: 2Gi}
  node_selector: {cloud.google.com/gke-accelerator: nvidia-tesla-t4, pool: "1"}
  tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
    - {key: dedicated, operator: Equal, value: ml, effect: NoExecute, toleration_seconds: 30}
    - {operator: Exists}
  service_account: trainer
  image_pull_secrets: [registry-credentials, other.secret]
  image_pull_policy: IfNotPresent
  env: {DATA_DIR: /data, PRICE: "$(NOT_EXPANDED)"}
"""

FILE_CLUSTERS = {
    "gpus-and-section": """
env: {TF_CPP_MIN_LOG_LEVEL: "1"}
max_restarts: 3
chief: [localhost:auto]
worker:
  - {host: localhost, port: auto, gpus: [0, 1]}
  - {host: localhost, port: auto, gpus: [2, 3]}
ps: [localhost:auto, localhost:auto]
""" + FULL_SECTION,
    "evaluator-no-ps": """
worker: [localhost:auto, localhost:auto, localhost:auto]
evaluator: [localhost:auto]
kubernetes: {image: "train:1", resources: {cpu: 2, memory: 4G}}
""",
    "ps-and-evaluator": """
chief: [localhost:auto]
worker: [localhost:auto]
ps: [localhost:auto]
evaluator: [localhost:auto]
kubernetes: {image: "train:1"}
""",
    "remote-hosts": """
ssh: {user: root}
hosts: {node1: {env: {A: "1"}, setup: "source /opt/venv/bin/activate"}}
worker:
  - {host: node1, port: 2222}
  - {host: node2, port: 2222}
kubernetes: {image: "train:1"}
""",
}
LOCAL_CLUSTERS = {"one": (1, False, 0), "two": (2, False, 0), "chief-three": (3, True, 0), "ps": (4, True, 2)}


def sources_of(tmp_path: Path, files: dict[str, str], local: dict[str, tuple[int, bool, int]]) -> list[tuple[str, Any]]:
    """A (label, source) for each cluster file's text, written into ``tmp_path`` under its label, and for
    each ``--local`` form, (workers, chief, ps) under its label."""
    sources: list[tuple[str, Any]] = []
    for label, text in files.items():
        path = tmp_path / f"{label}.yaml"
        path.write_text(text)
        sources.append((label, ClusterFileSource(str(path))))
    sources += [(label, LocalSource(n, chief=chief, ps=ps)) for label, (n, chief, ps) in local.items()]
    return sources


def _sources(tmp_path: Path) -> list[tuple[str, Any]]:
    return sources_of(tmp_path, FILE_CLUSTERS, LOCAL_CLUSTERS)


def _documents(source: Any, fmt: str, **options: Any) -> list[dict]:
    result = export(ExportRequest(source=source, format=fmt, **options))
    documents = [d for d in yaml.safe_load_all(result.text) if d is not None]
    assert documents, result.text
    return documents


@lru_cache(maxsize=None)
def load_crd(kind: str) -> dict:
    # The C loader reads these large files in a fraction of the pure-Python loader's time.
    return yaml.load((SCHEMAS / CRDS[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@lru_cache(maxsize=None)
def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    """The served version's schema of the vendored CRD, closed against unknown fields."""
    crd = load_crd(kind)
    served = [v for v in crd["spec"]["versions"] if v.get("served")]
    assert len(served) == 1, "expected one served version"
    schema = _closed(copy.deepcopy(served[0]["schema"]["openAPIV3Schema"]))
    return jsonschema.Draft7Validator(schema)


def _closed(schema: Any) -> Any:
    """Refuse fields a schema does not name, as the API server's strict field validation does."""
    if isinstance(schema, dict):
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        for value in schema.values():
            _closed(value)
    elif isinstance(schema, list):
        for value in schema:
            _closed(value)
    return schema


def crd_errors(document: dict) -> list[str]:
    validator = crd_validator(document["kind"])
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def core_check(obj: dict) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def jobset_spec_of(document: dict) -> dict | None:
    """The JobSet spec a JobSet holds, or a Trainer runtime's template; None for other kinds."""
    if document["kind"] == "JobSet":
        return document["spec"]
    if document["kind"] in RUNTIME_KINDS:
        return document["spec"]["template"]["spec"]
    return None


def pod_templates(document: dict) -> list[tuple[str, dict]]:
    spec = jobset_spec_of(document)
    if spec is not None:
        return [(rj["name"], rj["template"]["spec"]["template"]) for rj in spec["replicatedJobs"]]
    if document["kind"] == "TrainJob":
        return []
    return [(kind, replica["template"]) for kind, replica in document["spec"]["tfReplicaSpecs"].items()]


def check_document(document: dict, core: bool = True) -> None:
    """The CRD schema, the operator's rules, and (``core``) Kubernetes' own schemas for the Jobs and pods."""
    assert crd_errors(document) == []
    name = document["metadata"]["name"]
    if document["kind"] == "TrainJob":
        pass  # no pods of its own: its runtime's are checked with the runtime
    elif jobset_spec_of(document) is not None:
        for rj in jobset_spec_of(document)["replicatedJobs"]:
            job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-{rj['name']}-0"},
                   "spec": rj["template"]["spec"]}
            if core:
                core_check(job)
            last = rj["template"]["spec"]["completions"] - 1
            assert len(f"{name}-{rj['name']}-0-{last}") <= 63  # each pod's hostname is one DNS label
    else:
        spec = document["spec"]
        assert set(spec["tfReplicaSpecs"]) <= TFJOB_REPLICA_TYPES
        assert spec["runPolicy"]["cleanPodPolicy"] in TFJOB_CLEAN_POD_POLICIES
        for replica_type, replica in spec["tfReplicaSpecs"].items():
            assert replica["restartPolicy"] in TFJOB_RESTART_POLICIES
            containers = replica["template"]["spec"]["containers"]
            assert [c["name"] for c in containers] == ["tensorflow"]  # the operator injects TF_CONFIG only there
            assert [p["name"] for p in containers[0]["ports"]] == ["tfjob-port"]
            assert len(f"{name}-{replica_type.lower()}-{replica['replicas'] - 1}") <= 63
    for role, template in pod_templates(document) if core else ():
        core_check({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{name}-{role.lower()}"},
                    "template": template})


@pytest.mark.slow
def test_every_generated_manifest_is_valid(tmp_path: Path) -> None:
    checked = 0
    for label, source in _sources(tmp_path):
        for fmt in ("jobset", "tfjob", "trainjob"):
            if fmt == "tfjob" and label == "ps-and-evaluator":
                continue  # refused on purpose (test_export_cli)
            # kubernetes-validate reads its schema files on every call: the second variant, which
            # changes only the metadata (and the runtime's kind), is checked against the CRD alone.
            for core, options in ((True, {"image": "img:1"}),
                                  (False, {"image": "img:1", "name": "x", "namespace": "default",
                                           **({"cluster_runtime": True} if fmt == "trainjob" else {})})):
                for document in _documents(source, fmt, **options):
                    check_document(document, core)
                    checked += 1
    # Per source and variant: one JobSet, one TFJob (but for ps-and-evaluator), a runtime and a TrainJob.
    assert checked == 2 * (4 * (len(FILE_CLUSTERS) + len(LOCAL_CLUSTERS)) - 1)


def test_full_kubernetes_section_reaches_every_pod(tmp_path: Path) -> None:
    path = tmp_path / "full.yaml"
    path.write_text(FILE_CLUSTERS["gpus-and-section"])
    for fmt in ("jobset", "tfjob", "trainjob"):
        document, *trainjob = _documents(ClusterFileSource(str(path)), fmt)
        check_document(document)
        assert {k: v for k, v in document["metadata"].items() if k != "labels"} == {"name": "mnist",
                                                                                     "namespace": "ml-team"}
        for other in trainjob:
            check_document(other)
            assert other["metadata"] == {"name": "mnist", "namespace": "ml-team"}
        for role, template in pod_templates(document):
            pod = template["spec"]
            (container,) = pod["containers"]
            assert container["image"] == "registry.example.com/team/train:1.0"
            assert container["imagePullPolicy"] == "IfNotPresent"
            assert container["workingDir"] == "/app"
            assert container["ports"][0]["containerPort"] == 2345
            gpus = 2 if role.lower() == "worker" else 0
            expected = {"cpu": "500m", "memory": "2Gi", **({"nvidia.com/gpu": gpus} if gpus else {})}
            assert container["resources"] == {"requests": expected, "limits": expected}
            assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4", "pool": "1"}
            assert pod["tolerations"] == [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute", "tolerationSeconds": 30},
                {"operator": "Exists"}]
            assert pod["serviceAccountName"] == "trainer"
            assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}, {"name": "other.secret"}]
            env = {e["name"]: e.get("value") for e in container["env"]}
            # Kubernetes would expand $(NOT_EXPANDED); the manifest escapes it so the pod sees it as written.
            assert env["PRICE"] == "$$(NOT_EXPANDED)" and env["DATA_DIR"] == "/data"
            assert env["CUDA_VISIBLE_DEVICES"] == ("0,1" if gpus else "-1")  # renumbered as the container sees them
            args = container.get("args") or container["command"]
            assert args[0] == "/opt/venv/bin/python"  # kubernetes.python stands in for "python"


def test_validation_is_not_vacuous(tmp_path: Path) -> None:
    """The same checks refuse a wrong quantity, an unknown field and a wrong type."""
    (document,) = _documents(LocalSource(2), "jobset", image="img:1")
    container = document["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    bad = copy.deepcopy(document)
    bad_container = bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    bad_container["resources"] = {"limits": {"cpu": "two"}}
    assert any("does not match" in e for e in crd_errors(bad))
    bad = copy.deepcopy(document)
    bad["spec"]["replicatedJobs"][0]["replica"] = 2
    assert any("replica" in e for e in crd_errors(bad))
    bad = copy.deepcopy(document)
    bad["spec"]["failurePolicy"]["maxRestarts"] = "2"
    assert crd_errors(bad)
    with pytest.raises(kubernetes_validate.ValidationError):
        core_check({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                    "template": {"spec": {"containers": [{**container, "imagePullPolicy": 3}]}}})
    (tfjob,) = _documents(LocalSource(2), "tfjob", image="img:1")
    tfjob["spec"]["tfReplicaSpecs"]["Worker"]["replica"] = 2
    assert crd_errors(tfjob)


def test_quantity_rule_is_the_crd_rule() -> None:
    """The section reader refuses exactly the resource values the CRDs' schemas refuse."""
    patterns = {json.dumps(p) for p in _find_patterns(load_crd("JobSet"), "x-kubernetes-int-or-string")}
    assert json.dumps(QUANTITY.pattern) in patterns


def _find_patterns(schema: Any, marker: str) -> list[str]:
    found: list[str] = []
    if isinstance(schema, dict):
        if schema.get(marker) and "pattern" in schema:
            found.append(schema["pattern"])
        for value in schema.values():
            found += _find_patterns(value, marker)
    elif isinstance(schema, list):
        for value in schema:
            found += _find_patterns(value, marker)
    return found


@pytest.mark.slow
def test_manifests_with_gpus_are_valid(tmp_path: Path) -> None:
    """``--gpus N``: each chief and worker pod's GPU limit, valid for the CRDs and for Kubernetes."""
    sources = [LocalSource(2, chief=True, ps=1), LocalSource(3)]
    for source in sources:
        for fmt in ("jobset", "tfjob", "trainjob"):
            documents = _documents(source, fmt, image="img:1", gpus=2)
            for document in documents:
                check_document(document)
            limits = [c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
                      for document in documents for _, template in pod_templates(document)
                      for c in template["spec"]["containers"]]
            assert limits and set(limits) <= {2, None} and 2 in limits, (fmt, limits)
