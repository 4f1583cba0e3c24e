"""Task text as the console shows it: TensorFlow's chatter recognised, and which lines of tasks are twins.

:class:`Chatter` recognises what TensorFlow's C++ runtime prints at start-up on every task (INFO
lines, the oneDNN notice, the absl pre-init warning, "no cuda drivers" and the cuInit error that
follows it on a CPU-only machine), with the lines that continue such a message (the CPU feature
notice's "To enable the following instructions" line, the stragglers' task names), and what
TensorFlow prints as a task ends of tflaunch's stop ("SIGTERM caught", collectives aborted or
cancelled, with the lines that continue those: "The tasks have crashed. ..."). The console
hides these unless ``--verbose``, and a failure summary leaves them out of a task's last lines
(:func:`meaningful`). :func:`twin_key`
says which lines of different tasks are the same line for the console's folding (:mod:`.twins`):
the same bytes, but for the stamp of a TensorFlow log line. Lines reach the console already
folded as a terminal shows them (:mod:`launcher.records.lines`).
"""

from __future__ import annotations

import re
from typing import Callable

# -- TensorFlow's chatter ------------------------------------------------------------------------

# glog-style lines from TensorFlow's C++ runtime (absl logging):
#   I0000 00:00:1795426522.929680    8464 port.cc:153] oneDNN custom operations are on...
# and the older format:
#   2024-01-01 12:00:00.123456: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow...
# The stamp is what differs between tasks that log the same message: the time and the thread id
# (glog), or the date and time (the older format). The level letter and the source stay.
_GLOG_STAMP = r"\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ "
_OLD_STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: "
_SOURCE = r"([\w./-]+):\d+\] "
_NATIVE = re.compile(rf"^(?:([IWEF]){_GLOG_STAMP}{_SOURCE}|{_OLD_STAMP}([IWEF]) {_SOURCE})")
_STAMPED = re.compile(rf"^(?:([IWEF]){_GLOG_STAMP}(?={_SOURCE})|{_OLD_STAMP}(?=[IWEF] {_SOURCE}))".encode())
# Where a task's report of an error starts: a C++ warning, error or fatal line, or a Python traceback.
_ERROR_START = re.compile(rf"^(?:[WEF]{_GLOG_STAMP}{_SOURCE}|{_OLD_STAMP}[WEF] {_SOURCE}|Traceback \(most recent call last\):)"
                          .encode())
_MAYBE_STAMPED = re.compile(rb"^(?:[IWEF]\d{4} |\d{4}-\d\d-\d\d )", re.MULTILINE)
_SOURCE_LINE = re.compile(rb"\.(?:cc|h):\d+\] ")
_ABSL_PREINIT = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_NO_DRIVER = "Could not find cuda drivers on your machine, GPU will not be used."
_CUINIT = "failed call to cuInit"
# The lines after the first of a multi-line C++ log message, which TensorFlow writes unstamped:
#   I0000 00:00:1795919977.849097    5353 cpu_feature_guard.cc:227] This TensorFlow binary is optimized ...
#   To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with ...
# and a task name per line after "Example stragglers:". Only these shapes count, and only right
# after a line that is hidden: a program's own line after the chatter is never taken for part of it.
_CONTINUATION = re.compile(r"To enable the following instructions: |/job:[\w-]+/replica:\d+/task:\d+\s*$"
                           r"|The tasks have crashed\. |The error could be from a previous operation\. "
                           r"|\s+\[\[\{\{node [^}]*\}\}\]\]")
# Warnings TensorFlow prints for every run of an ordinary program, whatever the program does.
_ROUTINE_WARNINGS = (
    "will not be optimized because the dataset does not implement the AsGraphDefInternal()",
    "TF-TRT Warning: Could not find TensorRT",
    "Unable to register cuDNN factory",
    "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory",
    "computation placer already registered",
)
# What TensorFlow prints as a task ends because tflaunch stopped it (the run ended, or another task
# failed): its preemption notifier's note of the SIGTERM, and the collectives it was in, aborted or
# cancelled. These follow from the stop and never explain a failure (a collective aborted for
# another reason, UNAVAILABLE or RESOURCE_EXHAUSTED, stays).
_SHUTDOWN = re.compile(r"SIGTERM caught at |Local rendezvous is aborting with status: (?:ABORTED|CANCELLED)")


def may_hold_chatter(block: bytes) -> bool:
    """A cheap test over a whole block before any of its lines is looked at one by one."""
    return _SOURCE_LINE.search(block) is not None or _ABSL_PREINIT.encode() in block


def starts_error(line: bytes) -> bool:
    """Whether ``line`` starts a report of an error: a TensorFlow C++ warning, error or fatal log
    line, or a Python traceback."""
    return _ERROR_START.match(line) is not None


def may_be_stamped(block: bytes) -> bool:
    """Whether any line of ``block`` may start with a log stamp (see :func:`twin_key`); cheap."""
    return _MAYBE_STAMPED.search(block) is not None


def twin_key(line: bytes) -> bytes | tuple[bytes, bytes]:
    """What two tasks' lines must share to be printed once for both.

    The line itself, except for a TensorFlow C++ or absl log line: its time and thread id (or
    date and time) are left out, since they differ on every task that logs the same message;
    the level and the source file and line stay. The two kinds of key never compare equal.
    """
    match = _STAMPED.match(line)
    if match is None:
        return line
    return (match.group(1) or b""), line[match.end():]


class Chatter:
    """Which lines of a task are TensorFlow's routine start-up output rather than the program's.

    Hidden: every INFO line of the C++ runtime, the absl pre-init warning, the routine warnings
    above, the messages of a task's stop, and the cuInit error, but only after the same task said it found no cuda driver (then
    the error only repeats that there is no GPU); and the continuation lines of a hidden message.
    Every other warning or error stays. A task's lines must be given in order, every one of them
    while :meth:`continues` says so.
    """

    def __init__(self) -> None:
        self._no_driver: set[str] = set()
        self._hid_last: set[str] = set()  # tasks whose last line was hidden: the next may continue it

    def continues(self, task: str) -> bool:
        """Whether ``task``'s next line may be the continuation of a message just hidden."""
        return task in self._hid_last

    def hides(self, task: str, line: str) -> bool:
        hidden = (task in self._hid_last and _CONTINUATION.match(line) is not None) or self._hides_line(task, line)
        if hidden:
            self._hid_last.add(task)
        else:
            self._hid_last.discard(task)
        return hidden

    def _hides_line(self, task: str, line: str) -> bool:
        if line.startswith(_ABSL_PREINIT):
            return True
        match = _NATIVE.match(line)
        if match is None:
            return False
        level = match.group(1) or match.group(3)
        text = line[match.end():]
        if level == "I":
            if text.startswith(_NO_DRIVER):
                self._no_driver.add(task)
            return True
        if level == "E" and text.startswith(_CUINIT):
            return task in self._no_driver
        if level in ("W", "E"):
            return any(routine in text for routine in _ROUTINE_WARNINGS) or _SHUTDOWN.match(text) is not None
        return False


def meaningful() -> Callable[[str], bool]:
    """A test for one task's lines, given in order: False for TensorFlow's chatter (see :class:`Chatter`)."""
    chatter = Chatter()
    return lambda line: not chatter.hides("", line)
