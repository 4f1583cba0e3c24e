"""Time from a task's crash to tflaunch's exit (no restarts), and to TensorFlow's own detection.

    python benchmarks/bench_crash_exit.py [--reps N] [--tf-reps M] [--skip-tf]

(a) Trivial tasks: ``tflaunch --local 2 --quiet --threads off -- python -c <CODE>``; worker-0
    reads time.time(), writes it to a file and exits 1; worker-1 sleeps. Measured: tflaunch's exit
    time minus the crash time. The run's own records split it: tflaunch's "failed" message in
    merged.log (detection) and the survivor's ended_at in run.json (stopped).
    Target: <= 1 s.
(b) Real TensorFlow MWMS, two ``python -m trainer`` workers. Once worker-1 has finished its first
    epoch this script SIGKILLs it and notes the time.
    Under tflaunch: kill time -> tflaunch exits.
    Hand-launched (same env as tflaunch adds, two fresh ports): kill time -> the surviving
    worker exits by itself (TensorFlow's heartbeat detection).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import _bench
from _bench import TFLAUNCH, median, note, table

TARGET = 1.0
CRASH_CODE = (
    "import os, sys, time\n"
    "if os.environ['TFLAUNCH_TASK'] == 'worker-0':\n"
    "    time.sleep(float(sys.argv[1]))\n"
    "    crashed = time.time()\n"
    "    with open(os.environ['BENCH_CRASH_STAMP'], 'w') as f:\n"
    "        f.write(repr(crashed))\n"
    "    os._exit(1)\n"
    "time.sleep(120)\n"
)
EPOCH_MARK = b'"kind":"epoch"'


def merged_time(line: bytes) -> float:
    """Epoch seconds of a merged.log line ("YYYY-mm-dd HH:MM:SS.mmm ...", local time)."""
    date, clock = line.split(b" ", 2)[:2]
    whole, _, millis = clock.decode().partition(".")
    return time.mktime(time.strptime(f"{date.decode()} {whole}", "%Y-%m-%d %H:%M:%S")) + int(millis or 0) / 1000


def iso_time(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


# -- (a) trivial tasks -----------------------------------------------------------------------

def trivial_once(work: Path, rep: int, delay: float) -> dict:
    log_dir = work / "logs-a"
    stamp = work / f"crash-{rep}"
    argv = [TFLAUNCH, "--local", "2", "--quiet", "--threads", "off", "--log-dir", str(log_dir),
            "--", "python", "-c", CRASH_CODE, str(delay)]
    env = {**os.environ, "BENCH_CRASH_STAMP": str(stamp)}
    with open(work / "tflaunch.console", "wb") as console:
        proc = _bench.popen(argv, cwd=work, env=env, stdout=console, stderr=console)
        rc, exited, _ = _bench.wait4(proc)
    crashed = float(stamp.read_text())
    run_dir = _bench.last_run_dir(log_dir)
    detected = None
    for line in (run_dir / "merged.log").read_bytes().splitlines():
        if b" tflaunch | " in line and b" failed (" in line:
            detected = merged_time(line)
            break
    survivor = next(t for t in _bench.read_manifest(run_dir)["tasks"] if t["name"] == "worker-1")
    stopped = iso_time(survivor.get("ended_at"))
    return {"rc": rc, "total": exited - crashed,
            "detect": None if detected is None else detected - crashed,
            "stop": None if stopped is None or detected is None else stopped - detected,
            "finish": None if stopped is None else exited - stopped}


# -- (b) TensorFlow ------------------------------------------------------------------------

def wait_for_epoch(path_of, proc_alive, timeout: float) -> bool:
    """Wait until worker-1's log shows a finished epoch (training is under way)."""
    def ready() -> bool:
        path = path_of()
        return bool(path and path.exists() and EPOCH_MARK in path.read_bytes())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True
        if not proc_alive():
            return False
        time.sleep(0.05)
    return False


def tf_tflaunch(work: Path, command: list[str], rep: int) -> dict:
    log_dir = work / f"logs-b-{rep}"
    argv = [TFLAUNCH, "--local", "2", "--quiet", "--log-dir", str(log_dir), "--", *command]
    with open(work / "tflaunch.console", "wb") as console:
        proc = _bench.popen(argv, cwd=work, stdout=console, stderr=console)

        def worker1_log():
            run_dir = _bench.last_run_dir(log_dir) if log_dir.exists() else None
            return run_dir / "worker-1.log" if run_dir else None

        if not wait_for_epoch(worker1_log, lambda: proc.poll() is None, 180):
            _bench.cleanup()  # SIGTERM: tflaunch stops its tasks
            return {"rc": proc.returncode, "seconds": None, "detail": "training never got under way"}
        time.sleep(0.3)
        run_dir = _bench.last_run_dir(log_dir)
        pid = next(t["pid"] for t in _bench.read_manifest(run_dir)["tasks"] if t["name"] == "worker-1")
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        rc, exited, _ = _bench.wait4(proc)
    survivor = next(t for t in _bench.read_manifest(run_dir)["tasks"] if t["name"] == "worker-0")
    how = f"worker-0 {survivor.get('state')}"
    if survivor.get("signal"):
        how += f" by signal {survivor['signal']}"
    detected = None
    for line in (run_dir / "merged.log").read_bytes().splitlines():
        if b" tflaunch | " in line and b" failed (" in line:
            detected = merged_time(line)
            break
    stopped = iso_time(survivor.get("ended_at"))
    phases = {"detect": None if detected is None else detected - killed,
              "stop": None if None in (detected, stopped) else stopped - detected,
              "finish": None if stopped is None else exited - stopped}
    shown = ", ".join(f"{k} {v:.2f} s" for k, v in phases.items() if v is not None)
    return {"rc": rc, "seconds": exited - killed, "detail": f"tflaunch exit {rc}, {how} ({shown})", **phases}


def tf_by_hand(work: Path, planned: list[_bench.PlannedTask], rep: int, timeout: float) -> dict:
    ports = _bench.free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    out = work / f"hand-{rep}"
    out.mkdir()
    procs, fds = [], []
    try:
        for index, task in enumerate(planned):
            env = {**os.environ, **task.env, "TFLAUNCH_RUN_ID": out.name, "TFLAUNCH_RUN_DIR": str(out),
                   "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}},
                                           separators=(",", ":"))}
            fd = os.open(out / f"{task.name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            fds.append(fd)
            procs.append(_bench.popen(task.argv, cwd=work, env=env, stdout=fd, stderr=fd))
        survivor, victim = procs
        if not wait_for_epoch(lambda: out / "worker-1.log", lambda: victim.poll() is None, 180):
            return {"rc": None, "seconds": None, "detail": "training never got under way"}
        time.sleep(0.3)
        killed = time.time()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        deadline = time.monotonic() + timeout
        while survivor.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if survivor.poll() is None:
            return {"rc": None, "seconds": None, "detail": f"survivor still running {timeout:.0f} s after the kill"}
        exited = time.time()
        text = (out / "worker-0.log").read_text(errors="replace")
        errors = [line for line in text.splitlines() if "Error" in line]
        reason = errors[-1].strip()[:200] if errors else "no error line in its log"
        return {"rc": survivor.returncode, "seconds": exited - killed,
                "detail": f"worker-0 exited {survivor.returncode} by itself: {reason}"}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for fd in fds:
            os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="repetitions of (a) (default 7)")
    parser.add_argument("--tf-reps", type=int, default=3, help="repetitions per side of (b) (default 3)")
    parser.add_argument("--skip-tf", action="store_true", help="run (a) only")
    parser.add_argument("--delay", type=float, default=1.0, help="(a): seconds before worker-0 crashes")
    parser.add_argument("--timeout", type=float, default=90.0, help="(b): how long to wait for the survivor")
    args = parser.parse_args()
    command = ["python", "-m", "trainer", "--epochs", "200", "--dataset", "digits"]
    _bench.header("bench_crash_exit: from a task's crash to tflaunch's exit",
                  [f"(a) {args.reps} runs of 2 trivial tasks, worker-0 exits 1 after {args.delay:g} s",
                   "(b) " + ("skipped" if args.skip_tf else
                             f"{args.tf_reps} interleaved runs per side: {' '.join(command)}, worker-1 SIGKILLed "
                             "after its first epoch")])
    with _bench.workdir("crash") as work:
        a = []
        for rep in range(args.reps):
            r = trivial_once(work, rep, args.delay)
            a.append(r)
            note(f"(a) rep {rep + 1}: crash -> exit {r['total']:.3f} s (exit code {r['rc']})")
        b: dict[str, list[dict]] = {"tflaunch": [], "hand": []}
        if not args.skip_tf:
            planned = _bench.dry_run(["--local", "2", "--", *command], work)
            for rep, side in _bench.interleaved(args.tf_reps, ["tflaunch", "hand"]):
                if side == "tflaunch":
                    r = tf_tflaunch(work, command, rep)
                else:
                    r = tf_by_hand(work, planned, rep, args.timeout)
                b[side].append(r)
                seconds = f"{r['seconds']:.2f} s" if r["seconds"] is not None else "-"
                note(f"(b) rep {rep + 1} {side:8s} kill -> end {seconds}; {r['detail']}")

    def row(label: str, key: str) -> list:
        values = [r[key] for r in a if r[key] is not None]
        return [label, median(values), min(values, default=float("nan")), max(values, default=float("nan"))]

    print()
    print("  (a) trivial tasks, crash of worker-0 -> tflaunch exit (medians over "
          f"{len(a)} runs; exit codes {sorted({r['rc'] for r in a})})")
    table(["phase", "median s", "min s", "max s"], [
        row("crash -> tflaunch's 'failed' message", "detect"),
        row("message -> survivor stopped", "stop"),
        row("survivor stopped -> tflaunch exit", "finish"),
        row("crash -> tflaunch exit (total)", "total"),
    ])
    if not args.skip_tf:
        print()
        print("  (b) TensorFlow MWMS, SIGKILL of worker-1 -> end of the job")
        rows = []
        for side, label in (("tflaunch", "tflaunch: kill -> tflaunch exit"),
                            ("hand", "hand-launched: kill -> survivor exits by itself")):
            values = [r["seconds"] for r in b[side] if r["seconds"] is not None]
            rows.append([label, f"{len(values)}/{len(b[side])}", median(values),
                         min(values, default=float("nan")), max(values, default=float("nan"))])
        table(["side", "ok runs", "median s", "min s", "max s"], rows)
        runs = [r for r in b["tflaunch"] if r["seconds"] is not None]
        if runs:
            print("  tflaunch side by phase (merged.log message, run.json ended_at):")
            phase_rows = []
            for key, label in (("detect", "kill -> tflaunch's 'failed' message"),
                               ("stop", "message -> survivor stopped"),
                               ("finish", "survivor stopped -> tflaunch exit")):
                values = [r[key] for r in runs if r.get(key) is not None]
                phase_rows.append([label, median(values), min(values, default=float("nan")),
                                   max(values, default=float("nan"))])
            table(["phase", "median s", "min s", "max s"], phase_rows)
        tl = [r["seconds"] for r in runs]
        hd = [r["seconds"] for r in b["hand"] if r["seconds"] is not None]
        if tl and hd:
            print(f"RESULT (b) TensorFlow worker killed -> end: tflaunch {median(tl):.3f} s, "
                  f"TensorFlow alone {median(hd):.3f} s ({median(hd) / median(tl):.1f}x longer; no target)")
    _bench.verdict("(a) crash -> tflaunch exit", median([r["total"] for r in a]), TARGET, " s")


if __name__ == "__main__":
    _bench.main_guard(main)
