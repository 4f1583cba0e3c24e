"""Slurm's own commands (scontrol, srun, sbatch, squeue) run with timeouts; failures become one line.

tflaunch talks to Slurm only through its command-line tools, which read the site's slurm.conf
(or ``SLURM_CONF``) and speak its protocol version; no Python library is needed for any of it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence

from ..errors import LaunchError

COMMAND_TIMEOUT = 30.0  # seconds a controller query may take before tflaunch gives up

# Words in a Slurm error that mean the request itself was wrong (exit 2), not the cluster (exit 1).
_USER_MISTAKES = ("invalid", "Invalid", "not found", "unrecognized", "unknown", "Unknown", "requested node config",
                  "More processors requested", "Requested node configuration", "usage")


class SlurmError(LaunchError):
    """A Slurm command failed; the message is Slurm's own last line."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def slurm_run(argv: Sequence[str], *, what: str, timeout: float = COMMAND_TIMEOUT, input: str | None = None,
              env: Mapping[str, str] | None = None) -> str:
    """Run a Slurm command and return its stdout; raise SlurmError with its message when it fails."""
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"{what}: '{argv[0]}' is not installed here (is this a Slurm login node?)")
    try:
        done = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{what}: {argv[0]} got no answer within {timeout:g} s (is slurmctld up?)") from None
    if done.returncode != 0:
        raise SlurmError(f"{what}: {last_line(done.stderr) or f'{argv[0]} exited with {done.returncode}'}",
                         exit_code=2 if is_user_mistake(done.stderr) else 1)
    return done.stdout


def last_line(text: str) -> str:
    """The last non-empty line of a command's stderr, without Slurm's ``sbatch: error:`` noise."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    for noise in ("error: ", "fatal: "):
        head, sep, rest = line.partition(noise)
        if sep and head.rstrip(": ").isidentifier():
            line = f"{head.rstrip(': ')}: {rest}"
    return line


def is_user_mistake(stderr: str) -> bool:
    return any(word in stderr for word in _USER_MISTAKES)


def expand_hostlist(hostlist: str) -> list[str]:
    """``tfs-[1-2],gpu07`` -> its host names, by ``scontrol show hostnames``.

    Slurm's own expansion is the one that matches the site's naming (zero padding, nested ranges,
    several bracket groups), so tflaunch does not re-implement the syntax.
    """
    out = slurm_run(["scontrol", "show", "hostnames", hostlist], what=f"expanding the node list {hostlist!r}")
    names = [line.strip() for line in out.splitlines() if line.strip()]
    if not names:
        raise SlurmError(f"expanding the node list {hostlist!r}: scontrol printed no host names")
    return names


def job_states(job_ids: Sequence[str]) -> dict[str, str]:
    """Slurm's state of each job it still knows (PENDING, RUNNING, COMPLETED, ...); others are absent."""
    if not job_ids or shutil.which("squeue") is None:
        return {}
    try:
        # All jobs, filtered here: squeue -j fails as a whole when one id is no longer known.
        done = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %T"],
                              capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {}
    states = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in job_ids:
            states[parts[0]] = parts[1]
    return states
