"""The cluster as one JobSet (jobset.x-k8s.io/v1alpha2): one replicated job per role.

Each role is one Indexed Job whose pods get stable DNS names from JobSet,
``<name>-<role>-0-<index>.<name>``. A pod's TF_CONFIG is built when it starts, by a POSIX ``sh``
script, from its role (fixed in the template) and its index (``JOB_COMPLETION_INDEX``, set by
Kubernetes), so the image needs nothing but a shell. The TF_CONFIG text comes from the plan: the
script is the plan's TF_CONFIG for the role with the index left open, and export checks that it
reproduces the plan for every index.

Run policy, as ``tflaunch run`` does it, per role: under the ``cluster`` policy a failed pod fails
its Job (``backoffLimit: 0``); under ``task`` (ParameterServer workers by default) Kubernetes
replaces the failed pod alone, with the same index and DNS name, up to ``task_restarts`` times
(``backoffLimitPerIndex``), and the Job fails after that. A failed Job makes JobSet recreate the
whole cluster, up to ``max_restarts`` times. The job succeeds when the chief finishes (with ps
tasks) or when the chief and every worker finish; JobSet then removes the pods still running
(ps, evaluator).
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Mapping

from ..cluster.ranks import deciding_roles
from ..cluster.spec import RestartPolicy
from ..taskenv import ATTEMPT, RANK, TASK
from .pods import PodPlan, RolePods
from .podspec import CONTAINER_NAME, container, pod_spec
from ..records.states import Role

API_VERSION = "jobset.x-k8s.io/v1alpha2"
INDEX_ENV = "JOB_COMPLETION_INDEX"  # Kubernetes sets it in every pod of an Indexed Job
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"  # 0 for the first run, +1 per JobSet restart
RESTART_ATTEMPT_ENV = "JOBSET_RESTART_ATTEMPT"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # JobSet labels every pod with its JobSet's name
JOBSET_NAME_ENV = "JOBSET_NAME"
_INDEX_MARK = "\x00tflaunch-index\x00"


def pod_host(name: str, role: str, index: int) -> str:
    """The DNS name JobSet gives pod ``index`` of the role's only Job: ``<pod hostname>.<subdomain>``."""
    return f"{name}-{role}-0-{index}.{name}"


def jobset(plan: PodPlan) -> dict[str, Any]:
    """The JobSet object for ``plan``."""
    metadata: dict[str, Any] = {"name": plan.name}
    if plan.settings.namespace:
        metadata["namespace"] = plan.settings.namespace
    return {"apiVersion": API_VERSION, "kind": "JobSet", "metadata": metadata, "spec": jobset_spec(plan)}


def jobset_spec(plan: PodPlan, *, container_name: str = CONTAINER_NAME, subdomain: bool = True,
                job_labels: Mapping[str, Mapping[str, str]] | None = None,
                check_name: bool = False) -> dict[str, Any]:
    """The JobSet's spec: one replicated job per role.

    ``subdomain`` False leaves the pods' DNS subdomain to JobSet (its own name), for a template
    whose JobSet is named by someone else; ``job_labels`` labels a role's Job template;
    ``check_name`` makes each pod refuse to start under a JobSet not named ``plan.name``, since
    its TF_CONFIG names the peers by that name.
    """
    has_ps = plan.role(Role.PS) is not None
    deciding = deciding_roles(has_ps)
    deciders = [r.role for r in plan.roles if r.role in deciding]
    # Peers' names must resolve before they are ready: TensorFlow dials them while starting.
    network: dict[str, Any] = {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    if subdomain:
        network["subdomain"] = plan.name
    return {
        "network": network,
        "failurePolicy": {"maxRestarts": plan.max_restarts},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": deciders},
        "replicatedJobs": [_replicated_job(plan, role, container_name, (job_labels or {}).get(role.role), check_name)
                           for role in plan.roles],
    }


def _replicated_job(plan: PodPlan, role: RolePods, container_name: str, labels: Mapping[str, str] | None,
                    check_name: bool) -> dict[str, Any]:
    env_from_pod = [{"name": RESTART_ATTEMPT_ENV,
                     "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{RESTART_ATTEMPT_LABEL}']"}}}]
    if check_name:
        env_from_pod.append({"name": JOBSET_NAME_ENV,
                             "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_NAME_LABEL}']"}}})
    script = start_script(role, jobset_name=plan.name if check_name else None)
    main = container(plan, role, command=["/bin/sh", "-c", script, "tflaunch-start"],
                     args=list(plan.argv), extra_env=env_from_pod, name=container_name)
    job: dict[str, Any] = {"completionMode": "Indexed", "completions": role.count, "parallelism": role.count}
    if role.restart is RestartPolicy.TASK:
        # The pod alone comes back, same index and DNS name, as ParameterServerStrategy allows.
        job.update(backoffLimitPerIndex=plan.task_restarts, maxFailedIndexes=0)
    else:
        # One failed pod fails the Job, and JobSet restarts the whole cluster: the collective
        # cannot take back a single replaced task mid-training.
        job["backoffLimit"] = 0
    # A replacement starts only once its predecessor is gone (TensorFlow refuses a duplicate task).
    job["podReplacementPolicy"] = "Failed"
    job["template"] = {"spec": pod_spec(plan, role, [main])}
    template: dict[str, Any] = {"spec": job}
    if labels:
        template = {"metadata": {"labels": dict(labels)}, **template}
    return {"name": role.role, "replicas": 1, "template": template}


def start_script(role: RolePods, jobset_name: str | None = None) -> str:
    """POSIX sh that exports this pod's TF_CONFIG, TFLAUNCH_TASK, TFLAUNCH_ATTEMPT and (chief and
    workers) TFLAUNCH_RANK, then execs the command.

    With ``jobset_name``, the pod first checks that its JobSet has that name (the peers' DNS
    names in TF_CONFIG start with it).
    """
    before, after = tf_config_template(role)
    index = f"${INDEX_ENV}"
    lines = [f"# This {role.role} pod's TF_CONFIG, from its index in the Job (written by tflaunch export)."]
    if jobset_name:
        name = shlex.quote(jobset_name)
        lines += [
            f'if [ "${JOBSET_NAME_ENV}" != {name} ]; then',
            f"  echo \"tflaunch: this pod's JobSet is '${JOBSET_NAME_ENV}'; expected {jobset_name}, the name its "
            f"TF_CONFIG was exported for (tflaunch export --name)\" >&2; exit 2",
            "fi",
        ]
    return "\n".join(lines + [
        f'i="{index}"',
        'case "$i" in',
        f"  ''|*[!0-9]*) echo \"tflaunch: {INDEX_ENV} is '$i'; expected the pod's index in an Indexed Job\" >&2; exit 2;;",
        "esac",
        f"export TF_CONFIG={shlex.quote(before)}\"$i\"{shlex.quote(after)}",
        f'export {TASK}="{role.role}-$i"',
        f"export {ATTEMPT}=$((${{{RESTART_ATTEMPT_ENV}:-0}} + 1))",
        *([] if role.rank_offset is None else [f"export {RANK}=$((i + {role.rank_offset}))"]),
        'exec "$@"',
        "",
    ])


def tf_config_template(role: RolePods) -> tuple[str, str]:
    """The JSON text of the role's TF_CONFIG before and after the task index.

    Taken from the plan's TF_CONFIG of the role's first task; every other task's must be the same
    with its own index, since one template serves the whole role.
    """
    first = role.tf_config(0)
    for position, launch in enumerate(role.launches):
        if launch.index != position or role.tf_config(position) != _with_index(first, position):
            raise ValueError(f"the plan's TF_CONFIG of {launch.name} is not the {role.role} template with its index")
    text = json.dumps(_with_index(first, _INDEX_MARK), separators=(",", ":"))
    before, mark, after = text.partition(json.dumps(_INDEX_MARK))
    if not mark:
        raise ValueError("TF_CONFIG has no task index")
    return before, after


def _with_index(tf_config: dict, index: object) -> dict:
    return {**tf_config, "task": {**tf_config["task"], "index": index}}
