"""tflaunch from Python: ``launch()`` runs a cluster as ``tflaunch run`` does; ``runs()`` and ``run_record()`` read runs.

::

    from launcher import launch
    result = launch(local=2, command=["python", "train.py", "--epochs", "3"])
    result.exit_code, result.status, result.run_dir, result.record

``launch`` takes the run options of the command line as keyword arguments (``--max-restarts 2``
is ``max_restarts=2``) and blocks until the run has ended. It works from a script, from a thread
and from a Jupyter kernel:

- **Signals.** It never takes over the process's signal handlers. Called from the main thread, it
  handles SIGINT for the length of the call only (then puts the caller's handler back): a Ctrl-C,
  or a notebook's interrupt, stops every task by the shutdown protocol, the run record is made
  final, and the call raises :class:`LaunchInterrupted`, a ``KeyboardInterrupt`` that carries the
  result. Called from any other thread it installs nothing (Python allows handlers only in the main
  thread); each run's tasks still end if the process ends.
- **Output.** The console lines (the tasks' lines and tflaunch's own messages, as on the command
  line but without colour or status line) go to ``sys.stdout`` as it is at each write, so
  ``contextlib.redirect_stdout`` and a notebook's cell output catch them; or to ``output`` (a text
  stream), or to ``on_line(text)``, called once per line from tflaunch's console thread.
- **Errors.** Bad input raises the :class:`~launcher.errors.LaunchError` the command line turns
  into its one-line message (``str(error)`` is that line, ``error.exit_code`` its exit code), worded
  for a Python caller: it names keyword arguments (``tasks='worker-7'``, ``no_check=True``) where the
  command line names its options (``--tasks worker-7``, ``--no-check``). Nothing has started then.
- **Failure.** A run that fails is a result (``result.ok`` is False), as ``subprocess.run`` returns
  one; with ``check=True`` it raises :class:`LaunchFailed` instead, which carries the result.
- **Records.** ``tflaunch runs`` lists a run started here by its call: ``launch(local=2, chief=True)``.

Importing this module is cheap; the run machinery is imported on the first call.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .errors import LaunchError
from .options import RunOptions, bad, count, gpu_indices, python_words
from .records.folder import DEFAULT_LOG_DIR
from .run.lifecycle.signals import Signals  # standard library only underneath: importing it stays cheap

if TYPE_CHECKING:
    from .inspect.runs import Run
    from .records.record import RootCause, RunRecord, TaskRecord
    from .records.states import RunStatus

__all__ = ["LaunchFailed", "LaunchInterrupted", "LaunchResult", "launch", "run_record", "runs"]



@dataclass(frozen=True)
class LaunchResult:
    """How a run ended: its exit code (as ``tflaunch`` would exit), status, folder and final record."""

    exit_code: int
    status: RunStatus  # a str enum: "succeeded", "failed" or "stopped"
    run_id: str
    run_dir: Path
    record: RunRecord  # run.json as the run left it (launcher.records.record)
    error: str | None = None  # an environment problem that ended the run (full disk, vanished folder)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def tasks(self) -> list[TaskRecord]:
        """Each task of the last attempt: its ``state``, ``exit_code`` or ``signal``, host and log."""
        return list(self.record.tasks)

    @property
    def root_cause(self) -> RootCause | None:
        """The task whose failure ended the run (its exit, host and last lines), or None."""
        return self.record.root_cause

    @property
    def sealed(self) -> bool:
        """Whether every task ran in a network namespace of the run's own (``record.unsealed_because``
        says why a run that was to be sealed was not)."""
        return self.record.sealed


class LaunchFailed(LaunchError):
    """``launch(check=True)``: the run ended without succeeding (a task failed, a watchdog or the
    environment ended it). ``result`` is how it ended; ``str(error)`` is the summary's first line
    (``run ... failed: worker-1 on localhost: exit code 3``); ``exit_code`` is the run's."""

    def __init__(self, result: LaunchResult, summary: str):
        super().__init__(summary)
        self.result = result
        self.exit_code = result.exit_code


class LaunchInterrupted(KeyboardInterrupt):
    """A Ctrl-C (SIGINT) stopped the run; every task was stopped first. ``result`` is the stopped run."""

    def __init__(self, result: LaunchResult):
        super().__init__(f"run {result.run_id} stopped by SIGINT; every task was stopped")
        self.result = result


@python_words()  # for the length of each call, messages name keyword arguments, not the command line's options
def launch(cluster: str | Path | Mapping[str, Any] | None = None, *, local: int | None = None,
           hosts: str | Mapping[str, int] | Sequence[str] | None = None, hostfile: str | Path | None = None,
           command: Sequence[str] | str | None = None, chief: bool = False, ps: int = 0, evaluator: bool = False,
           gpus: Sequence[int] | str | None = None, env: Mapping[str, str | None] | None = None,
           log_dir: str | Path | None = None, log_group: str | int | None = None, threads: int | str | None = None, grace: float = RunOptions.grace,
           max_restarts: int | None = None, restart_delay: float | None = None, min_workers: int | None = None,
           cooldown: float | None = None, spares: str | Mapping[str, int] | Sequence[str] | None = None,
           start_timeout: float | None = None, hang_timeout: float | None = None,
           keepalive_timeout: float | None = None, on_straggler: str = RunOptions.on_straggler,
           straggler_timeout: float = RunOptions.straggler_timeout,
           straggler_warm_up: float = RunOptions.straggler_warm_up,
           straggler_window: float = RunOptions.straggler_window,
           evaluator_timeout: float = RunOptions.evaluator_timeout, isolate_network: bool = False, no_seal: bool = False,
           log_max_size: int | str = RunOptions.log_max_size, no_check: bool = False, tasks: Iterable[str] | str | None = None,
           quiet: bool = False, verbose: bool = False, tensorboard: bool = False, debug: bool = False,
           output: IO[str] | None = None,
           on_line: Callable[[str], None] | None = None, check: bool = False, ray: str | None = None,
           nnodes: int | str | None = None, tasks_per_node: int = 1, gpus_per_task: int = 0) -> LaunchResult:
    """Run a cluster to its end, as ``tflaunch run`` does, and return how it ended.

    The cluster is one of: ``cluster`` (a cluster file's path, or a mapping in the same form),
    ``local=N``, ``hosts`` (``"node1:4,node2:4"``, ``{"node1": 4}`` or ``["node1:4", ...]``) or
    ``hostfile``; ``spares`` (with ``hosts`` or ``hostfile``) names spare hosts in the form ``hosts``
    takes. ``command`` is the task command (a list, or a string split as a shell would);
    the default is the built-in trainer. Every other argument is the run option of the same name
    (``log_max_size``: bytes, or a string such as ``"512M"``, as ``--log-max-size`` takes).
    ``env`` maps names to values; a name mapped to None passes this process's own value by name
    (``--env KEY``): the value reaches the tasks but no file, message or command line.

    ``ray`` runs on a Ray cluster (``"auto"``, ``"HOST:PORT"``), on ``nnodes`` of its nodes (``3``
    or ``"2:3"``), ``tasks_per_node`` tasks on each with ``gpus_per_task`` GPUs each; ``spares`` is
    then a number of spare nodes (docs/ray.md).

    ``check=True`` raises :class:`LaunchFailed` (carrying the result) when the run does not
    succeed, as ``subprocess.run(check=True)`` does. The default is False, as for
    ``subprocess.run``: a failed run is an answer to look at (``result.ok``, ``result.root_cause``),
    and callers written before ``check`` existed keep getting a result, never a new exception.
    A Ctrl-C raises :class:`LaunchInterrupted` either way.
    """
    from .run.lifecycle.launch import LaunchRequest
    from .run.lifecycle.signals import Interrupted
    from .sources.choose import ClusterChoice, OptionsError

    options = RunOptions(command=command, env=env, log_dir=log_dir, log_group=log_group, threads=threads, grace=grace,
                         max_restarts=max_restarts, restart_delay=restart_delay, min_workers=min_workers,
                         cooldown=cooldown, start_timeout=start_timeout,
                         hang_timeout=hang_timeout, keepalive_timeout=keepalive_timeout,
                         on_straggler=on_straggler, straggler_timeout=straggler_timeout,
                         straggler_warm_up=straggler_warm_up, straggler_window=straggler_window,
                         evaluator_timeout=evaluator_timeout,
                         isolate_network=isolate_network, no_seal=no_seal, no_check=no_check, tasks=tasks, quiet=quiet,
                         verbose=verbose, tensorboard=tensorboard, debug=debug, log_max_size=log_max_size)
    choice = ClusterChoice(
        cluster=None if cluster is None else (cluster if isinstance(cluster, Mapping) else str(cluster)),
        local=local, hosts=_hosts(hosts), hostfile=None if hostfile is None else str(hostfile), chief=bool(chief),
        ps=ps, evaluator=bool(evaluator), gpus=gpu_indices("gpus", gpus),
        spares=None if spares is None or ray is not None else _hosts(spares))
    if ray is not None:
        from .sources.ray import ray_nodes

        source = ray_nodes(choice, ray, nnodes, tasks_per_node=tasks_per_node, gpus_per_task=gpus_per_task,
                           spares=0 if spares is None else count("spares", spares, 0), start_timeout=start_timeout)
    else:
        source = choice.source(runs=True)
    try:
        return _launch(source, options, output, on_line, tensorboard, check)
    finally:
        finish = getattr(source, "finish", None)
        if finish is not None:  # a Ray run: its group and actors are freed
            finish(1)


def _launch(source, options: RunOptions, output, on_line, tensorboard: bool, check: bool) -> LaunchResult:
    from .run.lifecycle.launch import LaunchRequest
    from .run.lifecycle.signals import Interrupted
    from .sources.choose import OptionsError

    request = LaunchRequest(cluster=source.spec, options=options)
    if output is not None and on_line is not None:
        raise OptionsError("launch(): output and on_line cannot be combined; give one of them")
    if tensorboard:
        from .tensorboard import require

        require()

    from .run.console.writer import Console
    from .run.lifecycle.launch import run
    from .run.lifecycle.summary import describe_result

    sink = _LineSink(on_line) if on_line is not None else (output if output is not None else _CallerStdout())
    console = Console(sink, messages=sink, colour=False, status=False, tasks=options.tasks or None,
                      quiet=options.quiet, verbose=options.verbose)
    signals = _CallSignals()
    if hasattr(source, "signalled"):  # a Ray source: a Ctrl-C cuts its waits for Ray short
        source.signalled = lambda: signals.first
    board = None
    if tensorboard:
        from .tensorboard import BesideRun

        board = BesideRun(console.message)
    previous = _handle_sigint(signals)
    try:
        try:
            result = run(request, console, signals, on_folder=(lambda folder: board.start(folder.path)) if board else None)
        except Interrupted:  # Ctrl-C before any task existed: nothing to stop
            raise KeyboardInterrupt from None
        finally:
            if board is not None:
                board.stop()
        summary = describe_result(result, exit_line=False)  # the caller gets the exit code in the result
        console.message("\n".join(summary))
    finally:
        console.close()
        _restore_sigint(previous)
        signals.close()
    outcome = LaunchResult(exit_code=result.exit_code, status=result.record.status, run_id=result.run_id,
                           run_dir=Path(result.run_dir), record=result.record, error=result.error)
    if signals.first == signal.SIGINT:
        raise LaunchInterrupted(outcome)
    if check and not outcome.ok:
        raise LaunchFailed(outcome, summary[0])
    return outcome


@python_words()
def runs(log_dir: str | Path = DEFAULT_LOG_DIR) -> list[Run]:
    """The runs in ``log_dir``, newest first (``tflaunch runs``); each has ``run_id``, ``path``, ``status``,
    ``record`` and ``metrics()``."""
    from .inspect.runs import find_runs

    return find_runs(log_dir)


@python_words()
def run_record(run: str | None = None, log_dir: str | Path = DEFAULT_LOG_DIR) -> RunRecord:
    """The run record of a run: its id, a unique prefix or suffix of one, ``latest`` (the default), or the path of
    its run folder."""
    from .inspect.runs import resolve_run

    return resolve_run(log_dir, run).record


# -- the cluster options' Python forms ------------------------------------------------

def _hosts(value: str | Mapping[str, int] | Sequence[str] | None) -> str | None:
    """-H's text from a string, a {host: slots} mapping or a list of 'host[:slots]' items."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return ",".join(f"{host}:{slots}" for host, slots in value.items())
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return ",".join(value)
    raise bad("hosts", "'node1:4,node2:4', {'node1': 4} or ['node1:4', ...]", value)


# -- signals and output for one call ---------------------------------------------------------

class _CallSignals(Signals):
    """The run's one signal path, without taking over the process's handlers (see the module docstring)."""

    def install(self) -> None:
        """Never: launch() handles SIGINT itself, in the main thread and for the length of the call."""


def _handle_sigint(signals: _CallSignals) -> Any:
    """Route SIGINT to ``signals`` for this call; what to restore afterwards (None: nothing was changed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    signals.watch(signal.SIGINT)
    return signal.SIG_DFL if previous is None else previous  # None: a handler not set from Python


def _restore_sigint(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


class _CallerStdout:
    """Writes to ``sys.stdout`` as it is at each write (a notebook's cell, a redirect_stdout target)."""

    def write(self, text: str) -> int:
        stream = sys.stdout
        if stream is None:  # pythonw, a closed console: nowhere to show it
            return len(text)
        written = stream.write(text)
        stream.flush()
        return written if isinstance(written, int) else len(text)

    def flush(self) -> None:
        if sys.stdout is not None:
            sys.stdout.flush()


class _LineSink:
    """Hands each complete line, without its newline, to a callback."""

    def __init__(self, on_line: Callable[[str], None]):
        self.on_line = on_line
        self.partial = ""

    def write(self, text: str) -> int:
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            self.on_line(line)
        return len(text)

    def flush(self) -> None:
        pass
