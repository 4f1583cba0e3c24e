"""Training throughput on NVIDIA GPUs: one GPU, MirroredStrategy on all of them, N tasks x 1 GPU under MWMS.

    python benchmarks/bench_gpu_scaling.py [--reps N] [--epochs E] [--dataset NAME] [--batch-per-worker B]

Three ways to train the built-in trainer's CNN, each started by tflaunch on this machine:
- ``1 GPU``: ``--local 1 --gpus 0`` (the default strategy on one GPU);
- ``Mirrored``: one task with every GPU, ``--strategy mirrored``;
- ``MWMS``: ``--local N --gpus 0,...,N-1``, one task per GPU, ``--collective nccl``.
The per-replica batch is the same everywhere, so the global batch grows with the GPUs. Each row
shows the cluster's steady-state samples/s (the trainer's metric, first step of each epoch left
out) and the epoch time, medians over the epochs after the first (which holds tracing) and over
the repetitions, and the speed-up over one GPU. On a machine without GPUs it says so in one line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import _bench
from _bench import PYTHON, TFLAUNCH, median, note, table


def host_gpu_count() -> tuple[int, str]:
    """The number of GPUs nvidia-smi lists, and why there are none when there are none."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return 0, "no NVIDIA GPU on this host (nvidia-smi not found)"
    try:
        done = subprocess.run([nvidia_smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0, f"nvidia-smi did not answer ({exc})"
    if done.returncode != 0:
        first = (done.stdout + done.stderr).strip().splitlines()
        return 0, f"nvidia-smi failed ({first[0] if first else f'exit {done.returncode}'})"
    count = len([line for line in done.stdout.splitlines() if line.strip()])
    return count, "nvidia-smi lists no GPU"


def tensorflow_gpu_count() -> int:
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0


def run_side(side: str, gpus: int, args: argparse.Namespace, work: Path, rep: int) -> dict | None:
    """One tflaunch run; its worker-0 epoch records after the first, or None when it failed."""
    log_dir = work / f"{side}-{rep}"
    trainer = ["python", "-m", "trainer", "--epochs", str(args.epochs), "--dataset", args.dataset,
               "--batch-per-worker", str(args.batch_per_worker), "--width", str(args.width)]
    if side == "1 GPU":
        cluster = ["--local", "1", "--gpus", "0"]
    elif side == "Mirrored":
        path = work / "every_gpu.yaml"
        path.write_text(f"worker: [{{host: localhost, port: auto, gpus: [{', '.join(map(str, range(gpus)))}]}}]\n")
        cluster = [str(path)]
        trainer += ["--strategy", "mirrored"]
    else:
        cluster = ["--local", str(gpus), "--gpus", ",".join(map(str, range(gpus)))]
        trainer += ["--collective", "nccl"]
    proc = _bench.popen([TFLAUNCH, *cluster, "--quiet", "--log-dir", str(log_dir), "--", *trainer],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate()
    runs = sorted(p for p in log_dir.glob("*") if p.is_dir())
    if proc.returncode != 0 or not runs:
        note(f"{side} (rep {rep + 1}) failed with exit {proc.returncode}: {err.strip().splitlines()[-1:] or ''}")
        return None
    records = [json.loads(line) for line in (runs[-1] / "metrics.jsonl").read_text().splitlines() if line.strip()]
    epochs = [r for r in records if r.get("kind") == "epoch" and r.get("task") == "worker-0" and r["epoch"] > 1]
    return {"samples": [r["samples_per_second"] for r in epochs if r.get("samples_per_second")],
            "seconds": [r["epoch_seconds"] for r in epochs], "replicas": epochs[0]["replicas"] if epochs else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run; the first is left out")
    parser.add_argument("--dataset", default="synthetic:60000", help="the trainer's --dataset")
    parser.add_argument("--batch-per-worker", type=int, default=256)
    parser.add_argument("--width", type=float, default=1.0, help="the trainer's --width (CNN size)")
    args = parser.parse_args()
    gpus, why = host_gpu_count()
    if not gpus:
        print(f"bench_gpu_scaling: {why}; run it on a host with NVIDIA GPUs")
        return
    seen = tensorflow_gpu_count()
    if not seen:
        print(f"bench_gpu_scaling: nvidia-smi lists {gpus} GPUs but TensorFlow sees none; "
              "install TensorFlow with CUDA (pip install 'tensorflow[and-cuda]')")
        return
    sides = ["1 GPU", "Mirrored", "MWMS"] if gpus > 1 else ["1 GPU"]
    _bench.header(f"GPU scaling: {gpus} GPUs, {args.epochs} epochs of {args.dataset}, "
                  f"{args.batch_per_worker} samples per replica and step",
                  [f"{args.reps} interleaved repetitions; medians over epochs 2..{args.epochs}"])
    results: dict[str, list[dict]] = {side: [] for side in sides}
    try:
        with _bench.workdir("gpu") as work:
            for rep, side in _bench.interleaved(args.reps, sides):
                result = run_side(side, gpus, args, work, rep)
                if result:
                    results[side].append(result)
    finally:
        _bench.cleanup()
    base = median([s for r in results["1 GPU"] for s in r["samples"]])
    rows = []
    for side in sides:
        samples = median([s for r in results[side] for s in r["samples"]])
        seconds = median([s for r in results[side] for s in r["seconds"]])
        replicas = next((r["replicas"] for r in results[side] if r["replicas"]), "-")
        label = {"1 GPU": "1 GPU", "Mirrored": f"MirroredStrategy, {gpus} GPUs",
                 "MWMS": f"MWMS, {gpus} tasks x 1 GPU (NCCL)"}[side]
        rows.append([label, replicas, samples, seconds, samples / base if base and not math.isnan(base) else float("nan")])
    table(["setup", "replicas", "samples/s", "epoch s", "speed-up"], rows)
    if gpus == 1:
        note("one GPU on this host: MirroredStrategy and MWMS rows need two or more")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
