"""``kubernetes.storage`` and ``export --env``: one volume where checkpoints and backups outlive a pod.

The setting's reader names file, key and value for a bad entry; every Kubernetes format mounts the
volume at the same path in the chief, worker and evaluator pods (not ps), and points the trainer's
checkpoint and backup directories there, which the trainer's own argument parser then reads from
the pod's env. Without shared storage, a cluster with an evaluator or restarts gets notes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.errors import ConfigError
from launcher.export import ExportRequest, export
from launcher.export.settings import Storage, read_settings
from launcher.sources.file import ClusterFileSource
from test_export_schema import check_document, pod_templates
from trainer.cli import parse_args

pytestmark = pytest.mark.unit

SOURCE = "clusters/k.yaml"
CLUSTER = """
chief: [localhost:auto]
worker: [localhost:auto, localhost:auto]
ps: [localhost:auto]
evaluator: [localhost:auto]
"""
NO_PS = "chief: [localhost:auto]\nworker: [localhost:auto]\nevaluator: [localhost:auto]\n"


def storage_error(section: object) -> str:
    with pytest.raises(ConfigError) as info:
        read_settings({"storage": section}, SOURCE)
    return str(info.value)


def test_storage_setting() -> None:
    assert read_settings({"storage": {"claim": "ckpt"}}, SOURCE).storage == Storage(path="/ckpt", claim="ckpt")
    assert read_settings({"storage": {"empty_dir": True, "path": "/data/ck/"}}, SOURCE).storage == Storage("/data/ck")
    assert read_settings({}, SOURCE).storage is None


@pytest.mark.parametrize("section, message", [
    ({}, "kubernetes.storage: expected 'claim: NAME' (an existing PersistentVolumeClaim) or 'empty_dir: true'"),
    ({"empty_dir": False}, "kubernetes.storage: expected 'claim: NAME'"),
    ({"claim": "c", "empty_dir": True}, "kubernetes.storage.empty_dir: expected either claim or empty_dir, got both "
                                        "(claim 'c')"),
    ({"claim": "My_Claim"}, "kubernetes.storage.claim: expected a PersistentVolumeClaim name: lowercase letters, "
                            "digits, '-' and '.', got 'My_Claim'"),
    ({"empty_dir": "yes"}, "kubernetes.storage.empty_dir: expected true or false, got 'yes'"),
    ({"claim": "c", "path": "ckpt"}, "kubernetes.storage.path: expected an absolute path without spaces or ':' in "
                                     "the container, other than /, got 'ckpt'"),
    ({"claim": "c", "path": "/"}, "kubernetes.storage.path: expected an absolute path"),
    ({"claim": "c", "mount": "/x"}, "kubernetes.storage.mount: unknown key"),
    ("pvc", "kubernetes.storage: expected a mapping with 'claim: NAME' or 'empty_dir: true', and 'path', got 'pvc'"),
])
def test_bad_storage_names_file_key_and_value(section: object, message: str) -> None:
    assert storage_error(section).startswith(f"{SOURCE}: {message}")


def documents(tmp_path: Path, text: str, fmt: str, **options: Any) -> tuple[list[dict], tuple[str, ...]]:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    result = export(ExportRequest(source=ClusterFileSource(str(path)), format=fmt, image="i", **options))
    return [d for d in yaml.safe_load_all(result.text) if d], result.notes


def pods_by_role(document: dict) -> dict[str, dict]:
    return {role.lower(): template["spec"] for role, template in pod_templates(document)}


@pytest.mark.parametrize("fmt", ["jobset", "tfjob", "trainjob"])
def test_every_format_mounts_storage_in_chief_worker_and_evaluator_pods(tmp_path: Path, fmt: str) -> None:
    text = (NO_PS if fmt == "tfjob" else CLUSTER) + "max_restarts: 2\nkubernetes: {storage: {claim: team-ckpt}}\n"
    docs, notes = documents(tmp_path, text, fmt)
    for document in docs:
        check_document(document, core=fmt == "trainjob")
    pods = pods_by_role(docs[0])
    assert {"chief", "worker", "evaluator"} <= set(pods)
    for role, pod in pods.items():
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        if role == "ps":  # a ps task keeps variables in memory and writes no file
            assert "volumes" not in pod and "volumeMounts" not in container
            continue
        assert pod["volumes"] == [{"name": "tflaunch-storage", "persistentVolumeClaim": {"claimName": "team-ckpt"}}]
        assert container["volumeMounts"] == [{"name": "tflaunch-storage", "mountPath": "/ckpt"}]
        # The trainer reads its checkpoint and backup folders from these variables.
        args = parse_args([], environ=env)
        assert args.checkpoint_dir == "/ckpt/c/checkpoints", role
        assert args.backup_dir == "/ckpt/c/backup", role
    assert not [n for n in notes if "storage" in n or "evaluator:" in n or "from scratch" in n], notes


def test_empty_dir_is_mounted_but_noted(tmp_path: Path) -> None:
    docs, notes = documents(tmp_path, NO_PS + "max_restarts: 1\nkubernetes: {storage: {empty_dir: true, path: /s}}\n",
                            "jobset")
    check_document(docs[0], core=False)
    for pod in pods_by_role(docs[0]).values():
        assert pod["volumes"] == [{"name": "tflaunch-storage", "emptyDir": {}}]
        assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == "/s"
    assert ("kubernetes.storage: empty_dir gives each pod a directory of its own at /s, so the evaluator never sees "
            "the checkpoints the chief writes to /s/c/checkpoints; expected 'claim: NAME' (a PersistentVolumeClaim "
            "the chief and evaluator pods both mount)") in notes
    assert ("kubernetes.storage: with empty_dir a replaced pod starts with an empty /s, so restarted pods "
            "(max_restarts) train from scratch; 'claim: NAME' keeps the backup") in notes


def test_without_storage_notes_say_what_will_not_work(tmp_path: Path) -> None:
    _, notes = documents(tmp_path, "chief: [localhost:auto]\nworker: [localhost:auto]\nps: [localhost:auto]\n", "jobset")
    # ParameterServer workers restart alone by default: their backup has nowhere to survive.
    assert ("restart_policy: restarted pods train from scratch: the backup they would resume from needs a volume that "
            "outlives a pod; set kubernetes.storage ('claim: NAME')") in notes
    docs, notes = documents(tmp_path, "worker: [localhost:auto, localhost:auto]\n", "jobset")
    assert not [n for n in notes if "storage" in n], notes
    assert "volumes" not in pods_by_role(docs[0])["worker"]
    # Storage the user names in env is their choice: no note, and no backup folder of tflaunch's.
    _, notes = documents(tmp_path, NO_PS + "max_restarts: 1\n", "tfjob",
                         env={"TFLAUNCH_BACKUP_DIR": "/nfs/b", "TFLAUNCH_CHECKPOINT_DIR": "/nfs/c"})
    assert not [n for n in notes if "storage" in n], notes


def test_env_option_wins_over_every_env_layer(tmp_path: Path) -> None:
    text = """
env: {A: file, B: file}
chief: [localhost:auto]
worker: [{host: localhost, port: auto, env: {A: task}}]
kubernetes: {env: {A: kubernetes, C: kubernetes}}
"""
    for fmt in ("jobset", "tfjob", "trainjob"):
        docs, _ = documents(tmp_path, text, fmt, env={"A": "cli", "D": "cli"})
        for role, pod in pods_by_role(docs[0]).items():
            env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
            assert (env["A"], env["B"], env["C"], env["D"]) == ("cli", "file", "kubernetes", "cli"), (fmt, role)
    docs, _ = documents(tmp_path, text, "jobset")
    env = {e["name"]: e.get("value") for e in pods_by_role(docs[0])["chief"]["containers"][0]["env"]}
    assert env["A"] == "kubernetes"  # without --env, kubernetes.env wins over the cluster's env
    with pytest.raises(ConfigError, match="^--env: TFLAUNCH_TASK: is set by tflaunch for every task"):
        documents(tmp_path, text, "sh", env={"TFLAUNCH_TASK": "x"})
