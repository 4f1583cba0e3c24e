"""Explains a failed task from the tail of its output: which known problem it hit and how to fix it.

Pure: no TensorFlow, no I/O. ``diagnose`` tries these rules in order and returns the first match,
so a specific root cause wins over the generic errors that follow from it:

- ``killed``: killed by SIGKILL (or exit 137) with no Python traceback, and not after a stop request
  that TensorFlow caught ("SIGTERM caught": a stop escalated to SIGKILL): likely the OOM killer;
- ``port-in-use``: TensorFlow's gRPC server could not bind its port;
- ``module-not-found``: ``No module named ...`` (TensorFlow or the trainer missing for that Python);
- ``strategy-after-op``: "Collective ops must be configured at program startup";
- ``device-config-after-init``: visible, physical (memory growth) or virtual devices changed too late;
- ``threads-after-init``: intra/inter-op thread counts changed too late;
- ``keras3-multiworker``: Keras 3's PerReplica conversion error under MultiWorkerMirroredStrategy;
- ``gpu-library-init``: cuDNN or cuBLAS failed to initialise (usually GPU memory already taken);
- ``gpu-hardware``: the GPU itself failed: an uncorrectable ECC error, an Xid, a GPU fallen off the bus;
- ``disk-full``: a write failed with "No space left on device" (errno 28) on the task's host;
- ``tensor-oom``: "OOM when allocating tensor";
- ``no-outside-network``: a name or network error (name resolution, an unreachable network, a URL
  fetch) in a task whose network has no way out (a sealed run without slirp4netns or pasta, an
  isolated run): the fix is the way out;
- ``peer-heartbeat``: "tasks are unhealthy (stopped sending heartbeats)": that peer died first;
- ``peer-connection-lost``: a connection to a peer closed mid-operation (peer named when TF says);
- ``peer-unreachable``: connection refused, or no address reachable, naming the address;
- ``cluster-not-formed``: stopped while the cluster was still forming (stragglers, or the leader).

Rules about an exception read the last Python traceback (with the tracebacks chained to it) when
the tail has one, so earlier warnings that the task survived do not count; rules about TensorFlow's
C++ log lines read the whole tail.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...records.metrics import speaker

SIGKILL = 9
# The rules that point at the task's machine rather than at the program: the same failure would come
# again on that host, so a restart leaves the host out where a spare or min_workers allows
# (docs/fault-tolerance.md, "A host lost for good").
MACHINE_RULES = frozenset({"gpu-library-init", "gpu-hardware", "disk-full"})
# The rules that name a mistake of the program or its setup: it fails the same way on any host, so
# such a failure lays no blame on the task's host.
PROGRAM_RULES = frozenset({"module-not-found", "strategy-after-op", "device-config-after-init", "threads-after-init",
                           "keras3-multiworker", "port-in-use", "no-outside-network"})


@dataclass(frozen=True)
class Diagnosis:
    rule: str          # short id, e.g. "port-in-use"
    summary: str       # one line: what went wrong
    fix: str           # one line: how to fix it
    peer: str | None = None   # tflaunch task name (e.g. "worker-1") this failure points at, when known


@dataclass(frozen=True)
class _Tail:
    text: str                  # the whole tail, one string
    final: str                 # the last traceback (with its chain) to the end, else the whole tail
    has_traceback: bool
    signal: int | None
    exit_code: int | None
    task_names: tuple[str, ...]
    offline: tuple[str, ...] = ()  # (why, fix): what the task's network lacks

    def task(self, job: str, index: str | int) -> str | None:
        """The tflaunch name for TF's /job:JOB/.../task:INDEX, when it is one of the cluster's tasks."""
        name = f"{job}-{int(index)}"
        return name if not self.task_names or name in self.task_names else None

    def named(self, text: str) -> tuple[list[str], str | None]:
        """Every task TF names in ``text`` (tflaunch names where known), and the first one's tflaunch name."""
        tasks = _TASK.findall(text)
        names = list(dict.fromkeys(self.task(job, i) or f"/job:{job}/task:{i}" for job, i in tasks))
        return names, self.task(*tasks[0]) if tasks else None


_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = re.compile(r"(During handling of the above exception, another exception occurred:"
                      r"|The above exception was the direct cause of the following exception:)\s*$")
_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")

_PORT = re.compile(r"Address already in use|Could not start gRPC server|Failed to add port to server")
_PORT_ADDRESS = re.compile(r"resolved for '([^']+)'|bind to (?:address )?(\S+:\d+)")
_NO_MODULE = re.compile(r"^(?:(?:ModuleNotFoundError|ImportError): |(\S*python[\w.]*): )No module named '?([\w.]+)'?",
                        re.MULTILINE)
_DEVICES_LATE = re.compile(r"(Visible|Physical|Virtual) devices cannot be modified after being initialized")
_GPU_LIBRARY = re.compile(r"could not create cudnn handle|cuDNN failed to initiali[sz]e|Failed to get convolution "
                          r"algorithm|CUDNN_STATUS_(?:INTERNAL_ERROR|NOT_INITIALIZED|ALLOC_FAILED)|"
                          r"(CUBLAS_STATUS_\w+|failed to create cublas handle|Blas \w*GEMM launch failed)",
                          re.IGNORECASE)
_GPU_HARDWARE = re.compile(r"uncorrectable ECC error|CUDA_ERROR_ECC_UNCORRECTABLE|\bNVRM: Xid\b|\bXid \(PCI:|"
                           r"GPU has fallen off the bus|CUDA_ERROR_(?:HARDWARE_STACK_ERROR|ILLEGAL_INSTRUCTION)",
                           re.IGNORECASE)
_DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|ENOSPC")
_TENSOR_OOM = re.compile(r"OOM when allocating tensor with shape\s*\[([^\]]*)\][^\n]*? on (\S+) by allocator")
_HEARTBEAT = re.compile(r"stopped sending heartbeats\)?:?\s*((?:/job:\w+/replica:\d+/task:\d+[\s,]*)+)")
_CONNECTION_LOST = re.compile(r"Socket closed|Connection reset by peer|Broken pipe")
_REMOTE_TARGET = re.compile(r"remote target /job:\w+/replica:\d+/task:\d+")
_UNREACHABLE = re.compile(r"(Connection refused|DNS resolution failed|No route to host|Connection timed out"
                          r"|Network is unreachable)|(failed to connect to all addresses)", re.IGNORECASE)
_ADDRESS = re.compile(r"ipv[46]:(\[[^\]]+\]:\d+|[\w.-]+:\d+)|DNS resolution failed for (?:service: )?([\w.-]+:\d+)")
# A name that did not resolve, a network out of reach, a download that failed on either.
_OUTSIDE = re.compile(r"Temporary failure in name resolution|Name or service not known|No address associated with "
                      r"hostname|getaddrinfo failed|Could not resolve host|DNS resolution failed|Network is unreachable"
                      r"|URL fetch failure|urlopen error|Failed to establish a new connection|Max retries exceeded "
                      r"with url|\[Errno (?:-[23]|101)\][^>'\"\n]*")
_WAITING = re.compile(r"Waiting for (\d+)/(\d+) tasks to connect")
_STRAGGLERS = re.compile(r"Example stragglers:\s*((?:/job:\w+/replica:\d+/task:\d+\s*)+)")
_ALL_CONNECTED = re.compile(r"Barrier\(WaitForAllTasks[^)]*\) has passed")
_STOP_CAUGHT = "SIGTERM caught"  # TF's preemption notifier: MWMS tasks outlive SIGTERM until SIGKILL


def diagnose(output_tail: list[str], *, signal: int | None, exit_code: int | None,
             task_names: Sequence[str], offline: Sequence[str] = ()) -> Diagnosis | None:
    """The first rule (in the order of the module docstring) that explains this failure, or None.

    ``output_tail`` is the last lines of the task's output; ``signal`` the signal that killed it and
    ``exit_code`` its exit code (either may be None); ``task_names`` the cluster's tflaunch task
    names, used to name the peer a message points at ("/job:worker/replica:0/task:1" -> "worker-1");
    ``offline`` (why, fix) what the task's network lacks, when it lacks a way out.
    """
    text = "\n".join(line.rstrip("\r\n") for line in output_tail)
    start = text.rfind(_TRACEBACK)
    while start > 0:
        earlier = text.rfind(_TRACEBACK, 0, start)
        if earlier < 0 or not _CHAINED.search(text[:start].rstrip()):
            break
        start = earlier
    tail = _Tail(text, text[start:] if start >= 0 else text, start >= 0, signal, exit_code, tuple(task_names),
                 tuple(offline))
    for rule in _RULES:
        found = rule(tail)
        if found is not None:
            return found
    return None


def _static(rule: str, pattern: str, summary: str, fix: str) -> Callable[[_Tail], Diagnosis | None]:
    """A rule with a fixed diagnosis, for an exception whose message says it all."""
    compiled = re.compile(pattern)
    return lambda t: Diagnosis(rule, summary, fix) if compiled.search(t.final) else None


_strategy_after_op = _static(
    "strategy-after-op", r"Collective ops must be configured at program startup",
    "MultiWorkerMirroredStrategy was created after another TensorFlow op had already run",
    "create the strategy first, before any other TensorFlow op (tensors, datasets, models)")
_threads_after_init = _static(
    "threads-after-init", r"(Intra|Inter) op parallelism cannot be modified after initialization",
    "thread counts were changed after TensorFlow's runtime had started",
    "call tf.config.threading.* before any op, or let tflaunch set TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS "
    "(`threads:`)")
_keras3_multiworker = _static(
    "keras3-multiworker", r"convert a value \(PerReplica:|unsupported type \(<class '[\w.]*PerReplica'>\)",
    "Keras 3's Model.fit cannot run under MultiWorkerMirroredStrategy (PerReplica to Tensor error)",
    "use tf_keras: TF_USE_LEGACY_KERAS=1 (tflaunch sets it unless `env` says 0) and `import tf_keras as keras`, "
    "or train with a custom loop")


def _killed(t: _Tail) -> Diagnosis | None:
    sigkill = t.signal == SIGKILL or (t.signal is None and t.exit_code == 128 + SIGKILL)
    if not sigkill or t.has_traceback or _STOP_CAUGHT in t.text:
        return None
    return Diagnosis("killed", "killed by SIGKILL with no Python error: most likely the kernel's out-of-memory killer",
                     "check `dmesg` on that host for 'Out of memory: Killed process'; "
                     "reduce the batch size or the number of tasks per host")


def _port_in_use(t: _Tail) -> Diagnosis | None:
    if not _PORT.search(t.final):
        return None
    found = _PORT_ADDRESS.search(t.text)  # TF logs the address before the exception
    where = f"port {(found.group(1) or found.group(2)).rsplit(':', 1)[1]}" if found else "its port"
    return Diagnosis("port-in-use", f"TensorFlow's gRPC server could not bind {where}: it is already in use",
                     "stop whatever holds it (`ss -ltnp`; often a leftover task of an earlier run) "
                     "or give this task another port (`port: auto` on this machine)")


def _module_not_found(t: _Tail) -> Diagnosis | None:
    found = ([None] + list(_NO_MODULE.finditer(t.final)))[-1]  # the last one is what ended the task
    if found is None:
        return None
    interpreter, module = found.group(1), found.group(2)
    top = module.split(".")[0]
    who = interpreter or "the task's Python"
    if top == "trainer":
        fix = ("the default command `python -m trainer` needs tflaunch installed for that interpreter: "
               "set `python:` to the venv where tflaunch is installed, or pip install it there")
    else:
        fix = (f"set `python:` (cluster, host or task) to an interpreter that has {top} installed, or pip install "
               f"{top} for this one; for your own modules check `workdir:`")
    return Diagnosis("module-not-found", f"{who} cannot import {module} (No module named '{module}')", fix)


def _device_config_after_init(t: _Tail) -> Diagnosis | None:
    found = _DEVICES_LATE.search(t.final)
    if not found:
        return None
    what = {"Visible": "visible devices were", "Physical": "GPU memory growth was",
            "Virtual": "logical (virtual) devices were"}[found.group(1)]
    return Diagnosis("device-config-after-init", f"{what} changed after TensorFlow's runtime had started",
                     "set GPU options (set_visible_devices, set_memory_growth) before any op, or let tflaunch set "
                     "CUDA_VISIBLE_DEVICES via `gpus` (and TF_FORCE_GPU_ALLOW_GROWTH=true via `env`)")


def _gpu_library_init(t: _Tail) -> Diagnosis | None:
    found = _GPU_LIBRARY.search(t.text)
    if not found:
        return None
    library = "cuBLAS" if found.group(1) else "cuDNN"
    return Diagnosis("gpu-library-init", f"{library} failed to initialise, usually because the GPU's memory was "
                     "already taken (by this task, another task or another process)",
                     "enable memory growth (TF_FORCE_GPU_ALLOW_GROWTH=true; tflaunch sets it for tasks that share a "
                     "GPU, `share_gpus`), put fewer tasks on each GPU, and check nvidia-smi for other processes")


def _gpu_hardware(t: _Tail) -> Diagnosis | None:
    found = _GPU_HARDWARE.search(t.text)
    if not found:
        return None
    return Diagnosis("gpu-hardware", f"the GPU failed ({found.group(0)}): a fault of the machine, not of the program",
                     "leave the host out (tflaunch does at the next restart when a spare or min_workers allows) and "
                     "have its GPU checked (nvidia-smi -q, dmesg)")


def _disk_full(t: _Tail) -> Diagnosis | None:
    if not _DISK_FULL.search(t.final):
        return None
    return Diagnosis("disk-full", "a write failed: no space left on device on the task's host",
                     "free space on that host (or move the workdir, backup or TMPDIR to a larger disk); tflaunch "
                     "leaves the host out at the next restart when a spare or min_workers allows")


def _tensor_oom(t: _Tail) -> Diagnosis | None:
    found = _TENSOR_OOM.search(t.final)
    if not found:
        return None
    device = found.group(2).rsplit("/device:", 1)[-1]
    return Diagnosis("tensor-oom", f"TensorFlow ran out of memory allocating a tensor of shape [{found.group(1)}] "
                     f"on {device}", "reduce the batch size or the model; on GPUs also put fewer tasks on each "
                     "GPU and enable memory growth where tasks share one")


def _no_outside_network(t: _Tail) -> Diagnosis | None:
    found = _OUTSIDE.search(t.final) if len(t.offline) == 2 else None
    if not found:
        return None
    why, fix = t.offline
    return Diagnosis("no-outside-network", f"a name or network error ({found.group(0)}): {why}", fix)


def _peer_heartbeat(t: _Tail) -> Diagnosis | None:
    found = _HEARTBEAT.search(t.text)
    if not found:
        return None
    names, peer = t.named(found.group(1))
    who = " and ".join(names)
    return Diagnosis("peer-heartbeat", f"{who} stopped sending heartbeats: it died or stopped before this task, "
                     "which only noticed (TensorFlow's heartbeat check takes about 10 s)",
                     f"look at {who}'s own output and exit status: the root cause is there", peer=peer)


def _peer_connection_lost(t: _Tail) -> Diagnosis | None:
    found = _CONNECTION_LOST.search(t.final)
    if not found:
        return None
    target = _REMOTE_TARGET.search(t.final, found.end())
    names, peer = t.named(target.group(0)) if target else ([], None)
    who = names[0] if names else "a peer task"
    return Diagnosis("peer-connection-lost", f"the connection to {who} closed mid-operation ({found.group(0)}): "
                     f"{who} most likely died first", f"look at {who}'s own output and exit status: the root cause "
                     "is there", peer=peer)


def _peer_unreachable(t: _Tail) -> Diagnosis | None:
    reasons = _UNREACHABLE.findall(t.final)
    if not reasons:
        return None
    reason = next((specific for specific, _ in reasons if specific), reasons[0][1])
    address = _ADDRESS.search(t.final)
    where = (address.group(1) or address.group(2)) if address else "a peer task"
    return Diagnosis("peer-unreachable", f"could not connect to {where} ({reason})",
                     f"check that the task at {where} is running (it may have died first) and that its host and "
                     "port in the cluster file are right and not blocked by a firewall")


def _cluster_not_formed(t: _Tail) -> Diagnosis | None:
    waits = list(_WAITING.finditer(t.text))
    if waits and int(waits[-1].group(1)) > 0 and not _ALL_CONNECTED.search(t.text, waits[-1].end()):
        listed = _STRAGGLERS.search(t.text, waits[-1].end())
        names, peer = t.named(listed.group(1)) if listed else ([], None)
        who = " and ".join(names) if names else f"{waits[-1].group(1)} of {waits[-1].group(2)} tasks"
        return Diagnosis("cluster-not-formed", f"the cluster never formed: {who} never connected to this task "
                         "(TensorFlow waits silently)", f"check that {who} started and can reach this host at the "
                         "address in the cluster file (host, port, firewall)", peer=peer)
    mwms = not any(name.startswith("ps-") for name in t.task_names)
    if (mwms and t.task_names and not t.has_traceback and "Started server with target" in t.text
            and "Coordination agent has successfully connected" not in t.text):
        leader = speaker(t.task_names) or t.task_names[0]
        return Diagnosis("cluster-not-formed", f"this task never connected to {leader}, the cluster's leader "
                         "(TensorFlow waits silently)", f"check that {leader} is running and that its host and "
                         "port in the cluster file are reachable from this host (firewall)", peer=leader)
    return None


_RULES: tuple[Callable[[_Tail], Diagnosis | None], ...] = (
    _killed, _port_in_use, _module_not_found, _strategy_after_op, _device_config_after_init, _threads_after_init,
    _keras3_multiworker, _gpu_hardware, _gpu_library_init, _disk_full, _tensor_oom, _no_outside_network,
    _peer_heartbeat, _peer_connection_lost, _peer_unreachable, _cluster_not_formed,
)
