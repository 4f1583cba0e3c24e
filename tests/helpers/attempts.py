"""A task for watching a restarted run while it runs: it ticks until the test lets its round end.

    python attempts.py GATES LAST [FAILING] [--in-place]

A round is an attempt of the cluster (TFLAUNCH_ATTEMPT), or with ``--in-place`` how many times this
task has started (counted in ``GATES/starts-<task>``), for tasks restarted alone. Every task prints
an epoch metric line (epoch = its round: each round makes training progress), then
``<task> round <n> tick <i> at <unix time>`` ten times a second until the file ``GATES/end-<n>``
exists. Then, in rounds before LAST, the task FAILING (default worker-1) exits 1, which restarts it
(or the cluster); the others go on ticking. Once ``GATES/end-<LAST>`` exists every task exits 0.
"""

import json
import os
import sys
import time


def main(gates, last, failing="worker-1", mode=""):
    me, last = os.environ["TFLAUNCH_TASK"], int(last)
    if mode == "--in-place":
        with open(os.path.join(gates, f"starts-{me}"), "a+") as starts:
            starts.write("started\n")
            starts.seek(0)
            round_ = len(starts.readlines())
    else:
        round_ = int(os.environ["TFLAUNCH_ATTEMPT"])
    print("TFLAUNCH_METRIC " + json.dumps({"kind": "epoch", "epoch": round_, "loss": 1.0 / round_}), flush=True)
    tick = 0
    while True:
        print(f"{me} round {round_} tick {tick} at {time.time():.3f}", flush=True)
        tick += 1
        if os.path.exists(os.path.join(gates, f"end-{last}")):
            return 0
        if me == failing and round_ < last and os.path.exists(os.path.join(gates, f"end-{round_}")):
            return 1
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
