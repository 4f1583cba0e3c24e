"""``--ray --gpus-per-task`` on NVIDIA GPUs: each task sees the GPU Ray gave its bundle, checked from
inside the task by CUDA's driver and TensorFlow. Skipped (with the reason) on a host without one;
run it as it is on a GPU host:

    .venv/bin/python -m pytest -m gpu tests/sources/test_ray_gpus.py

Two Ray nodes on this machine, each told it has the host's GPUs; one task per node, one GPU each.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.ray, pytest.mark.slow, pytest.mark.tensorflow, pytest.mark.timeout(600)]

PROBE = r"""
import ctypes, json, os
cuda = ctypes.CDLL("libcuda.so.1")
status = cuda.cuInit(0)
count = ctypes.c_int(0)
if status == 0:
    cuda.cuDeviceGetCount(ctypes.byref(count))
import tensorflow as tf
print("GPUPROBE " + json.dumps({"task": os.environ.get("TFLAUNCH_TASK"), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
      "cu_init": status, "cuda_devices": count.value, "tf_gpus": len(tf.config.list_physical_devices("GPU"))}), flush=True)
"""


def host_gpu_count() -> tuple[int, str]:
    """How many GPUs nvidia-smi lists, and why there are none when there are none."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return 0, "no NVIDIA GPU on this host: nvidia-smi not found"
    try:
        done = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0, f"nvidia-smi did not answer: {exc}"
    count = sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))
    return count, "nvidia-smi lists no GPU"


GPUS, NO_GPU = host_gpu_count()
pytestmark.append(pytest.mark.skipif(not GPUS, reason=NO_GPU))


def test_each_task_sees_the_gpu_ray_gave_its_bundle(tflaunch):
    from testray_fixture import RayCluster

    cluster = RayCluster(nodes=0)
    try:
        for _ in range(2):
            cluster.add(cpus=1, gpus=GPUS)
        done = tflaunch.run("--ray", cluster.address, "--nnodes", "2", "--gpus-per-task", "1", "--",
                            "python", "-c", PROBE, timeout=480)
        assert done.returncode == 0, done.stderr[-3000:]
        for task in done.record["tasks"]:
            (line,) = [l for l in done.task_output(task["name"]).splitlines() if l.startswith("GPUPROBE ")]
            probe = json.loads(line[len("GPUPROBE "):])
            given = task["gpus"]  # what Ray gave the bundle: ray.get_gpu_ids() in its actor
            assert len(given) == 1 and 0 <= given[0] < GPUS, task
            assert probe["visible"] == str(given[0]), probe
            assert probe["cu_init"] == 0 and probe["cuda_devices"] == 1, probe
            assert probe["tf_gpus"] == 1, f"TensorFlow sees {probe['tf_gpus']} GPUs (a CPU-only build?)"
        cluster.wait_free(within=30)
    finally:
        cluster.close()
