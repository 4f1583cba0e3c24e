"""A tiny task for real-process tests; behaviour is chosen per task by command-line actions.

    python task.py [ACTION ...]

Actions run in order: ``env`` prints TF_CONFIG and TFLAUNCH_* as one JSON line; ``sleep:S``;
``exit:N`` exits with N; ``exit-if:TASK:N`` exits with N only in task TASK;
``sleep-if:TASK:S``; ``print:TEXT``; ``partial:TEXT`` writes TEXT with no newline;
``stderr:TEXT``; ``child`` starts a grandchild that sleeps (to check group kills);
``signal-if:TASK:SIG`` kills itself with SIG in TASK; ``ignore-term`` ignores SIGTERM;
``forever`` sleeps until killed; ``bind`` listens on this task's TF_CONFIG port (exit 5 if
taken); ``flood:N`` writes N numbered lines, odd ones to stderr; ``metric-flood:N:SIZE`` writes N epoch
metric lines of about SIZE bytes each (epochs 1..N, each with a ``pad`` figure list); ``raw:HEX`` writes raw bytes;
``traceback-on-term`` makes SIGTERM raise, so the task ends with a Python traceback (as a
TensorFlow worker whose collective a stop broke does).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

_keep = []


def _raise_stopped(signum, frame):
    raise RuntimeError("collective operation cancelled: the task was stopped")


def main(actions):
    me = os.environ.get("TFLAUNCH_TASK", "")
    for action in actions:
        kind, _, arg = action.partition(":")
        if kind == "env":
            keys = ["TF_CONFIG", "CUDA_VISIBLE_DEVICES", "TF_NUM_INTRAOP_THREADS", "PYTHONUNBUFFERED"]
            keys += [k for k in os.environ if k.startswith(("TFLAUNCH_", "USER_"))]
            print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
        elif kind == "sleep":
            time.sleep(float(arg))
        elif kind == "exit":
            sys.exit(int(arg))
        elif kind in ("exit-if", "sleep-if", "signal-if"):
            task, _, value = arg.partition(":")
            if task == me:
                if kind == "exit-if":
                    sys.stdout.flush()
                    sys.exit(int(value))
                if kind == "sleep-if":
                    time.sleep(float(value))
                if kind == "signal-if":
                    os.kill(os.getpid(), getattr(signal, value))
        elif kind == "print":
            print(arg, flush=True)
        elif kind == "partial":
            sys.stdout.write(arg)
            sys.stdout.flush()
        elif kind == "stderr":
            print(arg, file=sys.stderr, flush=True)
        elif kind == "child":
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            print(f"CHILD {child.pid}", flush=True)
        elif kind == "traceback-on-term":
            signal.signal(signal.SIGTERM, _raise_stopped)
        elif kind == "ignore-term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif kind == "bind":
            config = json.loads(os.environ["TF_CONFIG"])
            task = config["task"]
            address = config["cluster"][task["type"]][task["index"]]
            port = int(address.rsplit(":", 1)[1])
            server = socket.socket()
            try:
                server.bind(("", port))
            except OSError as exc:
                print(f"BIND FAILED {port}: {exc}", flush=True)
                sys.exit(5)
            server.listen()
            _keep.append(server)
            print(f"BOUND {port}", flush=True)
        elif kind == "flood":
            out, err = sys.stdout, sys.stderr
            for i in range(int(arg)):
                (err if i % 2 else out).write(f"{me} line {i} {'x' * (i % 50)}\n")
            out.flush()
            err.flush()
        elif kind == "metric-flood":
            count, _, size = arg.partition(":")
            pad = [0.5] * max(0, (int(size) - 80) // 5)  # ", 0.5" is five bytes
            out = sys.stdout
            for epoch in range(1, int(count) + 1):
                record = {"kind": "epoch", "epoch": epoch, "loss": 1.0 / epoch, "pad": pad}
                out.write("TFLAUNCH_METRIC " + json.dumps(record) + "\n")
            out.flush()
        elif kind == "raw":
            sys.stdout.buffer.write(bytes.fromhex(arg))
            sys.stdout.flush()
        elif kind == "forever":
            while True:
                time.sleep(1)
        else:
            raise SystemExit(f"task.py: unknown action {action!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
