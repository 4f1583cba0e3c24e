"""--nodes-from: each platform's own variables, as that platform sets them, to N, R and rank 0's address."""

from __future__ import annotations

import pytest

from launcher.errors import ConfigError, OptionsError
from launcher.sources.platforms import DEFAULT_PORT, NodesFound, nodes_from

pytestmark = pytest.mark.unit

# What each platform sets on the second of three nodes (variable sets as their docs give them).
SKYPILOT = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "3", "SKYPILOT_NUM_GPUS_PER_NODE": "0",
            "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n10.0.0.7", "SKYPILOT_TASK_ID": "sky-2026-12-02-x"}
DSTACK = {"DSTACK_NODE_RANK": "1", "DSTACK_NODES_NUM": "3", "DSTACK_MASTER_NODE_IP": "10.1.0.2",
          "DSTACK_NODES_IPS": "10.1.0.2\n10.1.0.3\n10.1.0.4", "DSTACK_GPUS_NUM": "0"}
AWS_BATCH_CHILD = {"AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
                   "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "172.31.5.9", "AWS_BATCH_JOB_ID": "abc#1"}
SAGEMAKER = {"SM_HOSTS": '["algo-1","algo-2","algo-3"]', "SM_CURRENT_HOST": "algo-2", "SM_NETWORK_INTERFACE_NAME": "eth0",
             "SM_RESOURCE_CONFIG": '{"current_host":"algo-2","hosts":["algo-1","algo-2","algo-3"]}'}
KUBERNETES = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-1"}
SLURM = {"SLURM_NODEID": "1", "SLURM_NNODES": "3", "SLURM_LAUNCH_NODE_IPADDR": "10.2.0.1", "SLURM_JOB_ID": "42",
         "SLURM_PROCID": "1"}


@pytest.mark.parametrize("platform, environ, hostname, nnodes, expected", [
    ("skypilot", SKYPILOT, "x", None, NodesFound("skypilot", 3, 1, "10.0.0.5")),
    ("dstack", DSTACK, "x", None, NodesFound("dstack", 3, 1, "10.1.0.2")),
    ("aws-batch", AWS_BATCH_CHILD, "x", None, NodesFound("aws-batch", 3, 1, "172.31.5.9")),
    ("sagemaker", SAGEMAKER, "algo-2", None, NodesFound("sagemaker", 3, 1, "algo-1")),
    ("kubernetes", KUBERNETES, "train-1.train.default.svc.cluster.local", 3,
     NodesFound("kubernetes", 3, 1, "train-0.train.default.svc.cluster.local")),
    ("slurm", SLURM, "x", None, NodesFound("slurm", 3, 1, "10.2.0.1")),
])
def test_each_platform_gives_the_count_the_rank_and_rank_0s_address(platform, environ, hostname, nnodes, expected):
    assert nodes_from(platform, environ, hostname, nnodes) == expected
    assert nodes_from("auto", environ, hostname, nnodes) == expected  # auto finds the one that is set


def test_aws_batch_main_node_is_rank_0_whatever_its_index_and_names_no_address():
    main = {"AWS_BATCH_JOB_NODE_INDEX": "2", "AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "2"}
    assert nodes_from("aws-batch", main, "x") == NodesFound("aws-batch", 3, 0, None)
    child = {**AWS_BATCH_CHILD, "AWS_BATCH_JOB_MAIN_NODE_INDEX": "2", "AWS_BATCH_JOB_NODE_INDEX": "0"}
    assert nodes_from("aws-batch", child, "x").rank == 1


def test_a_jobset_pod_name_gives_its_first_pods_name():
    found = nodes_from("kubernetes", {"JOB_COMPLETION_INDEX": "2"}, "run-workers-0-2.run", 4)
    assert found.host == "run-workers-0-0.run" and found.rank == 2


@pytest.mark.parametrize("platform, environ, hostname, nnodes, words", [
    ("skypilot", {**SKYPILOT, "SKYPILOT_NODE_RANK": "x"}, "x", None, "SKYPILOT_NODE_RANK: expected a whole number"),
    ("skypilot", {**SKYPILOT, "SKYPILOT_NODE_RANK": "3"}, "x", None, "below the node count 3, got 3"),
    ("dstack", {**DSTACK, "DSTACK_MASTER_NODE_IP": ""}, "x", None, "DSTACK_MASTER_NODE_IP"),
    ("sagemaker", {**SAGEMAKER, "SM_HOSTS": "algo-1"}, "x", None, "SM_HOSTS: expected a JSON list"),
    ("sagemaker", {**SAGEMAKER, "SM_CURRENT_HOST": "algo-9"}, "x", None, "SM_CURRENT_HOST"),
    ("kubernetes", KUBERNETES, "somehost", 3, "expected a pod host name ending in -1"),
    ("aws-batch", {k: v for k, v in AWS_BATCH_CHILD.items() if "PRIVATE" not in k}, "x", None, "PRIVATE_IPV4"),
])
def test_a_bad_variable_is_one_error_naming_it_and_its_value(platform, environ, hostname, nnodes, words):
    with pytest.raises(ConfigError) as caught:
        nodes_from(platform, environ, hostname, nnodes)
    assert words in str(caught.value)
    assert caught.value.exit_code == 2


def test_kubernetes_needs_nnodes_and_auto_needs_exactly_one_platform():
    with pytest.raises(OptionsError, match="give --nnodes N"):
        nodes_from("kubernetes", KUBERNETES, "train-1.train")
    with pytest.raises(OptionsError, match="none of their variables is set"):
        nodes_from("auto", {"HOME": "/root"}, "x")
    with pytest.raises(OptionsError, match="skypilot, dstack are all set"):
        nodes_from("auto", {**SKYPILOT, **DSTACK}, "x")


def test_the_default_port_is_a_registered_user_port():
    assert 1024 < DEFAULT_PORT < 49152
