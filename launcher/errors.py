"""Domain errors. The CLI is the only place that turns them into messages and exit codes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .masking import masked_text


def shown(value: Any, *, limit: int = 60, mapping: str = "a mapping", none: str = "nothing") -> str:
    """A bad value as a one-line message shows it: a word for a container or for no value (in the
    vocabulary of the file it came from: YAML's mapping, JSON's object and null), a boolean as YAML
    and JSON write it (``true``), a number as the file wrote it where it was kept (``text``), else
    its repr cut to ``limit`` characters, a secret in it masked (:func:`launcher.masking.masked_text`)."""
    if isinstance(value, Mapping):
        return mapping
    if isinstance(value, list):
        return "a list"
    if value is None:
        return none
    if isinstance(value, bool):
        return "true" if value else "false"
    text = getattr(value, "text", None) if isinstance(value, (int, float)) else None
    text = text if isinstance(text, str) else masked_text(repr(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


class LaunchError(Exception):
    """A problem the user can fix; reported as one line, exit code ``exit_code``."""

    exit_code = 2


class ConfigError(LaunchError):
    """The cluster file or the command-line options describe an impossible cluster.

    The message names the file, the key path, the bad value and what was expected.
    """

    def __init__(self, source: str, key: str, message: str):
        self.source = source
        self.key = key
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {message}")


class ConfigErrors(ConfigError):
    """Every problem found in one cluster file, each a :class:`ConfigError` of one line; the message
    is their lines, one under the other (the CLI shows each in the one format)."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = tuple(error for each in errors for error in getattr(each, "errors", (each,)))
        LaunchError.__init__(self, "\n".join(str(error) for error in self.errors))
        self.source, self.key = self.errors[0].source, self.errors[0].key

    @staticmethod
    def of(errors: list[ConfigError]) -> ConfigError:
        """The one error to raise for ``errors`` (at least one): itself when it is alone."""
        return errors[0] if len(errors) == 1 else ConfigErrors(errors)


class OptionsError(LaunchError):
    """Options that do not go together, or an option's bad value; one line, exit code 2."""


class PortInUseError(LaunchError):
    """A task's port is already taken on its host before anything started."""


class RunNotFoundError(LaunchError):
    """A run id (or the latest run) that is not in the log directory."""


class PreflightError(LaunchError):
    """A preflight check of the cluster's hosts failed before anything started."""


class UnknownTaskError(LaunchError):
    """An option names tasks the cluster does not have."""

    def __init__(self, source: str, given: str, unknown: list[str], known: list[str]):
        # given: the option as the user gave it, in the words of the front end (launcher.options.given)
        missing = ", ".join(f"'{name}'" for name in unknown)
        super().__init__(f"{given}: {source} has no task {missing}; its tasks are: {', '.join(known)}")


class EnvironmentProblem(LaunchError):
    """The machine refused something tflaunch needs: a log folder, disk space, free ports, file descriptors.

    Reported as one line naming the path or resource and the system's reason; exit code 1.
    """

    exit_code = 1
