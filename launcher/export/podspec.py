"""The pod template every format shares: the training container and the pod-level settings.

With ``kubernetes.storage``, the pods of the chief, the workers and the evaluator mount one volume
at the same path (:data:`STORAGE_VOLUME`), where the plan puts checkpoints and backups. Hidden
variables (passed by name, or a secret's name) come from the plan's Secret, never as values.

Kubernetes expands ``$(NAME)`` in a container's command, args and env values, so every string
that goes there is escaped (:func:`escape`) and reaches the process exactly as the plan wrote it.
"""

from __future__ import annotations

import re
from typing import Any

from .pods import STORAGE_ROLES, PodPlan, RolePods
from .settings import GPU_RESOURCE, Storage, Toleration

CONTAINER_NAME = "tensorflow"  # the name the training operator requires; JobSet uses it too for one kubectl -c
STORAGE_VOLUME = "tflaunch-storage"
PORT_NAME = "tfjob-port"  # the training operator reads TensorFlow's port from the container port of this name

# Kubernetes reads "$$" as "$" and "$(NAME)" as a reference; a "$" before "$" or "(" is doubled.
_EXPANDABLE = re.compile(r"\$(?=[$(])")


def escape(text: str) -> str:
    """``text`` written so that Kubernetes' ``$(VAR)`` expansion gives back ``text`` itself."""
    return _EXPANDABLE.sub("$$", text)


def container(plan: PodPlan, role: RolePods, *, command: list[str], args: list[str] | None = None,
              extra_env: list[dict[str, Any]] | None = None, name: str = CONTAINER_NAME) -> dict[str, Any]:
    """The training container of ``role``'s pods."""
    settings = plan.settings
    spec: dict[str, Any] = {"name": name, "image": settings.image}
    if settings.image_pull_policy:
        spec["imagePullPolicy"] = settings.image_pull_policy
    spec["command"] = [escape(a) for a in command]
    if args:
        spec["args"] = [escape(a) for a in args]
    if settings.workdir:
        spec["workingDir"] = settings.workdir
    env = [_env_var(plan, k, v, k in role.hidden) for k, v in sorted(role.env.items())]
    spec["env"] = list(extra_env or []) + env
    spec["ports"] = [{"name": PORT_NAME, "containerPort": settings.port, "protocol": "TCP"}]
    resources = _resources(plan, role)
    if resources:
        spec["resources"] = resources
    if mounts_storage(plan, role):
        spec["volumeMounts"] = [{"name": STORAGE_VOLUME, "mountPath": plan.settings.storage.path}]
    return spec


def _env_var(plan: PodPlan, name: str, value: str, hidden: bool) -> dict[str, Any]:
    """One container variable; a hidden one (passed by name, or a secret's name) is the key of the
    same name in the plan's Secret, so its value is in no manifest."""
    if hidden:
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": plan.secret_name, "key": name}}}
    return {"name": name, "value": escape(value)}


def mounts_storage(plan: PodPlan, role: RolePods) -> bool:
    return plan.settings.storage is not None and role.role in STORAGE_ROLES


def _volume(storage: Storage) -> dict[str, Any]:
    if storage.claim:
        return {"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": storage.claim}}
    return {"name": STORAGE_VOLUME, "emptyDir": {}}


def _resources(plan: PodPlan, role: RolePods) -> dict[str, Any]:
    # Requests equal to limits: a synchronous cluster runs at the pace of its slowest task, so a
    # throttled or evicted pod holds every other one back.
    amounts: dict[str, Any] = {}
    if plan.settings.cpu:
        amounts["cpu"] = plan.settings.cpu
    if plan.settings.memory:
        amounts["memory"] = plan.settings.memory
    if role.gpus:
        amounts[GPU_RESOURCE] = role.gpus
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def pod_spec(plan: PodPlan, role: RolePods, containers: list[dict[str, Any]],
             restart_policy: str | None = "Never") -> dict[str, Any]:
    """The pod-level settings of ``role``'s pods: scheduling, identity, image pull secrets and storage."""
    settings = plan.settings
    spec: dict[str, Any] = {}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    spec["containers"] = containers
    if settings.storage and mounts_storage(plan, role):
        spec["volumes"] = [_volume(settings.storage)]
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        spec["tolerations"] = [_toleration(t) for t in settings.tolerations]
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    return spec


def _toleration(toleration: Toleration) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if toleration.key is not None:
        out["key"] = toleration.key
    out["operator"] = toleration.operator
    if toleration.value is not None:
        out["value"] = toleration.value
    if toleration.effect is not None:
        out["effect"] = toleration.effect
    if toleration.toleration_seconds is not None:
        out["tolerationSeconds"] = toleration.toleration_seconds
    return out
