"""The cluster as one TFJob (kubeflow.org/v1) for the Kubeflow training operator.

The operator starts one pod per replica of ``tfReplicaSpecs`` (Chief, Worker, PS, Evaluator) and
writes TF_CONFIG itself, into the container named ``tensorflow`` only, with the port of that
container's ``tfjob-port``. So the container gets the plan's env without TF_CONFIG (and without
TFLAUNCH_TASK, TFLAUNCH_ATTEMPT and TFLAUNCH_RANK, which differ from pod to pod; the trainer reads
its task from TF_CONFIG, and a rank is TensorFlow's id of the task in it).

Run policy: the operator restarts a failed pod in place (``restartPolicy: OnFailure``) for a role
whose tflaunch policy is ``task`` (ParameterServer workers by default), and for every role when
whole-cluster restarts are allowed, which the operator cannot do; otherwise a failed pod fails the
job (``Never``). ``runPolicy.backoffLimit`` is the budget of all those restarts together:
``max_restarts`` plus ``task_restarts`` for each task restarted alone. The chief's success (the
operator's default), or every worker's when there is no chief, ends the job, and
``cleanPodPolicy: Running`` then removes the pods still running (ps, evaluator), as ``tflaunch
run`` stops them.
"""

from __future__ import annotations

from typing import Any

from ..cluster.spec import RestartPolicy
from ..errors import ConfigError
from .pods import PodPlan, RolePods
from .podspec import container, pod_spec
from ..records.states import Role

API_VERSION = "kubeflow.org/v1"
REPLICA_TYPES = {Role.CHIEF: "Chief", Role.WORKER: "Worker", Role.PS: "PS", Role.EVALUATOR: "Evaluator"}


def pod_host(name: str, role: str, index: int) -> str:
    """The operator's service name for a replica (it writes these names into TF_CONFIG itself)."""
    return f"{name}-{role}-{index}"


def restart_policy(role: RolePods, max_restarts: int) -> str:
    """A replica's restartPolicy: in place on any failure when the role may restart, else never.

    Any failure, not only a signal (``ExitCode``): when one TensorFlow task dies its peers exit 1
    with connection errors, and those must come back too for the cluster to form again.
    """
    return "OnFailure" if role.restart is RestartPolicy.TASK or max_restarts else "Never"


def backoff_limit(plan: PodPlan) -> int:
    in_place = sum(role.count for role in plan.roles if role.restart is RestartPolicy.TASK)
    return plan.max_restarts + plan.task_restarts * in_place


def check_tfjob(plan: PodPlan, source: str) -> None:
    """Refuse a cluster the operator would start in a way that hangs."""
    if plan.role(Role.PS) and plan.role(Role.EVALUATOR):
        # The operator puts the evaluator into every task's TF_CONFIG cluster (unlike tflaunch's plan).
        raise ConfigError(source, "evaluator",
                          "the training operator puts the evaluator into the chief's TF_CONFIG, where a "
                          "ParameterServerStrategy chief waits for it forever (TensorFlow issue 46169); "
                          "expected --format jobset, or no evaluator")


def tfjob(plan: PodPlan) -> dict[str, Any]:
    """The TFJob object for ``plan``."""
    metadata: dict[str, Any] = {"name": plan.name}
    if plan.settings.namespace:
        metadata["namespace"] = plan.settings.namespace
    spec: dict[str, Any] = {}
    if plan.role(Role.CHIEF) is None:
        spec["successPolicy"] = "AllWorkers"  # tflaunch's rule without a chief: every worker must finish
    spec["runPolicy"] = {"backoffLimit": backoff_limit(plan), "cleanPodPolicy": "Running"}
    spec["tfReplicaSpecs"] = {
        REPLICA_TYPES[role.role]: {
            "replicas": role.count,
            "restartPolicy": restart_policy(role, plan.max_restarts),
            # The operator sets the pod's restartPolicy from the replica spec's.
            "template": {"spec": pod_spec(plan, role, [container(plan, role, command=list(plan.argv))],
                                          restart_policy=None)},
        }
        for role in plan.roles
    }
    return {"apiVersion": API_VERSION, "kind": "TFJob", "metadata": metadata, "spec": spec}
