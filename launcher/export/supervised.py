"""The cluster as one JobSet whose pods run tflaunch (``export --supervised``): every pod runs the
same ``tflaunch --nodes-from kubernetes --nnodes N ...`` and pod 0 owns the run
(:mod:`launcher.sources.joined`), so a Kubernetes run gets the merged log, the run record, the
watchdogs and tflaunch's restarts.

One replicated job, ``node``, of N pods (one per task of the plan, so one task per pod), whose
stable DNS names JobSet gives as for the plain export (``<name>-node-0-<index>.<name>``). The roles
are carved out of the pods by tflaunch as with ``-H`` (``--chief``, ``--ps``, ``--evaluator``).
The run folder goes under the storage the export mounts (``<path>/<name>/runs``); without
storage it stays in pod 0. The token every pod proves comes from the Secret ``<name>-rdzv``.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Any

from ..records.folder import MERGED, RECORD
from ..records.states import Role
from ..taskenv import RDZV_TOKEN
from .jobset import API_VERSION
from .jobset import pod_host as jobset_host
from .pods import PodPlan
from .podspec import container, pod_spec

JOB = "node"  # the one replicated job
TOKEN_SECRET_SUFFIX = "rdzv"
TOKEN_KEY = "token"


def pod_host(name: str, role: str, index: int) -> str:
    """The plain export's name for a task's pod (``<name>-<role>-0-<index>``, never shorter than a
    ``node`` pod's): a placeholder in the plan, since the pods' tflaunch places the tasks itself."""
    return jobset_host(name, role, index)


def token_secret(plan: PodPlan) -> str:
    return f"{plan.name}-{TOKEN_SECRET_SUFFIX}"


def node_count(plan: PodPlan) -> int:
    return sum(role.count for role in plan.roles)


def tflaunch_argv(plan: PodPlan) -> list[str]:
    """What every pod runs: the same tflaunch command, its rank from the pod's index."""
    roles: list[str] = []
    ps = plan.role(Role.PS)
    if plan.role(Role.CHIEF) is not None and ps is None:
        roles.append("--chief")
    if ps is not None:
        roles += ["--ps", str(ps.count)]
    if plan.role(Role.EVALUATOR) is not None:
        roles.append("--evaluator")
    storage = plan.settings.storage
    log_dir = ["--log-dir", f"{storage.path.rstrip('/')}/{plan.name}/runs"] if storage else []
    return ["tflaunch", "--nodes-from", "kubernetes", "--nnodes", str(node_count(plan)), *roles,
            "--max-restarts", str(plan.max_restarts), *log_dir, "--", *plan.argv]


def supervised_jobset(plan: PodPlan) -> dict[str, Any]:
    """The JobSet object: N pods, each running tflaunch, pod 0 the run's owner."""
    template = plan.role(Role.WORKER) or plan.roles[0]
    # No variable of the plan goes into the pods: tflaunch in pod 0 plans each task's own.
    pods = replace(template, env={}, hidden=frozenset())
    token = {"name": RDZV_TOKEN, "valueFrom": {"secretKeyRef": {"name": token_secret(plan), "key": TOKEN_KEY}}}
    main = container(plan, pods, command=tflaunch_argv(plan), extra_env=[token])
    count = node_count(plan)
    job = {"completionMode": "Indexed", "completions": count, "parallelism": count,
           # a pod that fails fails the Job: JobSet starts every pod again, a new rendezvous
           "backoffLimit": 0, "podReplacementPolicy": "Failed", "template": {"spec": pod_spec(plan, pods, [main])}}
    metadata: dict[str, Any] = {"name": plan.name}
    if plan.settings.namespace:
        metadata["namespace"] = plan.settings.namespace
    spec = {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True, "subdomain": plan.name},
            "failurePolicy": {"maxRestarts": plan.max_restarts},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [JOB]},
            "replicatedJobs": [{"name": JOB, "replicas": 1, "template": {"spec": job}}]}
    return {"apiVersion": API_VERSION, "kind": "JobSet", "metadata": metadata, "spec": spec}


def supervised_notes(plan: PodPlan) -> list[str]:
    """What to do before applying it, and what differs from the plain JobSet."""
    notes = [f"every pod proves the token in the Secret {token_secret(plan)}; create it first: kubectl create secret "
             f"generic {token_secret(plan)} --from-literal={TOKEN_KEY}=$(python3 -c "
             f"{shlex.quote('import secrets; print(secrets.token_hex(16))')})",
             "the image must hold tflaunch (pip install it there): every pod runs it"]
    if plan.settings.storage is None:
        notes.append(f"no kubernetes.storage: the run folder ({RECORD}, {MERGED}) stays in pod 0, gone with it")
    return notes
