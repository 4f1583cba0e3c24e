"""A watched task's threads and GPUs, for tflaunch's straggler rule (launcher/run/stragglers.py):
:class:`ThreadWatch` keeps the running totals that go out with the task's resource readings
(:mod:`.sampling`), and :class:`Nvml` reads the host's GPUs where NVML is present.
"""

import os

LOOK_EVERY = 1.0  # seconds between looks at a watched task's threads
CENSUS_LOOKS = 10  # looks between readings of its threads' CPU and run-queue times
FULL_CENSUSES = 6  # censuses between readings of all its threads (else: those that ran, and new ones)
DISCOVER = 2  # threads looked at per look besides the suspects, in turn, to find new suspects
MOST_SUSPECTS = 16
SUSPECT_LOOKS = 30  # looks after which a suspect not seen stalled again is one no more
# A thread holds its task up by itself when it sleeps on purpose or waits for a disk: its kernel
# wait channel (/proc/<pid>/task/<tid>/wchan) names one of these. A thread waiting on a lock, a
# condition, a socket or a pipe (futex, epoll, poll) waits for something else; a running or
# runnable thread shows "0", and the run-queue time tells what it waited for a CPU.
STALL_WAITS = ("nanosleep", "io_schedule", "folio_wait", "page_bit", "bit_wait", "filemap", "blk", "jbd2",
               "nfs", "fuse", "rpc_wait", "ext4", "xfs")


def read_small(path):
    """The first bytes of a small /proc file, or None when it is gone (the thread ended)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 256)
    except OSError:
        return None
    finally:
        os.close(fd)


def stalls(key):
    """Whether thread ``key`` ((pid, tid)) sleeps on purpose or waits for a disk; None: gone."""
    channel = read_small("/proc/%d/task/%d/wchan" % key)
    if channel is None:
        return None
    channel = channel.decode("ascii", "replace")
    return any(word in channel for word in STALL_WAITS)


# NVML's clock throttle reasons that hold a busy GPU below its peak (nvml.h): clocks set lower
# (application or locked clocks), a software power cap, a hardware slowdown, software and hardware
# thermal slowdown, a power brake. Idle and sync boost are left out. Peers held alike cancel out in
# tflaunch's comparison; the one held lower than its peers stands out.
GPU_SLOWDOWNS = 0x2 | 0x4 | 0x8 | 0x20 | 0x40 | 0x80
NVML_CLOCK_SM = 1


class Nvml(object):
    """This host's GPUs through NVML (``libnvidia-ml.so.1``), opened once, where there is one:
    :meth:`reading` gives a GPU's SM clock, its highest SM clock, its throttle reasons and its
    utilisation. GPU indices are NVML's, which are CUDA's under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    (tflaunch sets it with ``CUDA_VISIBLE_DEVICES``)."""

    opened = None  # the one instance, once tried; False where NVML cannot be had

    @classmethod
    def here(cls):
        if cls.opened is None:
            try:
                cls.opened = cls()
            except (OSError, AttributeError):
                cls.opened = False
        return cls.opened or None

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
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


class ThreadWatch(object):
    """What one watched task's threads do, as running totals that tflaunch compares across the
    cluster's tasks: in synchronous training every task waits for the slowest one, and what sets
    the slowest apart is not its step time (the same for all) but what it does meanwhile.

    - ``looks`` and ``stalled``: every ``LOOK_EVERY`` seconds the agent looks at the wait channel
      of some of the task's threads; ``stalled`` sums, over the looks, how many of them sleep on
      purpose or wait for a disk (an input pipeline that sleeps or reads slowly). A census's look
      takes every thread that runs; the others take the threads seen stalled lately
      (``suspects``: an input pipeline's work hops between a pool's threads) and ``DISCOVER``
      others in turn, so a look costs a few reads however many threads TensorFlow made.
    - ``gpu_looks`` and ``gpu_slowdown`` (sent only for a task with GPUs on a host with NVML):
      at each census, how much slower than its highest clock the task's slowest GPU runs because
      it is throttled (power cap, thermal or hardware slowdown, power brake), summed.
    Which threads run is read every ``CENSUS_LOOKS`` looks from their scheduling counts
    (``/proc/<pid>/task/<tid>/schedstat``): those new since the last census and those that ran
    since the last full census, which reads every thread, every ``FULL_CENSUSES`` censuses.
    """

    def __init__(self, gpus=()):
        self.gpus = gpus  # the task's GPUs: NVML is read at each census where there are any
        self.gpu_looks = 0
        self.gpu_slowdown = 0.0
        self.looks = 0
        self.stalled = 0.0
        self.slices = {}  # (pid, tid) -> how many times it was scheduled, at its last reading
        self.live = []  # threads that ran since the last full census, and new ones
        self.suspects = {}  # threads seen stalled -> the look that last saw them so
        self.turn = 0
        self.censuses = 0

    def look(self, pids):
        census = self.looks % CENSUS_LOOKS == 0
        if census:
            self.census(pids, full=self.censuses % FULL_CENSUSES == 0)
            self.censuses += 1
            self.look_at_gpus()
        self.looks += 1
        if census:
            keys = list(self.live)  # every thread that runs: the suspects' roll is made afresh
        else:
            others = [key for key in self.live if key not in self.suspects]
            count = min(DISCOVER, len(others))
            keys = list(self.suspects) + [others[(self.turn + n) % len(others)] for n in range(count)]
            self.turn = (self.turn + count) % max(1, len(others))
        stalled = 0
        for key in keys:
            state = stalls(key)
            if state is None:
                self.suspects.pop(key, None)
            elif state:
                stalled += 1
                if key in self.suspects or len(self.suspects) < MOST_SUSPECTS:
                    self.suspects[key] = self.looks
            elif self.looks - self.suspects.get(key, self.looks) > SUSPECT_LOOKS:
                del self.suspects[key]  # not seen stalled for a while: a thread of a pool that moved on
        self.stalled += stalled

    def census(self, pids, full):
        """Which threads ran: of every thread when ``full``, else of those that ran since the last
        full census; threads new since the last census count as running."""
        keys = []
        for pid in pids:
            try:
                keys += [(pid, int(tid)) for tid in os.listdir("/proc/%d/task" % pid)]
            except (OSError, ValueError):
                continue
        if full:
            present = set(keys)
            for key in [key for key in self.slices if key not in present]:
                del self.slices[key]
        was_live = set(self.live)
        live = []
        for key in keys:
            before = self.slices.get(key)
            if not (full or before is None or key in was_live):
                continue
            text = read_small("/proc/%d/task/%d/schedstat" % key)
            try:
                slices = int(text.split()[2])
            except (AttributeError, IndexError, ValueError):
                continue
            if slices != before or (not full and key in was_live):
                live.append(key)
            self.slices[key] = slices
        self.live = live

    def look_at_gpus(self):
        nvml = Nvml.here() if self.gpus else None
        readings = [nvml.reading(index) for index in self.gpus] if nvml else []
        readings = [reading for reading in readings if reading is not None]
        if readings:
            self.gpu_looks += 1
            self.gpu_slowdown += max(gpu_slowdown(reading) for reading in readings)

    def totals(self):
        """``looks stalled``, and ``gpu_looks gpu_slowdown`` after them once its GPUs were read:
        what follows the task's resource figures on its reading's line."""
        text = "%d %.2f" % (self.looks, self.stalled)
        if self.gpu_looks:
            text += " %d %.3f" % (self.gpu_looks, self.gpu_slowdown)
        return text
