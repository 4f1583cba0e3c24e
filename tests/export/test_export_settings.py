"""The ``kubernetes:`` section reader: values Kubernetes accepts pass, the others name key and value."""

from __future__ import annotations

import re

import pytest

from launcher.cluster.reader import parse_cluster
from launcher.errors import ConfigError
from launcher.export import default_name
from launcher.export.settings import DEFAULT_PORT, DEFAULT_PYTHON, KubernetesSettings, Toleration, read_settings, \
    with_overrides

pytestmark = pytest.mark.unit

SOURCE = "clusters/k.yaml"


def read(section: object) -> KubernetesSettings:
    return read_settings(section, SOURCE)


def error(section: object) -> str:
    with pytest.raises(ConfigError) as info:
        read(section)
    return str(info.value)


def test_empty_section_means_kubernetes_defaults() -> None:
    assert read(None) == KubernetesSettings()
    settings = read({"image": "train:1"})
    assert (settings.port, settings.python, settings.cpu, settings.namespace) == (DEFAULT_PORT, DEFAULT_PYTHON, None, None)


@pytest.mark.parametrize("cpu", ["2", "500m", "1.5", "0.25", "+1", "1e3", "2k", ".5"])
@pytest.mark.parametrize("memory", ["8Gi", "512Mi", "4G", "1000000", "1.5Gi", "128974848e0"])
def test_quantities_kubernetes_accepts(cpu: str, memory: str) -> None:
    settings = read({"resources": {"cpu": cpu, "memory": memory}})
    assert (settings.cpu, settings.memory) == (cpu, memory)


@pytest.mark.parametrize("value", ["two", "2 cores", "1.5.0", "8GB", "8gi", "", "m", "0x10", "1_000"])
def test_quantities_kubernetes_refuses(value: str) -> None:
    assert error({"resources": {"cpu": value}}) == (
        f"{SOURCE}: kubernetes.resources.cpu: expected a Kubernetes quantity such as 2, 500m or 1.5, got {value!r}")


def test_numbers_keep_their_written_form_through_the_cluster_loader() -> None:
    spec = parse_cluster("worker: [localhost:auto]\nkubernetes: {resources: {cpu: 0.50, memory: 1e9}}\n",
                         SOURCE, frozenset({"localhost"}))
    settings = read_settings(spec.kubernetes, SOURCE)
    assert (settings.cpu, settings.memory) == ("0.50", "1e9")


def test_cluster_file_refuses_a_section_that_is_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match="kubernetes: expected a mapping of Kubernetes settings, got 'x'"):
        parse_cluster("worker: [localhost:auto]\nkubernetes: x\n", SOURCE, frozenset({"localhost"}))


@pytest.mark.parametrize("section, message", [
    ({"image": "a b"}, "kubernetes.image: expected a container image reference without spaces, got 'a b'"),
    ({"name": "1job"}, "kubernetes.name: expected a lowercase name"),
    ({"name": "job-"}, "kubernetes.name: expected a lowercase name"),
    ({"namespace": "x" * 64}, "kubernetes.namespace: expected a namespace"),
    ({"workdir": "app"}, "kubernetes.workdir: expected an absolute path in the image, got 'app'"),
    ({"port": "auto"}, "kubernetes.port: expected the port every pod listens on 1-65535, got 'auto'"),
    ({"resources": {"cpu": True}}, "kubernetes.resources.cpu: expected a Kubernetes quantity such as 2, 500m or 1.5, "
                                   "got true"),
    ({"resources": "4"}, "kubernetes.resources: expected a mapping with cpu and memory, got '4'"),
    ({"node_selector": {"bad key!": "x"}}, "kubernetes.node_selector: expected node label keys"),
    ({"node_selector": {"pool": "a b"}}, "kubernetes.node_selector.pool: expected a label value"),
    ({"tolerations": {"key": "a"}}, "kubernetes.tolerations: expected a list of tolerations, got a mapping"),
    ({"tolerations": [{"operator": "Equal"}]}, "kubernetes.tolerations[0].key: missing"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]},
     "kubernetes.tolerations[0].value: expected no value with operator Exists"),
    ({"tolerations": [{"key": "a", "effect": "NoRun"}]}, "kubernetes.tolerations[0].effect: expected one of"),
    ({"tolerations": [{"key": "a", "effect": "NoSchedule", "toleration_seconds": 5}]},
     "kubernetes.tolerations[0].toleration_seconds: only applies with effect NoExecute"),
    ({"tolerations": [{"key": "a", "efect": "NoSchedule"}]},
     "kubernetes.tolerations[0].efect: unknown key; did you mean 'effect'?"),
    ({"service_account": "Trainer"}, "kubernetes.service_account: expected a service account name"),
    ({"image_pull_secrets": [{"name": "x"}]}, "kubernetes.image_pull_secrets[0]: expected a non-empty string"),
    ({"env": {"1X": "a"}}, "kubernetes.env: expected environment variable names, got '1X'"),
    ({"nodeSelector": {}}, "kubernetes.nodeSelector: unknown key; did you mean 'node_selector'?"),
])
def test_bad_values_name_key_and_value(section: dict, message: str) -> None:
    text = error(section)
    assert text.startswith(f"{SOURCE}: {message}"), text


def test_every_mistake_of_the_section_is_listed_in_the_file_order() -> None:
    lines = error({"name": "Bad_Name", "bogus": 1, "workdir": "rel", "tolerations": 3, "image": "a b",
                   "resources": {"cpu": True}}).splitlines()
    assert [line.split(": ")[1] for line in lines] == ["kubernetes.name", "kubernetes.bogus", "kubernetes.workdir",
                                                       "kubernetes.tolerations", "kubernetes.image",
                                                       "kubernetes.resources.cpu"], lines
    assert all(line.startswith(f"{SOURCE}: ") for line in lines)


def test_scheduling_settings() -> None:
    settings = read({
        "node_selector": {"kubernetes.io/arch": "amd64", "gpu": True, "size": 8},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "spot", "value": "yes", "effect": "NoExecute", "toleration_seconds": 60}],
        "service_account": "trainer", "image_pull_secrets": "registry", "image_pull_policy": "Always",
        "env": {"A": 1, "B": True},
    })
    assert settings.node_selector == {"kubernetes.io/arch": "amd64", "gpu": "true", "size": "8"}
    assert settings.tolerations == (Toleration("nvidia.com/gpu", "Exists", None, "NoSchedule", None),
                                    Toleration("spot", "Equal", "yes", "NoExecute", 60))
    assert (settings.service_account, settings.image_pull_secrets, settings.image_pull_policy) == (
        "trainer", ("registry",), "Always")
    assert settings.env == {"A": "1", "B": "true"}


def test_command_line_wins_and_is_checked_the_same_way() -> None:
    settings = read({"image": "file:1", "name": "from-file", "namespace": "team"})
    assert with_overrides(settings, SOURCE) == settings
    winning = with_overrides(settings, SOURCE, image="cli:2", name="from-cli", namespace="other")
    assert (winning.image, winning.name, winning.namespace) == ("cli:2", "from-cli", "other")
    with pytest.raises(ConfigError, match=r"--name: expected a lowercase name .* got 'Bad'"):
        with_overrides(settings, SOURCE, name="Bad")


@pytest.mark.parametrize("label, name", [
    ("clusters/two_node.yaml", "two-node"), ("x/My Cluster.yml", "my-cluster"), ("9lives.yaml", "lives"),
    ("___.yaml", "tflaunch"),
])
def test_default_name_from_the_cluster_file(label: str, name: str) -> None:
    assert default_name(label) == name


@pytest.mark.parametrize("command, program", [
    (("python", "-m", "trainer"), "trainer"), (("python3", "-u", "My_Train.py", "--lr", "1"), "my-train"),
    (("python", "-m", "pkg.train_cnn"), "train-cnn"), (("./run.sh",), "run"), (("python", "-m", "42"), "tflaunch"),
])
def test_default_name_of_a_cluster_of_options_is_its_program_and_a_suffix(command, program) -> None:
    """--local and -H exports are told apart: the program, then 5 hex digits of what was exported."""
    name = default_name("--local 2", command)
    assert re.fullmatch(rf"{program}-[0-9a-f]{{5}}", name), name
    assert default_name("--local 2", command) == name  # the same export, the same name: kubectl apply updates it
    others = {default_name("--local 4", command), default_name("--local 2 --chief", command),
              default_name("--local 2", (*command, "--epochs", "3")), default_name("--local 2", command, ("img:2",)),
              default_name("--local 2", command, ("", 1))}
    assert name not in others and len(others) == 5


def test_a_long_program_name_keeps_its_suffix_within_a_dns_label(tmp_path) -> None:
    from launcher.export import ExportRequest, export
    from launcher.sources.local import LocalSource

    result = export(ExportRequest(source=LocalSource(2), image="i", command=("python", "x" * 80 + ".py")))
    name = result.summary.split(":")[0].removeprefix("JobSet ")
    assert re.fullmatch(r"x+-[0-9a-f]{5}", name) and len(f"{name}-worker-0-1") <= 63, name


def test_a_long_file_name_is_shortened_to_fit_pod_hostnames(tmp_path) -> None:
    from launcher.export import ExportRequest, export
    from launcher.sources.file import ClusterFileSource

    path = tmp_path / ("very-long-cluster-name-" * 4 + ".yaml")
    path.write_text("worker: [localhost:auto, localhost:auto]\nevaluator: [localhost:auto]\n")
    result = export(ExportRequest(source=ClusterFileSource(str(path)), image="i"))
    name = result.summary.split(":")[0].removeprefix("JobSet ")
    room = 63 - len("-evaluator-0-0")  # the longest pod hostname must stay one DNS label
    assert name == path.stem[:room].rstrip("-")
    assert len(f"{name}-evaluator-0-0") <= 63
