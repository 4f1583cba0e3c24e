"""A real Ray cluster of several nodes on this machine, for the tests (ray.cluster_utils.Cluster):
a head that runs no work (0 CPUs) and NODES worker nodes of 1 CPU each, small object stores.

    python ray_cluster.py NODES

It prints ``address <GCS address>`` once the nodes are up, then answers one command per line of
its stdin with one line of JSON:

- ``add CPUS GPUS``: a new node (GPUS logical GPUs: Ray gives them out without checking hardware);
  its node id;
- ``remove ID``: the node with that id dies (its raylet and workers killed); its id;
- ``nodes``: the worker nodes alive, each ``{"id": ..., "address": ...}``;
- ``state``: what Ray's state says of the jobs' leftovers: ``groups`` (each placement group's state)
  and ``actors`` (the names of the actors alive), through a driver connection of its own.

EOF on stdin ends every process of the cluster. Ray runs in this process, not in pytest's, so that
its signal handlers and threads stay out of the tests.
"""

from __future__ import annotations

import json
import sys

from ray.cluster_utils import Cluster

STORE = 80 << 20  # bytes of object store per node: the tests pass no objects


def main() -> None:
    import ray
    from ray._private import state as ray_state
    from ray.util.placement_group import placement_group_table

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "object_store_memory": STORE})
    nodes = {}
    try:
        for _ in range(int(sys.argv[1])):
            node = cluster.add_node(num_cpus=1, object_store_memory=STORE)
            nodes[node.node_id] = node
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="tests", log_to_driver=False, logging_level="ERROR")
        print(f"address {cluster.address}", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "add":
                node = cluster.add_node(num_cpus=int(words[1]), num_gpus=int(words[2]), object_store_memory=STORE)
                nodes[node.node_id] = node
                cluster.wait_for_nodes()
                answer = node.node_id
            elif words[0] == "remove":
                cluster.remove_node(nodes.pop(words[1]))
                answer = words[1]
            elif words[0] == "nodes":
                answer = [{"id": n["NodeID"], "address": n["NodeManagerAddress"]} for n in ray.nodes()
                          if n["Alive"] and n["NodeID"] in nodes]
            elif words[0] == "state":
                groups = {pg_id: pg["state"] for pg_id, pg in placement_group_table().items()}
                actors = sorted(a["Name"] for a in ray_state.actors().values() if a["State"] != "DEAD")
                answer = {"groups": groups, "actors": actors}
            else:
                answer = f"unknown command {words[0]!r}"
            print(json.dumps(answer), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
