"""The ``slurm:`` section of a cluster file, read into :class:`SlurmSettings` (values named on error).

Every key has a command-line twin on ``tflaunch submit``; the command line wins::

    slurm:
      nodes: 2                 # --nodes
      ntasks_per_node: 1       # --ntasks-per-node
      chief: false             # --chief
      ps: 0                    # --ps
      evaluator: false         # --evaluator
      spares: 1                # --spares: nodes held back to stand in for a failed one
      partition: debug         # --partition
      time: "1:00:00"          # --time
      gpus_per_task: 1         # --gpus-per-task
      account: myproject       # --account
      sbatch_options: ["--qos=high"]   # --sbatch-option (repeatable)
      requeue: true            # --requeue
      warning_seconds: 120     # --warning-seconds
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..cluster.fields import FieldReader, show
from ..errors import ConfigErrors
from ..records.folder import SBATCH_SCRIPT

SLURM_KEYS = ("nodes", "ntasks_per_node", "chief", "ps", "evaluator", "spares", "partition", "time", "gpus_per_task",
              "account", "sbatch_options", "requeue", "warning_seconds")
DEFAULT_WARNING_SECONDS = 120
# The settings written as text into job.sbatch, each with its option on 'tflaunch submit'.
SCRIPT_TEXT_OPTIONS = {"partition": "--partition", "time": "--time", "account": "--account",
                       "sbatch_options": "--sbatch-option"}


@dataclass(frozen=True)
class SlurmSettings:
    """How ``tflaunch submit`` asks Slurm for an allocation, and which roles to carve from it."""

    nodes: int | None = None
    ntasks_per_node: int | None = None
    chief: bool = False
    ps: int = 0
    evaluator: bool = False
    spares: int = 0  # nodes beyond ``nodes`` held back as spares (the job asks for nodes + spares)
    partition: str | None = None
    time: str | None = None  # Slurm's time syntax, e.g. "1:00:00"
    gpus_per_task: int | None = None
    account: str | None = None
    sbatch_options: tuple[str, ...] = ()  # extra sbatch arguments, e.g. ("--qos=high",)
    requeue: bool = False  # warn with USR1 before the end, save, and requeue the job
    warning_seconds: int = DEFAULT_WARNING_SECONDS


def has_control_character(text: str) -> bool:
    """Whether ``text`` holds a newline, tab, escape or other control character.

    Each such value lands on one ``#SBATCH`` line of job.sbatch; a newline would end that line and
    start another one, i.e. add a directive or a shell command nobody wrote on purpose.
    """
    return any(unicodedata.category(c) == "Cc" for c in text)


def script_text_problem(value: Any) -> str | None:
    """Why a setting cannot be written into job.sbatch (None: it can), naming the bad value."""
    for text in (value if isinstance(value, (list, tuple)) else [value]):
        if isinstance(text, str) and has_control_character(text):
            return f"expected text without control characters (it is written into {SBATCH_SCRIPT}), got {show(text)}"
    return None


def read_slurm_section(source: str, value: Mapping[str, Any] | None) -> SlurmSettings:
    """The typed section; ConfigError names ``slurm.<key>`` and the bad value, one for every
    mistake in the section (ConfigErrors when there are several)."""
    if value is None:
        return SlurmSettings()
    reader = FieldReader(source)
    mapping = reader.expect_mapping(value, "slurm", "a mapping of Slurm settings")
    collect = reader.collect
    collect(lambda: reader.check_keys(mapping, SLURM_KEYS, "slurm"), None)

    def positive(name: str) -> int | None:
        raw = mapping.get(name)
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise reader.fail(f"slurm.{name}", f"expected an integer >= 1, got {show(raw)}")
        return raw

    def sbatch_options() -> list[str]:
        written = options = mapping.get("sbatch_options", [])
        if isinstance(options, str):
            try:
                options = shlex.split(options)
            except ValueError as exc:
                raise reader.fail("slurm.sbatch_options", f"cannot split {options!r} ({exc})") from None
        if not isinstance(options, list) or not all(isinstance(o, str) and o.startswith("-") for o in options):
            raise reader.fail("slurm.sbatch_options", f"expected a list of sbatch options such as '--qos=high', "
                              f"got {show(written)}")
        return options

    def slurm_time() -> str | None:
        time = mapping.get("time")
        if time is not None and not isinstance(time, (str, int)) or isinstance(time, bool):
            raise reader.fail("slurm.time", f"expected a Slurm time such as '1:00:00' or minutes, got {show(time)}")
        return None if time is None else str(time)

    def script_text(name: str, value: Any) -> None:
        problem = script_text_problem(value)
        if problem:
            raise reader.fail(f"slurm.{name}", problem)

    options = collect(sbatch_options, [])
    time = collect(slurm_time, None)
    for name in SCRIPT_TEXT_OPTIONS:
        collect(lambda name=name: script_text(name, options if name == "sbatch_options" else mapping.get(name)), None)
    settings = SlurmSettings(
        nodes=collect(lambda: positive("nodes"), None),
        ntasks_per_node=collect(lambda: positive("ntasks_per_node"), None),
        chief=collect(lambda: reader.read_bool(mapping.get("chief", False), "slurm.chief"), False),
        ps=collect(lambda: reader.read_count(mapping.get("ps", 0), "slurm.ps"), 0),
        evaluator=collect(lambda: reader.read_bool(mapping.get("evaluator", False), "slurm.evaluator"), False),
        spares=collect(lambda: reader.read_count(mapping.get("spares", 0), "slurm.spares"), 0),
        partition=collect(lambda: reader.optional_str(mapping, "partition", "slurm"), None),
        time=time,
        gpus_per_task=collect(lambda: positive("gpus_per_task"), None),
        account=collect(lambda: reader.optional_str(mapping, "account", "slurm"), None),
        sbatch_options=tuple(options),
        requeue=collect(lambda: reader.read_bool(mapping.get("requeue", False), "slurm.requeue"), False),
        warning_seconds=collect(lambda: positive("warning_seconds"), None) or DEFAULT_WARNING_SECONDS,
    )
    if reader.problems:
        order = {str(name): place for place, name in enumerate(mapping)}  # the lines read as the file does
        raise ConfigErrors.of(sorted(reader.problems, key=lambda e: order.get(e.key.removeprefix("slurm."), -1)))
    return settings
