"""This host's GPUs for tflaunch's straggler rule: :class:`Nvml` reads a GPU's clocks and throttle
reasons through NVML, and :class:`GpuReader` calls it on a thread of its own, so that a hung GPU
driver never holds up the agent's loop (its heartbeats, its tasks' output): a reading that takes
longer than :data:`NVML_DEADLINE` leaves the task's GPU readings stale, and the loop goes on.
"""

import os
import threading
import time

NVML_DEADLINE = 5.0  # seconds a round of NVML readings may take before the GPUs' readings are stale
NVML_LIBRARY = "TFLAUNCH_NVML_LIBRARY"  # in the agent's environment: another NVML library (tests give a stand-in)

# NVML's clock throttle reasons that hold a busy GPU below its peak (nvml.h): clocks set lower
# (application or locked clocks), a software power cap, a hardware slowdown, software and hardware
# thermal slowdown, a power brake. Idle and sync boost are left out. Peers held alike cancel out in
# tflaunch's comparison; the one held lower than its peers stands out.
GPU_SLOWDOWNS = 0x2 | 0x4 | 0x8 | 0x20 | 0x40 | 0x80
NVML_CLOCK_SM = 1


class Nvml(object):
    """This host's GPUs through NVML (``libnvidia-ml.so.1``): :meth:`reading` gives a GPU's SM clock,
    its highest SM clock, its throttle reasons and its utilisation. GPU indices are NVML's, which
    are CUDA's under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (tflaunch sets it with ``CUDA_VISIBLE_DEVICES``).
    Every call may block as long as the driver does: make them on :class:`GpuReader`'s thread."""

    @classmethod
    def opened(cls):
        """NVML opened, or None where it cannot be had."""
        try:
            return cls()
        except (OSError, AttributeError):
            return None

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(os.environ.get(NVML_LIBRARY) or "libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        self.handles = {}

    def reading(self, index):
        """(SM MHz, highest SM MHz, throttle reasons, utilisation %) of GPU ``index``, or None."""
        ctypes = self.ctypes
        handle = self.handles.get(index)
        if handle is None:
            handle = ctypes.c_void_p()
            if self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
                return None
            self.handles[index] = handle
        clock, most = ctypes.c_uint(), ctypes.c_uint()
        reasons = ctypes.c_ulonglong()
        use = (ctypes.c_uint * 2)()  # nvmlUtilization_t: gpu, memory
        if (self.lib.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(clock)) != 0
                or self.lib.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(most)) != 0
                or self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(handle, ctypes.byref(reasons)) != 0
                or self.lib.nvmlDeviceGetUtilizationRates(handle, use) != 0):
            return None
        return clock.value, most.value, reasons.value, use[0]


def gpu_slowdown(reading):
    """How much slower than its peak a GPU runs because it is throttled (0: not slowed down)."""
    clock, most, reasons, _ = reading
    if not reasons & GPU_SLOWDOWNS or not most:
        return 0.0
    return max(0.0, 1.0 - float(clock) / most)


class GpuReader(object):
    """NVML's readings of the GPUs the agent's watched tasks use, taken on a daemon thread of the
    agent's own (opening NVML too): :meth:`take` never waits. Each call asks for a new round
    when none is under way and hands back what the last finished round read; a round asked for
    more than :data:`NVML_DEADLINE` seconds ago and not finished marks the readings stale."""

    shared = None  # the agent's one reader, made when a watched task with GPUs first asks

    @classmethod
    def here(cls):
        if cls.shared is None:
            cls.shared = cls(Nvml.opened)
        return cls.shared

    def __init__(self, open_nvml, deadline=NVML_DEADLINE):
        self.open_nvml = open_nvml
        self.deadline = deadline
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._wanted = set()
        self._readings = {}  # GPU index -> its reading in the last finished round
        self._rounds = 0  # rounds finished
        self._asked_at = None  # when the round under way was asked for (None: none is)
        self._absent = False  # NVML cannot be had here: no round will ever come
        self._thread = None

    def take(self, indices):
        """(rounds finished, {index: reading} of the last one, stale): without waiting."""
        now = time.monotonic()
        with self._lock:
            if self._absent:
                return self._rounds, {}, False
            self._wanted.update(indices)
            stale = self._asked_at is not None and now - self._asked_at > self.deadline
            if self._asked_at is None:
                self._asked_at = now
                self._wake.set()
            found = dict((i, self._readings[i]) for i in indices if i in self._readings)
            rounds = self._rounds
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="tflaunch-nvml", daemon=True)
            self._thread.start()
        return rounds, found, stale

    def _serve(self):
        nvml = self.open_nvml()  # nvmlInit may block on a hung driver as any call may
        if nvml is None:
            with self._lock:
                self._absent, self._asked_at = True, None
            return
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                wanted = sorted(self._wanted)
            found = {}
            for index in wanted:
                reading = nvml.reading(index)
                if reading is not None:
                    found[index] = reading
            with self._lock:
                self._readings = found
                self._rounds += 1
                self._asked_at = None
