"""The ``kubernetes:`` section of a cluster file, plus command-line overrides, as validated settings.

Every value is checked the way the Kubernetes API server would check it (names are DNS labels,
resources are quantities such as ``500m`` or ``8Gi``), so a manifest tflaunch prints is never
refused for a value the user wrote. Errors name the file, the key path and the bad value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from ..cluster.fields import FieldReader, show
from ..errors import ConfigErrors

SECTION = "kubernetes"
KEYS = ("image", "name", "namespace", "port", "python", "workdir", "resources", "node_selector", "tolerations",
        "service_account", "image_pull_secrets", "image_pull_policy", "env", "storage")
STORAGE_KEYS = ("claim", "empty_dir", "path")
DEFAULT_STORAGE_PATH = "/ckpt"
RESOURCE_KEYS = ("cpu", "memory")
TOLERATION_KEYS = ("key", "operator", "value", "effect", "toleration_seconds")
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")

DEFAULT_PORT = 2222  # TensorFlow's port in the Kubeflow operator and most TF-on-Kubernetes examples
DEFAULT_PYTHON = "python3"  # every Python image has python3; not all have python
GPU_RESOURCE = "nvidia.com/gpu"

# Kubernetes' resource.Quantity grammar, as the CRDs' openAPIV3Schema spell it.
QUANTITY = re.compile(r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
# RFC 1123 labels (namespaces, secret names) and RFC 1035 labels (names that become DNS host labels).
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A label key: an optional DNS subdomain prefix and a name of at most 63 characters.
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Toleration:
    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


@dataclass(frozen=True)
class Storage:
    """A volume the chief, worker and evaluator pods all mount at ``path``."""

    path: str = DEFAULT_STORAGE_PATH
    claim: str | None = None  # an existing PersistentVolumeClaim; None: an emptyDir, private to each pod

    @property
    def shared(self) -> bool:
        """Whether pods see each other's files (and files outlive a pod): only a claim does that."""
        return self.claim is not None


@dataclass(frozen=True)
class KubernetesSettings:
    """What the manifests need beyond the cluster itself; None/empty means "Kubernetes' default"."""

    image: str | None = None
    name: str | None = None
    namespace: str | None = None
    port: int = DEFAULT_PORT
    python: str = DEFAULT_PYTHON
    workdir: str | None = None
    cpu: str | None = None
    memory: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    service_account: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    image_pull_policy: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    storage: Storage | None = None  # None: no volume; checkpoints stay inside each pod


def read_settings(section: Any, source: str) -> KubernetesSettings:
    """The validated ``kubernetes:`` section of ``source`` (None: no section)."""
    return _SectionReader(source).read(section)


def with_overrides(settings: KubernetesSettings, source: str, *, image: str | None = None,
                   name: str | None = None, namespace: str | None = None) -> KubernetesSettings:
    """``settings`` with the command-line options that were given; they win over the file."""
    reader = _SectionReader(source)
    if image is not None:
        settings = replace(settings, image=reader.read_image(image, "--image"))
    if name is not None:
        settings = replace(settings, name=reader.read_name(name, "--name"))
    if namespace is not None:
        settings = replace(settings, namespace=reader.read_label(namespace, "--namespace", "a namespace"))
    return settings


class _SectionReader(FieldReader):
    def read(self, section: Any) -> KubernetesSettings:
        """The settings; every mistake in the section is raised together (one line each, in its order)."""
        if section is None:
            return KubernetesSettings()
        mapping = self.expect_mapping(section, SECTION, "a mapping of Kubernetes settings")
        collect = self.collect
        collect(lambda: self.check_keys(mapping, KEYS, SECTION), None)
        key = SECTION + "."
        get = mapping.get
        resources = collect(lambda: self._read_resources(get("resources")), {})
        settings = KubernetesSettings(
            image=None if get("image") is None else collect(lambda: self.read_image(get("image"), key + "image"), None),
            name=None if get("name") is None else collect(lambda: self.read_name(get("name"), key + "name"), None),
            namespace=None if get("namespace") is None else collect(lambda: self.read_label(
                get("namespace"), key + "namespace", "a namespace"), None),
            port=DEFAULT_PORT if get("port") is None else collect(lambda: self.read_fixed_port(
                get("port"), key + "port", "the port every pod listens on"), DEFAULT_PORT),
            python=collect(lambda: self.optional_str(mapping, "python", SECTION), None) or DEFAULT_PYTHON,
            workdir=collect(lambda: self._read_workdir(get("workdir")), None),
            cpu=resources.get("cpu"),
            memory=resources.get("memory"),
            node_selector=collect(lambda: self._read_node_selector(get("node_selector")), {}),
            tolerations=collect(lambda: self._read_tolerations(get("tolerations")), ()),
            service_account=None if get("service_account") is None else collect(lambda: self._read_subdomain(
                get("service_account"), key + "service_account", "a service account name"), None),
            image_pull_secrets=collect(lambda: self._read_pull_secrets(get("image_pull_secrets")), ()),
            image_pull_policy=None if get("image_pull_policy") is None else collect(lambda: self._read_choice(
                get("image_pull_policy"), key + "image_pull_policy", PULL_POLICIES), None),
            env=collect(lambda: self.read_env(get("env"), key + "env"), {}),
            storage=collect(lambda: self._read_storage(get("storage")), None),
        )
        if self.problems:
            order = {str(name): place for place, name in enumerate(mapping)}
            raise ConfigErrors.of(sorted(self.problems, key=lambda e: order.get(
                re.split(r"[.\[]", e.key.removeprefix(key))[0], -1)))
        return settings

    def read_image(self, value: Any, key: str) -> str:
        image = self.expect_str(value, key)
        if any(c.isspace() for c in image):
            raise self.fail(key, f"expected a container image reference without spaces, got {image!r}")
        return image

    def read_name(self, value: Any, key: str) -> str:
        name = self.expect_str(value, key)
        if not DNS1035_LABEL.match(name) or len(name) > 63:
            raise self.fail(key, f"expected a lowercase name of letters, digits and '-', starting with a letter "
                                 f"(it becomes part of each pod's DNS name), got {name!r}")
        return name

    def read_label(self, value: Any, key: str, what: str) -> str:
        label = self.expect_str(value, key)
        if not DNS1123_LABEL.match(label) or len(label) > 63:
            raise self.fail(key, f"expected {what}: at most 63 lowercase letters, digits and '-', got {label!r}")
        return label

    def _read_subdomain(self, value: Any, key: str, what: str) -> str:
        name = self.expect_str(value, key)
        if not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
            raise self.fail(key, f"expected {what}: lowercase letters, digits, '-' and '.', got {name!r}")
        return name

    def _read_choice(self, value: Any, key: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(key, f"expected one of {', '.join(choices)}, got {show(value)}")
        return value

    def _read_workdir(self, value: Any) -> str | None:
        if value is None:
            return None
        workdir = self.expect_str(value, f"{SECTION}.workdir")
        if not workdir.startswith("/"):
            raise self.fail(f"{SECTION}.workdir", f"expected an absolute path in the image, got {workdir!r}")
        return workdir

    def _read_resources(self, value: Any) -> dict[str, str]:
        if value is None:
            return {}
        key = f"{SECTION}.resources"
        mapping = self.expect_mapping(value, key, "a mapping with cpu and memory")
        self.check_keys(mapping, RESOURCE_KEYS, key)
        return {name: self._read_quantity(raw, f"{key}.{name}", name) for name, raw in mapping.items()
                if raw is not None}

    def _read_quantity(self, value: Any, key: str, what: str) -> str:
        example = "2, 500m or 1.5" if what == "cpu" else "8Gi, 512Mi or 4G"
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(key, f"expected a Kubernetes quantity such as {example}, got {show(value)}")
        text = _written(value)
        if not QUANTITY.match(text):
            raise self.fail(key, f"expected a Kubernetes quantity such as {example}, got {text!r}")
        if text.startswith("-"):
            raise self.fail(key, f"expected a quantity >= 0, got {text!r}")
        return text

    def _read_node_selector(self, value: Any) -> dict[str, str]:
        if value is None:
            return {}
        key = f"{SECTION}.node_selector"
        mapping = self.expect_mapping(value, key, "a mapping of node label to value")
        selector: dict[str, str] = {}
        for label, raw in mapping.items():
            name = str(label)
            if not _label_key_ok(name):
                raise self.fail(key, f"expected node label keys such as 'kubernetes.io/arch', got {show(label)}")
            if isinstance(raw, bool):
                raw = "true" if raw else "false"
            text = "" if raw is None else _written(raw)
            if not isinstance(raw, (str, int, float, type(None))) or len(text) > 63 or not LABEL_VALUE.match(text):
                raise self.fail(f"{key}.{name}", f"expected a label value (at most 63 letters, digits, '-', '_', '.'), "
                                                 f"got {show(raw)}")
            selector[name] = text
        return selector

    def _read_tolerations(self, value: Any) -> tuple[Toleration, ...]:
        if value is None:
            return ()
        key = f"{SECTION}.tolerations"
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list of tolerations, got {show(value)}")
        tolerations = []
        for i, raw in enumerate(value):
            item_key = f"{key}[{i}]"
            mapping = self.expect_mapping(raw, item_key, "a toleration mapping (key, operator, value, effect)")
            self.check_keys(mapping, TOLERATION_KEYS, item_key)
            operator = self._read_choice(mapping.get("operator", "Equal"), f"{item_key}.operator", TOLERATION_OPERATORS)
            taint_key = self.optional_str(mapping, "key", item_key)
            if taint_key is not None and not _label_key_ok(taint_key):
                raise self.fail(f"{item_key}.key", f"expected a taint key such as 'nvidia.com/gpu', got {taint_key!r}")
            if taint_key is None and operator != "Exists":
                raise self.fail(f"{item_key}.key", "missing; expected a taint key (only operator Exists may omit it)")
            value_text = self.optional_str(mapping, "value", item_key)
            if operator == "Exists" and value_text is not None:
                raise self.fail(f"{item_key}.value", "expected no value with operator Exists")
            effect = mapping.get("effect")
            seconds = mapping.get("toleration_seconds")
            if seconds is not None:
                seconds = int(self.read_count(seconds, f"{item_key}.toleration_seconds"))
                if effect != "NoExecute":
                    raise self.fail(f"{item_key}.toleration_seconds", "only applies with effect NoExecute")
            tolerations.append(Toleration(
                key=taint_key, operator=operator, value=value_text,
                effect=None if effect is None else self._read_choice(effect, f"{item_key}.effect", TOLERATION_EFFECTS),
                toleration_seconds=seconds))
        return tuple(tolerations)

    def _read_storage(self, value: Any) -> Storage | None:
        if value is None:
            return None
        key = f"{SECTION}.storage"
        mapping = self.expect_mapping(value, key, "a mapping with 'claim: NAME' or 'empty_dir: true', and 'path'")
        self.check_keys(mapping, STORAGE_KEYS, key)
        claim = None
        if mapping.get("claim") is not None:
            claim = self._read_subdomain(mapping["claim"], f"{key}.claim", "a PersistentVolumeClaim name")
        empty_dir = False if mapping.get("empty_dir") is None else self.read_bool(mapping["empty_dir"],
                                                                                  f"{key}.empty_dir")
        if claim and empty_dir:
            raise self.fail(f"{key}.empty_dir", f"expected either claim or empty_dir, got both (claim {claim!r})")
        if not claim and not empty_dir:
            raise self.fail(key, "expected 'claim: NAME' (an existing PersistentVolumeClaim) or 'empty_dir: true'")
        path = DEFAULT_STORAGE_PATH
        if mapping.get("path") is not None:
            path = self.expect_str(mapping["path"], f"{key}.path").rstrip("/")
            if not path.startswith("/") or any(c.isspace() for c in path) or ":" in path:
                raise self.fail(f"{key}.path", f"expected an absolute path without spaces or ':' in the "
                                               f"container, other than /, got {mapping['path']!r}")
        return Storage(path=path, claim=claim)

    def _read_pull_secrets(self, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        key = f"{SECTION}.image_pull_secrets"
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list of secret names, got {show(value)}")
        return tuple(self._read_subdomain(v, f"{key}[{i}]", "a secret name") for i, v in enumerate(value))


def _written(value: Any) -> str:
    """A scalar as the file wrote it: the cluster loader keeps numbers' text (``0.50`` stays "0.50")."""
    return getattr(value, "text", None) or str(value)


def _label_key_ok(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_NAME.match(name))
