"""tflaunch and the built-in trainer on NVIDIA GPUs: real runs, skipped (with the reason) on a host without one.

What each test asserts is what a real GPU run shows: the GPUs a task sees are checked from inside
the task, through the CUDA driver (``libcuda``, which applies ``CUDA_VISIBLE_DEVICES`` and
``CUDA_DEVICE_ORDER`` as TensorFlow does) and TensorFlow's own device list, against the PCI bus ids
``nvidia-smi`` reports for the indices tflaunch handed out. Run them on a GPU host with

    .venv/bin/python -m pytest -m gpu tests/trainer/test_gpu.py

(TensorFlow with CUDA: ``pip install 'tensorflow[and-cuda]'``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.tensorflow]

# Runs inside a task: what CUDA and TensorFlow show this process, as one line.
PROBE = r"""
import ctypes, json, os
cuda = ctypes.CDLL("libcuda.so.1")
status = cuda.cuInit(0)
count = ctypes.c_int(0)
buses = []
if status == 0:
    cuda.cuDeviceGetCount(ctypes.byref(count))
    for ordinal in range(count.value):
        device = ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(device), ordinal)
        bus = ctypes.create_string_buffer(64)
        cuda.cuDeviceGetPCIBusId(bus, 64, device)
        buses.append(bus.value.decode())
import tensorflow as tf
print("GPUPROBE " + json.dumps({
    "task": os.environ.get("TFLAUNCH_TASK"), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "order": os.environ.get("CUDA_DEVICE_ORDER"), "growth": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"),
    "cu_init": status, "buses": buses, "tf_gpus": len(tf.config.list_physical_devices("GPU"))}), flush=True)
"""
# TensorFlow's line for each GPU it opens (an INFO line: TF_CPP_MIN_LOG_LEVEL=0 shows it).
CREATED_GPU = re.compile(r"Created device \S*device:GPU:(\d+) with \d+ MB memory.*pci bus id: ([0-9A-Fa-f:.]+)")


def bus_key(bus_id: str) -> tuple[int, ...]:
    """A PCI bus id as numbers: nvidia-smi writes ``00000000:3B:00.0``, CUDA ``0000:3b:00.0``."""
    domain, bus, rest = bus_id.strip().split(":")
    device, function = rest.split(".")
    return tuple(int(part, 16) for part in (domain, bus, device, function))


def host_gpus() -> tuple[list[tuple[int, ...]], str]:
    """The host's GPUs as PCI bus ids by nvidia-smi index, and why there are none when there are none."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return [], "no NVIDIA GPU on this host: nvidia-smi not found"
    try:
        done = subprocess.run([nvidia_smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi did not answer: {exc}"
    if done.returncode != 0:
        return [], f"nvidia-smi failed: {(done.stdout + done.stderr).strip().splitlines()[:1]}"
    rows = sorted((int(index), bus_key(bus)) for index, bus in
                  (line.split(",") for line in done.stdout.splitlines() if line.strip()))
    return [bus for _, bus in rows], "nvidia-smi lists no GPU"


GPUS, NO_GPU = host_gpus()
pytestmark.append(pytest.mark.skipif(not GPUS, reason=NO_GPU))
two_gpus = pytest.mark.skipif(len(GPUS) < 2, reason=f"needs 2 GPUs, this host has {len(GPUS)}" if GPUS else NO_GPU)


def probes(done, *tasks: str) -> dict[str, dict]:
    """Each task's GPUPROBE record, read from its log in the run folder."""
    found = {}
    for task in tasks:
        (line,) = [l for l in done.task_output(task).splitlines() if l.startswith("GPUPROBE ")]
        found[task] = json.loads(line[len("GPUPROBE "):])
        assert found[task]["task"] == task
    return found


def records(done, kind: str) -> list[dict]:
    lines = (done.run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def assert_sees(probe: dict, indices: list[int]) -> None:
    """The task sees exactly the host GPUs ``indices`` (nvidia-smi numbering), in that order."""
    assert probe["visible"] == ",".join(map(str, indices)), probe
    assert probe["order"] == "PCI_BUS_ID", probe
    assert probe["cu_init"] == 0, probe
    assert [bus_key(b) for b in probe["buses"]] == [GPUS[i] for i in indices], probe
    assert probe["tf_gpus"] == len(indices), f"TensorFlow sees {probe['tf_gpus']} GPUs (a CPU-only build?)"


def one_worker_file(tmp_path: Path, indices: list[int]) -> str:
    path = tmp_path / "gpus.yaml"
    path.write_text(f"worker: [{{host: localhost, port: auto, gpus: [{', '.join(map(str, indices))}]}}]\n")
    return str(path)


@pytest.mark.timeout(1200)
def test_mirrored_strategy_trains_on_every_gpu(tflaunch, tmp_path: Path) -> None:
    every = list(range(len(GPUS)))
    cluster = one_worker_file(tmp_path, every)
    done = tflaunch.run(cluster, "--", "python", "-c", PROBE, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_sees(probes(done, "worker-0")["worker-0"], every)
    done = tflaunch.run(cluster, "--env", "TF_CPP_MIN_LOG_LEVEL=0", "--", "python", "-m", "trainer",
                        "--strategy", "mirrored", "--epochs", "2", timeout=900)
    assert done.returncode == 0, done.stderr
    output = done.task_output("worker-0")
    assert f"MirroredStrategy replicas={len(GPUS)}" in output, output[-3000:]
    opened = {int(n): bus_key(bus) for n, bus in CREATED_GPU.findall(output)}
    assert opened == dict(enumerate(GPUS)), opened  # one TensorFlow device per GPU, in nvidia-smi's order
    assert {r["replicas"] for r in records(done, "epoch")} == {len(GPUS)}


@two_gpus
@pytest.mark.timeout(1200)
def test_two_multi_worker_tasks_with_one_gpu_each_use_nccl(tflaunch) -> None:
    done = tflaunch.run("--local", "2", "--gpus", "0,1", "--", "python", "-c", PROBE, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = probes(done, "worker-0", "worker-1")
    assert_sees(seen["worker-0"], [0])
    assert_sees(seen["worker-1"], [1])
    assert seen["worker-0"]["growth"] is None  # GPUs of their own: nothing to share
    done = tflaunch.run("--local", "2", "--gpus", "0,1", "--env", "NCCL_DEBUG=INFO", "--", "python", "-m", "trainer",
                        "--collective", "nccl", "--epochs", "2", timeout=900)
    assert done.returncode == 0, done.stderr
    for task in ("worker-0", "worker-1"):
        output = done.task_output(task)
        assert "MultiWorkerMirroredStrategy replicas=2" in output, output[-3000:]
        assert "NCCL INFO" in output, f"{task} did not initialise NCCL:\n{output[-3000:]}"
    epochs = records(done, "epoch")
    losses = {task: [r["loss"] for r in epochs if r["task"] == task] for task in ("worker-0", "worker-1")}
    assert len(losses["worker-0"]) == 2 and losses["worker-0"] == losses["worker-1"]  # one model, all-reduced


@pytest.mark.timeout(1200)
def test_two_tasks_share_one_gpu_with_memory_growth(tflaunch) -> None:
    done = tflaunch.run("--local", "2", "--gpus", "0", "--", "python", "-c", PROBE, timeout=300)
    assert done.returncode == 0, done.stderr
    for probe in probes(done, "worker-0", "worker-1").values():
        assert_sees(probe, [0])
        assert probe["growth"] == "true", probe  # tflaunch's default for tasks sharing a GPU
    # Without memory growth the first task would take nearly all of the GPU's memory and the
    # second would fail to allocate; NCCL refuses two ranks on one GPU, so the collective is ring.
    done = tflaunch.run("--local", "2", "--gpus", "0", "--", "python", "-m", "trainer", "--collective", "ring",
                        "--epochs", "2", timeout=900)
    assert done.returncode == 0, done.stderr
    finals = records(done, "final")
    assert finals and all(r["test_accuracy"] >= 0.5 for r in finals), finals


@pytest.mark.timeout(1800)
def test_trainer_accuracy_on_a_gpu_is_the_cpus(tflaunch) -> None:
    """The same training on one GPU and on the CPU (--local 1 without --gpus hides every GPU) ends as accurate."""
    args = ("--env", "TF_CPP_MIN_LOG_LEVEL=0", "--", "python", "-m", "trainer", "--epochs", "4")
    gpu = tflaunch.run("--local", "1", "--gpus", "0", *args, timeout=900)
    assert gpu.returncode == 0, gpu.stderr
    opened = CREATED_GPU.findall(gpu.task_output("worker-0"))
    assert {bus_key(bus) for _, bus in opened} == {GPUS[0]}, opened  # it did train on GPU 0
    cpu = tflaunch.run("--local", "1", *args, timeout=900)
    assert cpu.returncode == 0, cpu.stderr
    assert not CREATED_GPU.findall(cpu.task_output("worker-0"))
    (on_gpu,), (on_cpu,) = records(gpu, "final"), records(cpu, "final")
    assert on_gpu["test_accuracy"] >= 0.90, on_gpu  # the CPU tests' bar for 4 epochs of digits
    # Same seed and data; cuDNN's kernels differ from the CPU's in rounding, not in what they learn.
    assert abs(on_gpu["test_accuracy"] - on_cpu["test_accuracy"]) <= 0.03, (on_gpu, on_cpu)


def test_the_agent_reads_every_gpu_s_clocks_throttle_reasons_and_use() -> None:
    from launcher.agent.gpus import Nvml

    nvml = Nvml.opened()
    assert nvml is not None, "NVML (libnvidia-ml.so.1) did not open on a host with nvidia-smi"
    for index in range(len(GPUS)):
        clock, most, reasons, use = nvml.reading(index)
        assert 0 < clock <= most and 0 <= use <= 100 and reasons >= 0, (index, clock, most, reasons, use)


def lowest_clock(index: int) -> int:
    done = subprocess.run(["nvidia-smi", "-i", str(index), "--query-supported-clocks=graphics",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True)
    return min(int(line) for line in done.stdout.split() if line.strip().isdigit())


@two_gpus
def test_a_worker_on_a_gpu_held_at_its_lowest_clock_is_named_the_straggler(tflaunch) -> None:
    # Needs root (nvidia-smi -lgc); the clocks go back to default whatever happens.
    subprocess.run(["nvidia-smi", "-i", "1", "-lgc", f"{lowest_clock(1)},{lowest_clock(1)}"], check=True)
    try:
        proc = tflaunch.start("--local", "2", "--gpus", "0,1", "--", "python", "-m", "trainer", "--epochs", "400",
                              "--width", "2", "--batch-per-worker", "256")
        from polling import wait_for

        line = wait_for(lambda: next((l for l in tflaunch.merged_text().splitlines() if "| straggler:" in l), None),
                        timeout=400, message="the straggler line")
        proc.send_signal(2)
        proc.communicate(timeout=120)
    finally:
        subprocess.run(["nvidia-smi", "-i", "1", "-rgc"], check=False)
    assert "straggler: worker-1 on localhost holds the others back" in line and "GPU runs throttled" in line
    record = json.loads((tflaunch.latest_run() / "run.json").read_text())
    assert [s["task"] for s in record["stragglers"]] == ["worker-1"]
