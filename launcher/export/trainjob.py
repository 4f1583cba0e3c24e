"""The cluster as a Kubeflow Trainer v2 runtime and the TrainJob that runs it (trainer.kubeflow.org/v1alpha1).

Trainer v2 has no TensorFlow runtime of its own; a runtime is a JobSet template plus an ``mlPolicy``,
and the controller turns each TrainJob into a JobSet named after the TrainJob. So the runtime here
holds the same JobSet spec as :mod:`.jobset`: one Indexed Job per role, each pod building its
TF_CONFIG from its index and its peers' stable DNS names, with the same run policy (``backoffLimit``,
``backoffLimitPerIndex``, ``failurePolicy.maxRestarts``, ``successPolicy``).

What the Trainer API fixes: the replicated job labelled as the ``trainer`` step must be one Job
with a container named ``node``; that step is the chief and workers' training role (the workers,
or the chief alone), its pod count is ``mlPolicy.numNodes``. Every role's container is called
``node``, so ``kubectl logs -c node`` works for all. The TrainJob sets no ``spec.trainer``: its
image, command, env and numNodes would reach the trainer step only, leaving the other roles' pods
out of step with it. The JobSet subdomain is left to JobSet (its name); pods refuse to start under
a TrainJob of another name, because their TF_CONFIG names the peers by this one.
"""

from __future__ import annotations

from typing import Any

from .jobset import jobset_spec
from .pods import PodPlan, RolePods
from ..records.states import Role

API_VERSION = "trainer.kubeflow.org/v1alpha1"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_STEP = "trainer"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
TRAINER_CONTAINER = "node"  # the container the Trainer requires in its trainer step


def pod_host(name: str, role: str, index: int) -> str:
    """The DNS name of a pod of the TrainJob's JobSet (named after the TrainJob), as in a JobSet export."""
    return f"{name}-{role}-0-{index}.{name}"


def trainer_step(plan: PodPlan) -> RolePods:
    """The role the ``trainer`` step label goes on: the workers, or the chief when there are none."""
    return plan.role(Role.WORKER) or plan.roles[0]


def runtime_kind(cluster_runtime: bool) -> str:
    return "ClusterTrainingRuntime" if cluster_runtime else "TrainingRuntime"


def runtime(plan: PodPlan, cluster_runtime: bool = False) -> dict[str, Any]:
    """The TrainingRuntime (namespaced) or ClusterTrainingRuntime (cluster-wide) for ``plan``."""
    metadata: dict[str, Any] = {"name": plan.name}
    if plan.settings.namespace and not cluster_runtime:
        metadata["namespace"] = plan.settings.namespace
    metadata["labels"] = {FRAMEWORK_LABEL: "tensorflow"}
    step = trainer_step(plan)
    spec = jobset_spec(plan, container_name=TRAINER_CONTAINER, subdomain=False,
                       job_labels={step.role: {ANCESTOR_LABEL: TRAINER_STEP}}, check_name=True)
    return {
        "apiVersion": API_VERSION,
        "kind": runtime_kind(cluster_runtime),
        "metadata": metadata,
        # No framework policy: Trainer has none for TensorFlow, and the pods set TF_CONFIG themselves.
        "spec": {"mlPolicy": {"numNodes": step.count}, "template": {"spec": spec}},
    }


def trainjob(plan: PodPlan, cluster_runtime: bool = False) -> dict[str, Any]:
    """The TrainJob that runs ``plan``'s runtime; its name is the JobSet's, which TF_CONFIG names."""
    metadata: dict[str, Any] = {"name": plan.name}
    if plan.settings.namespace:
        metadata["namespace"] = plan.settings.namespace
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": {"runtimeRef": {"name": plan.name, "apiGroup": "trainer.kubeflow.org",
                                "kind": runtime_kind(cluster_runtime)}},
    }


def trainjob_notes(plan: PodPlan, cluster_runtime: bool) -> list[str]:
    """What the Trainer API cannot say about the cluster, one line each."""
    step = trainer_step(plan).role
    notes = [f"trainjob: the restart policy lives in the runtime (failurePolicy.maxRestarts {plan.max_restarts}, "
             "per-role backoff limits); a TrainJob has no restart settings of its own",
             f"trainjob: spec.trainer of the TrainJob (image, command, env, numNodes) would change the {step} "
             "pods alone; export again to change the cluster"]
    if cluster_runtime:
        notes.append(f"trainjob: the ClusterTrainingRuntime {plan.name} serves only a TrainJob named {plan.name}, "
                     "since TF_CONFIG names the pods by it")
    return notes
