"""A watched task's threads, CPUs and GPUs, for tflaunch's straggler rule (launcher/run/faults/stragglers.py):
:class:`ThreadWatch` keeps the running totals that go out with the task's resource readings
(:mod:`.sampling`), :class:`CpuShare` tells what of its CPUs others took while it waited for one;
its GPUs are read off the agent's loop (:mod:`.gpus`).
"""

import os
import time

from .gpus import GpuReader, gpu_slowdown
from .trees import read_small, schedstat, stat_fields

CENSUS_LOOKS = 5  # looks between readings of its threads' CPU and run-queue times
FULL_CENSUSES = 12  # censuses between readings of all its threads (else: those that ran, and new ones)
DISCOVER = 1  # threads looked at per look besides the suspects and newcomers, in turn, to find new suspects
MOST_SUSPECTS = 16
SUSPECT_LOOKS = 15  # looks after which a suspect not seen stalled again is one no more
MOST_NEWCOMERS = 32  # new threads a look takes at most (the newest)
NEWCOMER_LOOKS = 5  # looks for which a new thread is looked at every time, stalled or not
TICKS = os.sysconf("SC_CLK_TCK")
BUSY_SHARED = 0.1  # seconds for which one reading of /proc/stat serves every watched task of the agent
# A thread holds its task up by itself when it sleeps on purpose or waits for a disk: its kernel
# wait channel (/proc/<pid>/task/<tid>/wchan) names one of these. A thread waiting on a lock, a
# condition, a socket or a pipe (futex, epoll, poll) waits for something else; a running or
# runnable thread shows "0", and the run-queue time tells what it waited for a CPU.
STALL_WAITS = ("nanosleep", "io_schedule", "folio_wait", "page_bit", "bit_wait", "filemap", "blk", "jbd2",
               "nfs", "fuse", "rpc_wait", "ext4", "xfs")


_busy_read = [None, {}]  # when /proc/stat was last read (monotonic), and what busy_ticks found


def busy_ticks():
    """Each CPU's busy clock ticks from /proc/stat, by CPU number: user, system, interrupts and
    steal (time a hypervisor gave another guest). Niced work (``nice``) is left out: it gives way
    to a task at the default priority, so it takes no CPU the task wanted. One reading serves
    every task watched within :data:`BUSY_SHARED` seconds (the tasks of one look)."""
    now = time.monotonic()
    if _busy_read[0] is not None and 0 <= now - _busy_read[0] < BUSY_SHARED:
        return _busy_read[1]
    busy = {}
    try:
        with open("/proc/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return busy
    for line in text.split(b"\n"):
        if not (line.startswith(b"cpu") and line[3:4].isdigit()):
            continue
        fields = line.split()
        try:
            ticks = [int(field) for field in fields[1:9]]
            busy[int(fields[0][3:])] = ticks[0] + ticks[2] + ticks[5] + ticks[6] + (ticks[7] if len(ticks) > 7 else 0)
        except (IndexError, ValueError):
            continue
    _busy_read[:] = [now, busy]
    return busy


def cpu_seconds(pids):
    """The CPU time ``pids`` used so far (their threads' user and system time)."""
    total = 0
    for pid in pids:
        fields = stat_fields(pid)
        try:
            total += int(fields[11]) + int(fields[12])
        except (TypeError, IndexError, ValueError):
            continue  # gone
    return total / float(TICKS)


def cgroup_throttle_file(pid):
    """The file that counts the CPU time quota of ``pid``'s cgroup held it back, and the unit of
    its count in seconds, or None: ``cpu.stat``'s ``throttled_usec`` (cgroup v2) or
    ``throttled_time`` (v1's cpu controller, nanoseconds)."""
    try:
        with open("/proc/%d/cgroup" % pid, "rb") as cgroups:
            lines = cgroups.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            candidates = [("/sys/fs/cgroup/unified" + parts[2], b"throttled_usec", 1e-6),
                          ("/sys/fs/cgroup" + parts[2], b"throttled_usec", 1e-6)]
        elif "cpu" in parts[1].split(","):
            candidates = [("/sys/fs/cgroup/%s%s" % (name, parts[2]), b"throttled_time", 1e-9)
                          for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]
        else:
            continue
        for folder, key, unit in candidates:
            path = folder.rstrip("/") + "/cpu.stat"
            if throttled(path, key) is not None:
                return path, key, unit
    return None


def throttled(path, key):
    """The count ``key`` of the cpu.stat file ``path``, or None."""
    text = read_small(path, 1024)
    for line in (text or b"").splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == key:
            try:
                return int(words[1])
            except ValueError:
                return None
    return None


class CpuShare(object):
    """What one task lost of the CPUs it may run on, between two of its censuses: the share of
    them others used (other users' programs, other tasks, a hypervisor's other guests) while its
    threads waited for one, or the share of the time its cgroup's CPU quota held it back.

    A task's threads wait for a CPU (their run-queue time, ``/proc/<pid>/task/<tid>/schedstat``)
    when they outnumber its CPUs too; that alone sets no task apart. What does is who else ran
    there: ``lost`` takes the lesser of the others' share of its CPUs (busy time from /proc/stat
    less its own CPU time) and its threads' waiting, both per CPU it may use; a task that waits
    for a peer over the network leaves its CPUs idle or to others and is not the one held up.
    """

    def __init__(self, pid):
        self.pid = pid
        self.throttle = cgroup_throttle_file(pid)
        self.at = None
        self.busy = {}
        self.own = 0.0
        self.quota_held = 0

    def lost(self, pids, waited):
        """The share lost since the last call (None at the first): ``waited`` is the seconds its
        threads spent waiting for a CPU since then."""
        now = time.monotonic()
        busy, own = busy_ticks(), cpu_seconds(pids)
        # Looked up again each time: a task may be moved into another cgroup (and quota) as it runs.
        throttle, self.throttle = self.throttle, cgroup_throttle_file(self.pid)
        held = throttled(*self.throttle[:2]) if self.throttle else None
        if throttle != self.throttle:
            self.quota_held = held or 0  # another cgroup's count: it counts from here
        try:
            cpus = os.sched_getaffinity(self.pid)
        except OSError:
            cpus = set(busy)
        before_at, before_busy, before_own, before_held = self.at, self.busy, self.own, self.quota_held
        self.at, self.busy, self.own, self.quota_held = now, busy, own, held or 0
        if before_at is None or now - before_at <= 0:
            return None
        capacity = (now - before_at) * max(1, len(cpus))
        others = sum(busy.get(cpu, 0) - before_busy.get(cpu, 0) for cpu in cpus if cpu in before_busy)
        others = max(0.0, others / float(TICKS) - (own - before_own))
        taken = min(others, waited) / capacity
        quota = 0.0
        if held is not None:
            quota = (held - before_held) * self.throttle[2] / (now - before_at)
        return min(1.0, max(taken, quota, 0.0))


def stalls(key):
    """Whether thread ``key`` ((pid, tid)) sleeps on purpose or waits for a disk; None: gone."""
    channel = read_small("/proc/%d/task/%d/wchan" % key)
    if channel is None:
        return None
    channel = channel.decode("ascii", "replace")
    return any(word in channel for word in STALL_WAITS)


class ThreadWatch(object):
    """What one watched task's threads do, as running totals that tflaunch compares across the
    cluster's tasks: in synchronous training every task waits for the slowest one, and what sets
    the slowest apart is not its step time (the same for all) but what it does meanwhile.

    - ``looks`` and ``stalled``: every ``LOOK_EVERY`` seconds or so (:func:`.sampling.look_gap`) the agent
      looks at the wait channel of some of the task's threads; ``stalled`` sums, over the looks, how
      many of them sleep on purpose or wait for a disk (an input pipeline that sleeps or reads
      slowly). The figure is the task's, whichever threads do the work: a census's look takes every
      thread that runs; the others take the ``suspects`` (threads seen stalled lately: an input pipeline's work hops
      between a pool's threads), the ``newcomers`` (threads new within the last
      ``NEWCOMER_LOOKS`` looks, stalled or not) and ``DISCOVER`` others in turn, so a look costs
      a few reads however many threads TensorFlow made. Threads come and go (tf.data makes new
      ones for each new iterator: each epoch of a finite dataset, each call of ``fit``; gRPC's
      come and go all the time): a look lists the task's threads again when their count changed,
      and at every look for ``SUSPECT_LOOKS`` looks after a suspect ended, so the work is
      followed to the threads that took it over. A newcomer is looked at for several looks, not
      one: tf.data runs a ``from_generator`` input on a new pair of threads that hand the batches
      to each other in turn, so one look finds either of them waiting for its turn about as
      often as asleep in the generator, and each must be seen stalled once to become a suspect.
    - ``cpu_looks`` and ``cpu_lost``: at each census but the first, the share of its CPUs it lost
      to others while it waited for one, or to its cgroup's CPU quota (:class:`CpuShare`), summed.
    - ``gpu_looks`` and ``gpu_slowdown`` (sent only for a task with GPUs on a host with NVML):
      at each census, how much slower than its highest clock the task's slowest GPU runs because
      it is throttled (power cap, thermal or hardware slowdown, power brake), summed; and
      ``gpu_stale``, the censuses at which NVML had not answered within its deadline (:mod:`.gpus`).
    Which threads run is read every ``CENSUS_LOOKS`` looks from their scheduling counts
    (``/proc/<pid>/task/<tid>/schedstat``): those new since the last census and those that ran
    since the last full census, which reads every thread, every ``FULL_CENSUSES`` censuses.
    """

    def __init__(self, gpus=()):
        self.gpus = gpus  # the task's GPUs: read at each census where there are any
        self.gpu_looks = 0
        self.gpu_slowdown = 0.0
        self.gpu_stale = 0
        self.gpu_rounds = 0  # the GPU reader's rounds already counted
        self.looks = 0
        self.stalled = 0.0
        self.threads = set()  # (pid, tid) of every thread at the last listing
        self.counts = None  # each process's thread count then (None: never listed)
        self.slices = {}  # (pid, tid) -> (ns it waited for a CPU, times it was scheduled), at its last reading
        self.cpu = None  # its CpuShare, made at the first census
        self.cpu_looks = 0
        self.cpu_lost = 0.0
        self.live = []  # threads that ran since the last full census, and new ones
        self.ran = set()  # threads seen running since the last full census
        self.suspects = {}  # threads seen stalled -> the look that last saw them so
        self.newcomers = {}  # threads new lately -> the look that first found them
        self.follow_until = 0  # until this look, the threads are listed at every look (a suspect ended)
        self.turn = 0
        self.censuses = 0

    def look(self, pids):
        census = self.looks % CENSUS_LOOKS == 0
        new = self.listing(pids, force=census or self.looks < self.follow_until)
        if census:
            waited = self.census(full=self.censuses % FULL_CENSUSES == 0)
            self.censuses += 1
            self.look_at_cpus(pids, waited)
            self.look_at_gpus()
        self.looks += 1
        self.welcome(new)
        if census:
            live = set(self.live)
            keys = list(self.live) + [key for key in list(self.suspects) + list(self.newcomers) if key not in live]
        else:
            looked = set(self.suspects)
            fresh = [key for key in self.newcomers if key not in looked]
            looked.update(fresh)
            others = [key for key in self.live if key not in looked]
            count = min(DISCOVER, len(others))
            keys = list(self.suspects) + fresh + [others[(self.turn + n) % len(others)] for n in range(count)]
            self.turn = (self.turn + count) % max(1, len(others))
        stalled, suspect_ended = self.count_stalled(keys)
        if suspect_ended:
            # Its work may have gone to a thread made since (a pipeline rebuilt, a pool renewed, a
            # thread per call): follow it for a while, whether or not the next look finds it stalled.
            self.follow_until = self.looks + SUSPECT_LOOKS
            if not census:
                new = self.listing(pids, force=True)
                self.welcome(new)
                stalled += self.count_stalled([key for key in new if key in self.newcomers])[0]
        self.stalled += stalled

    def welcome(self, new):
        """Take the threads ``new`` (the newest :data:`MOST_NEWCOMERS`) as newcomers, looked at every
        look for :data:`NEWCOMER_LOOKS` looks: a pool's new threads may take up its work only after
        their first look, and then hand it to each other in turn (tf.data's threads do), so a
        single look finds a pipeline's new threads waiting for work as often as doing it."""
        for key in new[-MOST_NEWCOMERS:]:
            self.newcomers[key] = self.looks
        for key, since in list(self.newcomers.items()):
            if self.looks - since >= NEWCOMER_LOOKS or key in self.suspects:
                del self.newcomers[key]
        while len(self.newcomers) > MOST_NEWCOMERS:
            del self.newcomers[min(self.newcomers, key=self.newcomers.get)]

    def listing(self, pids, force):
        """The task's threads new since the last listing. It lists them again only when ``force``
        or when a process's count of threads changed (the link count of its /proc task folder,
        one cheap stat), else it finds none. The first listing finds none new: all are."""
        counts = []
        for pid in pids:
            try:
                counts.append(os.stat("/proc/%d/task" % pid).st_nlink)
            except OSError:
                counts.append(0)
        if not force and counts == self.counts:
            return []
        first = self.counts is None
        self.counts = counts
        keys = set()
        for pid in pids:
            try:
                keys.update((pid, int(tid)) for tid in os.listdir("/proc/%d/task" % pid))
            except (OSError, ValueError):
                continue
        new = [] if first else sorted(keys - self.threads)
        self.threads = keys
        return new

    def count_stalled(self, keys):
        """How many of the threads ``keys`` are stalled, and whether a suspect among them has
        ended. Threads seen stalled become suspects; a suspect not seen so for ``SUSPECT_LOOKS``
        looks is one no more."""
        stalled, suspect_ended = 0, False
        for key in keys:
            state = stalls(key)
            if state is None:
                self.newcomers.pop(key, None)
                suspect_ended = self.suspects.pop(key, None) is not None or suspect_ended
            elif state:
                stalled += 1
                if key not in self.suspects and len(self.suspects) >= MOST_SUSPECTS:
                    # The one seen stalled longest ago makes room: threads that stalled at start-up
                    # must not keep a pipeline's new thread out.
                    del self.suspects[min(self.suspects, key=self.suspects.get)]
                self.suspects[key] = self.looks
            elif self.looks - self.suspects.get(key, self.looks) > SUSPECT_LOOKS:
                del self.suspects[key]  # not seen stalled for a while: a thread of a pool that moved on
        return stalled, suspect_ended

    def census(self, full):
        """Which threads ran, of those of the last listing: of every thread when ``full``, else of
        those that ran since the last full census; threads new since the last census count as
        running. Returns the seconds the threads read waited for a CPU since their last reading (a
        thread not read did not run, so it did not wait for a CPU either, until a full census
        finds it running again)."""
        keys = sorted(self.threads)
        waited = 0
        if full:
            for key in [key for key in self.slices if key not in self.threads]:
                del self.slices[key]
            self.ran = set()
        was_live = set(self.live)
        live = []
        for key in keys:
            before = self.slices.get(key)
            if not (full or before is None or key in was_live):
                continue
            counts = schedstat("/proc/%d/task/%d/schedstat" % key)
            if counts is None:
                continue
            delay, slices = counts
            if before is not None:
                waited += max(0, delay - before[0])
                if slices != before[1]:
                    self.ran.add(key)
            # A new thread is live until a reading tells; one seen running stays live until the
            # next full census, as an input pipeline's pool hands work from thread to thread.
            if before is None or key in self.ran:
                live.append(key)
            self.slices[key] = (delay, slices)
        self.live = live
        return waited / 1e9

    def look_at_cpus(self, pids, waited):
        if not pids:
            return
        if self.cpu is None:
            self.cpu = CpuShare(pids[0])
        lost = self.cpu.lost(pids, waited)
        if lost is not None:
            self.cpu_looks += 1
            self.cpu_lost += lost

    def look_at_gpus(self):
        if not self.gpus:
            return
        rounds, readings, stale = GpuReader.here().take(self.gpus)
        if stale:
            self.gpu_stale += 1
        elif rounds > self.gpu_rounds and readings:
            self.gpu_rounds = rounds
            self.gpu_looks += 1
            self.gpu_slowdown += max(gpu_slowdown(reading) for reading in readings.values())

    def totals(self):
        """``looks stalled cpu_looks cpu_lost``, then ``gpu_looks gpu_slowdown`` once its GPUs were
        read or found stale, and ``gpu_stale`` once they were stale: what follows the task's
        resource figures on its reading's line."""
        text = "%d %.2f %d %.3f" % (self.looks, self.stalled, self.cpu_looks, self.cpu_lost)
        if self.gpu_looks or self.gpu_stale:
            text += " %d %.3f" % (self.gpu_looks, self.gpu_slowdown)
        if self.gpu_stale:
            text += " %d" % self.gpu_stale
        return text
