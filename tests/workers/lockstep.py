"""A stand-in for a TensorFlow task, standard library only: the launcher's tests run it instead of TensorFlow.

    python lockstep.py [--epochs E] [--steps S] [--batch-per-worker B] [--step-seconds X] [--report both|keras]
                       [--backup-every-steps N] [--step-metrics] [--connect-timeout S]

It keeps the contract a TensorFlow task keeps with tflaunch:

- it reads ``TF_CONFIG``, listens on its own address's port and meets its peers over TCP at the
  addresses ``TF_CONFIG`` gives (a full mesh; a peer that is not up yet is retried until
  ``--connect-timeout``);
- chief and workers step in lock step, as under MultiWorkerMirroredStrategy: every step ends in an
  exchange with every peer (:func:`all_reduce`, a sum over sockets), so one slow task slows all; the
  main thread waits in a socket read (``peers.read_exactly``) while a peer is late, and an input thread
  (:func:`slow_source`) feeds it. A step's own time (``--step-seconds``) is spent as a TensorFlow
  task's is, waiting for its executor's threads or its device (:func:`step_work`), never asleep:
  tflaunch counts a sleeping thread as a stalled input pipeline. A peer that goes away ends the task with exit code 1 and one line
  (``peers.PEER_LOST_EXIT`` seconds later), as TensorFlow's collectives do. With ``ps`` tasks in the
  cluster (ParameterServerStrategy) the chief drives each step against every worker and ps, which
  serve until stopped and are reached again when one restarts in place; an evaluator idles until the
  chief's model is saved, evaluates it (a ``"kind":"eval"`` metric line) and ends;
- it prints Keras's epoch lines (``Epoch 1/3`` and ``5/5 [====...] - 0s 10ms/step - loss: ...``) and
  tflaunch's metric lines (``TFLAUNCH_METRIC {"kind":"epoch",...}``, the trainer's fields; ``--report
  keras`` prints Keras's lines only), the same figures in every task;
- it backs up to ``TFLAUNCH_BACKUP_DIR`` after every epoch (and every ``--backup-every-steps``
  steps), written by the task that speaks for the run (chief-0, else worker-0), and resumes from it
  (``resuming from backup at epoch N``); under another worker count it keeps the backup's global
  batch and resumes at the start of its epoch, saying so as the trainer does;
- the chief (chief-0, else worker-0) saves the model to ``TFLAUNCH_CHECKPOINT_DIR`` (when set) at the end.

Knobs, by environment: each holds ``VALUE`` for every task, or ``NAME=VALUE`` entries separated by
commas for some (NAME a task, ``worker-1``, or a host name):

- ``LOCKSTEP_INPUT_SLEEP=S``: the input thread sleeps S seconds per step;
- ``LOCKSTEP_INPUT_STALL=N``: the input thread stalls for good (in ``slow_source``) after N steps;
- ``LOCKSTEP_COMPUTE=S``: each step computes (spins the CPU) for S seconds;
- ``LOCKSTEP_CRASH=N:CODE[:every]``: exit with CODE at global step N (counted from 1 over the epochs),
  in the first attempt only unless ``every``;
- ``LOCKSTEP_HANG=N``: at global step N, in the first attempt, the main thread waits for good in
  :func:`hang_in_exchange` before it joins the exchange (``LOCKSTEP_HANG_LOG=1``: it logs a retry line
  every second meanwhile);
- ``LOCKSTEP_SILENT=S``: before training, a busy phase of S seconds that prints nothing, ending with
  ``<task>: silent steps in S s``;
- ``LOCKSTEP_STRAY=1``: starts a grandchild that leaves the process group (``setsid``) and sleeps;
  prints ``STRAY <pid>``;
- ``LOCKSTEP_IGNORE_TERM=1``: ignores SIGTERM;
- ``LOCKSTEP_FLOOD=N``: prints N lines of filler per step.

Before it stops for good (a hang, a stall) a task prints ``STALLED <time>``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from peers import FRAME, all_reduce, dial, listen, mesh, read_frame, serve

METRIC_PREFIX = "TFLAUNCH_METRIC "  # tflaunch's metric line (launcher/records/metrics.py holds the contract)
BACKUP_FILE = "lockstep.json"
LEARNING_RATE = 0.1
_keep: list = []  # the stray grandchild, kept from being collected


def say(text: str) -> None:
    print(text, flush=True)


def metric(record: dict) -> None:
    say(METRIC_PREFIX + json.dumps(record, separators=(",", ":")))


def knob(name: str, me: str, default: str | None = None) -> str | None:
    """This task's value of knob LOCKSTEP_<name>: a bare value for every task, or NAME=VALUE entries."""
    raw = os.environ.get(f"LOCKSTEP_{name}")
    if raw is None:
        return default
    if "=" not in raw:
        return raw
    names = {me, socket.gethostname()}
    for entry in raw.split(","):
        who, _, value = entry.partition("=")
        if who.strip() in names:
            return value.strip()
    return default


class Task:
    """This task as TF_CONFIG describes it."""

    def __init__(self) -> None:
        config = json.loads(os.environ.get("TF_CONFIG") or '{"cluster": {}, "task": {}}')
        self.cluster: dict[str, list[str]] = config.get("cluster") or {}
        task = config.get("task") or {}
        self.type, self.index = task.get("type", "worker"), int(task.get("index", 0))
        self.name = os.environ.get("TFLAUNCH_TASK") or f"{self.type}-{self.index}"
        self.trainers = [(kind, i, address) for kind in ("chief", "worker")
                         for i, address in enumerate(self.cluster.get(kind, []))]
        self.servers = [(kind, i, address) for kind in ("worker", "ps")
                        for i, address in enumerate(self.cluster.get(kind, []))] if "ps" in self.cluster else []
        self.attempt = int(os.environ.get("TFLAUNCH_ATTEMPT", "1") or 1)

    def address(self) -> str | None:
        addresses = self.cluster.get(self.type, [])
        return addresses[self.index] if self.index < len(addresses) else None

    @property
    def speaks(self) -> bool:
        """The task that backs up and saves: chief-0, else worker-0 (or the only task)."""
        first = self.trainers[0] if self.trainers else ("worker", 0, "")
        return (self.type, self.index) == first[:2] or not self.trainers

    def rank(self) -> int:
        return next(n for n, (kind, i, _) in enumerate(self.trainers) if (kind, i) == (self.type, self.index))


def hang_in_exchange(me: str, log: bool) -> None:
    say(f"STALLED {time.time():.3f}")
    while True:
        if log:
            say(f"{me}: the exchange's barrier is not there yet; retrying in 1 s")
        time.sleep(1.0)  # the task hangs here


def slow_source(batches: queue.Queue, sleep: float, stall_after: int | None) -> None:
    """The input thread: one batch per step, after ``sleep`` s each."""
    produced = 0
    while True:
        if stall_after is not None and produced >= stall_after:
            say(f"STALLED {time.time():.3f}")
            while True:
                time.sleep(3600)  # the input pipeline stalls here
        if sleep:
            time.sleep(sleep)
        produced += 1
        batches.put(produced)


_executor_done = threading.Event()  # never set: what a step's own work waits on


def step_work(seconds: float) -> None:
    """A step's own work of ``seconds``: the main thread waits on a condition (a futex), as a
    TensorFlow task's waits for its executor's threads or its GPU; a sleep would read as a stall."""
    _executor_done.wait(seconds)


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(2000))


def keras_bar(steps: int, seconds: float, loss: float, accuracy: float) -> str:
    per_step = seconds / max(steps, 1) * 1000
    return (f"{steps}/{steps} [==============================] - {int(seconds)}s {per_step:.0f}ms/step"
            f" - loss: {loss:.4f} - accuracy: {accuracy:.4f}")


def read_backup(directory: str | None) -> dict | None:
    if not directory:
        return None
    path = Path(directory) / BACKUP_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_backup(directory: str, record: dict) -> None:
    path = Path(directory) / BACKUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{BACKUP_FILE}.{os.getpid()}")
    part.write_text(json.dumps(record))
    os.replace(part, path)  # a reader sees the old backup or the new one, never half of one


def start_stray(me: str) -> None:
    child = subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(600)"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _keep.append(child)
    say(f"STRAY {child.pid}")


def train(task: Task, args: argparse.Namespace) -> None:
    me, server = task.name, listen(task.address()) if task.address() else None
    trainers = [(f"{kind}-{i}", address) for kind, i, address in task.trainers]
    peers = mesh(trainers, task.rank(), server, args.connect_timeout) if server is not None else {}
    say(f"{me}: cluster formed with {len(task.trainers) or 1} training tasks")
    workers = len(task.trainers) or 1
    silent = float(knob("SILENT", me, "0"))
    if silent:
        started = time.monotonic()
        steps = 0
        while True:
            spin(0.2)
            steps += 1
            # every task sees the same sum, so all stop after the same step
            if all_reduce(peers, -steps, 1.0 if time.monotonic() - started > silent else 0.0) > 0:
                break
        say(f"{me}: {steps} silent steps in {time.monotonic() - started:.1f} s")
    backup_dir = os.environ.get("TFLAUNCH_BACKUP_DIR")
    found = read_backup(backup_dir)
    global_batch = found["global_batch"] if found else args.batch_per_worker * workers
    weight, epoch, step = 1.0, 0, 0
    if found:
        weight, epoch, step = found["weight"], found["epoch"], found["step"]
        if found["workers"] != workers:
            step = 0
            say(f"trainer: the backup was written by {found['workers']} workers, this attempt has {workers}: "
                f"resuming at the start of epoch {epoch + 1} with the same global batch {global_batch} "
                f"({global_batch // workers} per replica)")
        say(f"trainer: resuming from backup at epoch {epoch + 1}" + (f" step {step + 1}" if step else ""))
    batches: queue.Queue = queue.Queue(maxsize=2)
    stall = knob("INPUT_STALL", me)
    threading.Thread(target=slow_source, name="input", daemon=True,
                     args=(batches, float(knob("INPUT_SLEEP", me, "0")), int(stall) if stall else None)).start()
    compute, flood = float(knob("COMPUTE", me, "0")), int(knob("FLOOD", me, "0"))
    crash, hang = knob("CRASH", me), knob("HANG", me)
    crash_at, crash_code, crash_every = (crash.split(":") + [""])[:3] if crash else (None, None, None)
    report_metrics = args.report == "both"
    total_started = time.monotonic()
    while epoch < args.epochs:
        say(f"Epoch {epoch + 1}/{args.epochs}")
        started, loss = time.monotonic(), 0.0
        while step < args.steps:
            global_step = epoch * args.steps + step + 1
            batches.get()  # waits for the input thread
            if compute:
                spin(compute)
            if args.step_seconds:
                step_work(args.step_seconds)
            for line in range(flood):
                say(f"{me}: filler line {line} of step {global_step}")
            if crash_at is not None and global_step == int(crash_at) and (crash_every or task.attempt == 1):
                say(f"{me}: crashing at step {global_step} with exit code {crash_code}")
                sys.exit(int(crash_code))
            if hang is not None and global_step == int(hang) and task.attempt == 1:
                hang_in_exchange(me, knob("HANG_LOG", me) == "1")
            gradient = weight * (1.0 + 0.01 * ((global_step * 7) % 5))
            weight -= LEARNING_RATE * all_reduce(peers, global_step, gradient) / workers
            loss = weight * weight
            step += 1
            if args.step_metrics:
                metric({"kind": "step", "step": global_step})
            if backup_dir and task.speaks and args.backup_every_steps and step % args.backup_every_steps == 0 \
                    and step < args.steps:
                write_backup(backup_dir, {"epoch": epoch, "step": step, "weight": weight,
                                          "global_batch": global_batch, "workers": workers})
        seconds = time.monotonic() - started
        accuracy = 1.0 / (1.0 + loss)
        if report_metrics:  # before Keras's bar, as a callback's line comes before it
            metric({"kind": "epoch", "epoch": epoch + 1, "epochs": args.epochs, "loss": loss, "accuracy": accuracy,
                    "epoch_seconds": round(seconds, 3),
                    "samples_per_second": round(global_batch * args.steps / seconds, 1) if seconds else None,
                    "global_batch": global_batch, "replicas": workers})
        say(keras_bar(args.steps, seconds, loss, accuracy))
        epoch, step = epoch + 1, 0
        if backup_dir and task.speaks:
            write_backup(backup_dir, {"epoch": epoch, "step": 0, "weight": weight, "global_batch": global_batch,
                                      "workers": workers})
    all_reduce(peers, 0, 0.0)  # every task ends together, as a cluster that finished its last step
    if report_metrics:
        metric({"kind": "final", "test_loss": weight * weight, "test_accuracy": 1.0 / (1.0 + weight * weight),
                "total_seconds": round(time.monotonic() - total_started, 3), "epochs": args.epochs})
    if task.speaks:
        save(weight, args.epochs)
    say(f"{me}: done")


def save(weight: float, epochs: int) -> None:
    """The chief's model, to TFLAUNCH_CHECKPOINT_DIR when it is set."""
    checkpoints = os.environ.get("TFLAUNCH_CHECKPOINT_DIR")
    if checkpoints:
        path = Path(checkpoints) / "model.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".model.json.{os.getpid()}")
        part.write_text(json.dumps({"weight": weight, "epochs": epochs}))
        os.replace(part, path)
        say(f"trainer: saved the model to {path}")


def coordinate(task: Task, args: argparse.Namespace) -> None:
    """The chief of a ParameterServer cluster: each step goes to every server, redialled when one restarts."""
    deadline = time.monotonic() + args.connect_timeout
    servers = {f"{kind}-{i}": address for kind, i, address in task.servers}
    conns = {name: dial(address, 0, deadline) for name, address in servers.items()}
    say(f"{task.name}: cluster formed with {len(servers)} servers")
    weight = 1.0
    for epoch in range(args.epochs):
        say(f"Epoch {epoch + 1}/{args.epochs}")
        started = time.monotonic()
        for step in range(args.steps):
            global_step = epoch * args.steps + step + 1
            if args.step_seconds:
                step_work(args.step_seconds)
            for name in servers:
                while True:
                    try:
                        conns[name].sendall(FRAME.pack(global_step, weight))
                        read_frame(conns[name])
                        break
                    except (OSError, EOFError):
                        say(f"{task.name}: {name} went away; reaching it again")
                        conns[name].close()
                        conns[name] = dial(servers[name], 0, time.monotonic() + args.connect_timeout)
            weight *= 1.0 - LEARNING_RATE
        seconds = time.monotonic() - started
        loss = weight * weight
        if args.report == "both":
            metric({"kind": "epoch", "epoch": epoch + 1, "epochs": args.epochs, "loss": loss,
                    "accuracy": 1.0 / (1.0 + loss), "epoch_seconds": round(seconds, 3),
                    "global_batch": args.batch_per_worker, "replicas": len(task.cluster.get("worker", []))})
        say(keras_bar(args.steps, seconds, loss, 1.0 / (1.0 + loss)))
    save(weight, args.epochs)
    say(f"{task.name}: done")


def evaluate(task: Task, seconds: float) -> None:
    """An evaluator: idles until the chief's saved model is in TFLAUNCH_CHECKPOINT_DIR, evaluates it for
    ``seconds`` and ends. Without that folder it idles until stopped."""
    checkpoints = os.environ.get("TFLAUNCH_CHECKPOINT_DIR")
    say(f"{task.name}: idle")
    path = Path(checkpoints) / "model.json" if checkpoints else None
    while path is None or not path.exists():
        time.sleep(0.2)
    model = json.loads(path.read_text())
    time.sleep(seconds)
    loss = model["weight"] ** 2
    metric({"kind": "eval", "epoch": model["epochs"], "checkpoint": path.name, "val_loss": loss,
            "val_accuracy": 1.0 / (1.0 + loss), "eval_seconds": 0.0, "final": True, "test_loss": loss,
            "test_accuracy": 1.0 / (1.0 + loss)})
    say(f"{task.name}: done after {path.name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="steps per epoch")
    parser.add_argument("--batch-per-worker", type=int, default=32)
    parser.add_argument("--step-seconds", type=float, default=0.02, help="each step's own time (a wait, not a sleep)")
    parser.add_argument("--report", choices=["both", "keras"], default="both")
    parser.add_argument("--backup-every-steps", type=int, default=0)
    parser.add_argument("--step-metrics", action="store_true", help="a metric line per step too")
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    parser.add_argument("--eval-seconds", type=float, default=0.0, help="an evaluator's time on the final model")
    args = parser.parse_args(argv)
    task = Task()
    if knob("IGNORE_TERM", task.name) == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if knob("STRAY", task.name) == "1":
        start_stray(task.name)
    if task.type == "evaluator":
        evaluate(task, args.eval_seconds)
    elif task.type == "ps" or (task.servers and task.type == "worker"):
        say(f"{task.name}: serving")
        serve(task.address())
    elif task.servers:
        coordinate(task, args)
    else:
        train(task, args)


if __name__ == "__main__":
    main()
