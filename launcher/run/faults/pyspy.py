"""Reads the text of ``py-spy dump``: processes, their threads, each thread's frames, innermost first.

Pure: no py-spy is run here (the host agents run it, see :meth:`TaskProcess.dump_stacks`).
py-spy shortens a frame's file relative to the interpreter's own paths, so standard-library
files read ``threading.py``, installed packages ``tensorflow/python/eager/execute.py``, and a
script the path it is known by. :func:`kind_of` sorts a frame's file into one of three kinds:

- ``stdlib``: the standard library (also ``<frozen runpy>``);
- ``library``: an installed package: anything under ``site-packages``/``dist-packages``, TF's
  autograph output, or a shortened path whose top package is a known framework (TensorFlow,
  Keras, NumPy, ...);
- ``user``: everything else: the training program (the built-in trainer included).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

STDLIB = "stdlib"
LIBRARY = "library"
USER = "user"

# Top-level packages that count as the framework a training program calls into, when py-spy
# shows them by their package-relative path. Anything else that is not the standard library is
# the user's code.
LIBRARIES = frozenset({
    "tensorflow", "tf_keras", "keras", "absl", "numpy", "google", "grpc", "h5py", "wrapt", "ml_dtypes",
    "optree", "opt_einsum", "gast", "astunparse", "flatbuffers", "tensorboard", "tensorflow_datasets",
    "tensorflow_io", "tensorflow_estimator", "tensorflow_probability", "horovod", "jax", "jaxlib", "torch",
    "scipy", "sklearn", "pandas", "requests", "urllib3", "psutil", "yaml", "six", "typing_extensions",
    "portpicker", "dill", "cloudpickle",
})
_STDLIB_NAMES = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}

_PROCESS = re.compile(r"^Process (\d+): ?(.*)$")
_THREAD = re.compile(r'^Thread (\S+)(?: \(([^)]*)\))?(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^\s+(.+?) \((.*?)(?::(\d+))?\)\s*$")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int | None

    @property
    def kind(self) -> str:
        return kind_of(self.file)

    def __str__(self) -> str:
        return f"{self.function} ({self.file}{'' if self.line is None else f':{self.line}'})"


@dataclass(frozen=True)
class Thread:
    ident: str            # the OS thread id (or address) py-spy shows
    state: str            # "idle", "active", "active+gil", ...
    name: str | None      # the Python thread's name, when py-spy knows it
    frames: tuple[Frame, ...]  # innermost first

    @property
    def label(self) -> str:
        return self.name or f"thread {self.ident}"

    @property
    def owner(self) -> Frame | None:
        """The innermost frame outside the standard library: whose code the thread is stopped in
        (a ``time.sleep`` or ``Event.wait`` belongs to the code that called it)."""
        return next((f for f in self.frames if f.kind != STDLIB), self.frames[0] if self.frames else None)

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame of the user's code, if the thread has one."""
        return next((f for f in self.frames if f.kind == USER), None)


@dataclass(frozen=True)
class Process:
    pid: int
    command: str
    threads: tuple[Thread, ...]


@dataclass(frozen=True)
class Dump:
    processes: tuple[Process, ...] = ()
    problem: str | None = None  # why there are no stacks ("the task has ended", py-spy's error)

    @property
    def threads(self) -> list[Thread]:
        return [t for p in self.processes for t in p.threads if t.frames]


@dataclass
class _Building:
    pid: int
    command: str
    threads: list[Thread] = field(default_factory=list)


def parse_dump(text: str) -> Dump:
    """The processes and threads of one ``py-spy dump [--subprocesses]`` output.

    Text that holds no thread at all (an agent's "no stack dump: ..." or py-spy's own error)
    becomes a dump without processes whose ``problem`` is the text's first line.
    """
    processes: list[_Building] = []
    thread: tuple[str, str, str | None] | None = None
    frames: list[Frame] = []

    def close_thread() -> None:
        nonlocal thread, frames
        if thread is not None and processes:
            processes[-1].threads.append(Thread(*thread, tuple(frames)))
        thread, frames = None, []

    for line in text.splitlines():
        if match := _PROCESS.match(line):
            close_thread()
            processes.append(_Building(int(match.group(1)), match.group(2)))
        elif match := _THREAD.match(line):
            close_thread()
            if not processes:
                processes.append(_Building(0, ""))
            thread = (match.group(1), match.group(2) or "", match.group(3))
        elif thread is not None and (match := _FRAME.match(line)):
            frames.append(Frame(match.group(1), match.group(2), int(match.group(3)) if match.group(3) else None))
    close_thread()
    built = tuple(Process(p.pid, p.command, tuple(p.threads)) for p in processes)
    if any(p.threads for p in built):
        return Dump(built)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return Dump(built, first or "py-spy printed nothing")


def kind_of(path: str) -> str:
    """``stdlib``, ``library`` or ``user`` for a frame's file as py-spy shows it."""
    if path.startswith("<frozen"):
        return STDLIB
    if path.startswith("<"):
        return USER  # <string>, <stdin>: python -c and friends
    parts = path.replace("\\", "/").split("/")
    if "site-packages" in parts or "dist-packages" in parts:
        return LIBRARY
    if parts[-1].startswith("__autograph_generated_file"):
        return LIBRARY  # TensorFlow's conversion of a tf.function while it traces
    if path.startswith("/"):
        for i, part in enumerate(parts[:-1]):
            if re.fullmatch(r"python3(\.\d+)?", part) and i > 0 and parts[i - 1].startswith("lib"):
                return STDLIB
        return USER
    top = parts[0][:-3] if len(parts) == 1 and parts[0].endswith(".py") else parts[0]
    if top in LIBRARIES:
        return LIBRARY
    if top in _STDLIB_NAMES:
        return STDLIB
    return USER
