"""Typed readers for the values of a cluster file: each names the key path and the bad value.

:class:`FieldReader` is what every section reader builds on (the cluster's roles, ``hosts``,
``ssh``, and the scheduler sections): it turns one YAML value into one Python value or raises a
:class:`ConfigError` such as ``clusters/x.yaml: worker[1].port: expected 1-65535, got 70000``.
"""

from __future__ import annotations

import shlex
from typing import Any, Callable, Iterable, Mapping, TypeVar

from ..errors import ConfigError, ConfigErrors, shown
from ..masking import is_secret_name
from ..taskenv import ENV_NAME
from .spec import ALL_GPUS, AUTO, RESERVED_ENV

T = TypeVar("T")


def env_items(items: Iterable[str]) -> dict[str, str | None]:
    """``--env`` items: ``KEY=VALUE``, or ``KEY`` alone, passed by name (None here: its value is read
    from tflaunch's environment when the run is planned; see ``EnvLayer`` in :mod:`.spec`). A bad name is
    a ValueError naming the name only, since the value may be a secret."""
    env: dict[str, str | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"expected KEY=VALUE or KEY with a variable name for KEY, got {key!r}"
                             + (" before '='" if sep else ""))
        env[key] = value if sep else None
    return env


class FieldReader:
    """Reads values of one file; ``fail`` builds the error for a key path, and ``collect`` keeps
    reading past one, so that a file's every mistake is found in one go (``problems``)."""

    def __init__(self, source: str):
        self.source = source
        self.problems: list[ConfigError] = []

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, key, message)

    def collect(self, read: Callable[[], T], default: T) -> T:
        """What ``read`` returns; when it raises a ConfigError, ``default``, the error kept in ``problems``."""
        try:
            return read()
        except ConfigError as error:
            self.problems.append(error)
            return default

    def read_port(self, value: Any, key: str) -> int | str:
        if value == AUTO:
            return AUTO
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected a port 1-65535 or 'auto', got {show(value)}")
        if not 1 <= value <= 65535:
            raise self.fail(key, f"expected a port 1-65535, got {value}")
        return value

    def read_fixed_port(self, value: Any, key: str, what: str = "the ssh port") -> int:
        """A port that must be written out (``what`` it is): 'auto' is refused."""
        port = self.read_port(value, key)
        if port == AUTO:
            raise self.fail(key, f"expected {what} 1-65535, got 'auto'")
        return int(port)

    def read_gpus(self, value: Any, key: str) -> tuple[int, ...] | None:
        if value == ALL_GPUS:
            return None
        if value is None:
            return ()
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list of GPU indices or 'all', got {show(value)}")
        seen: set[int] = set()
        for i, gpu in enumerate(value):
            if isinstance(gpu, bool) or not isinstance(gpu, int):
                raise self.fail(f"{key}[{i}]", f"expected a GPU index (integer >= 0), got {show(gpu)}")
            if gpu < 0:
                raise self.fail(f"{key}[{i}]", f"expected a GPU index >= 0, got {gpu}")
            if gpu in seen:
                raise self.fail(f"{key}[{i}]", f"GPU {gpu} is listed twice; expected distinct indices")
            seen.add(gpu)
        return tuple(value)

    def read_command(self, value: Any, key: str) -> tuple[str, ...]:
        if isinstance(value, str):
            try:
                argv = shlex.split(value)
            except ValueError as exc:
                raise self.fail(key, f"cannot split {value!r} into arguments ({exc})") from None
        elif isinstance(value, list):
            for i, arg in enumerate(value):
                if isinstance(arg, bool) or not isinstance(arg, (str, int, float)):
                    raise self.fail(f"{key}[{i}]", f"expected an argument (a string or a number), got {show(arg)}")
            argv = [str(a) for a in value]
        else:
            raise self.fail(key, f"expected a command string or a list of arguments, got {show(value)}")
        if not argv:
            raise self.fail(key, "expected a command, got an empty one")
        return tuple(argv)

    def read_env(self, value: Any, key: str) -> dict[str, str | None]:
        """A mapping of variables; one with no value (``KEY:``) is passed by name (see spec.EnvLayer)."""
        if value is None:
            return {}
        mapping = self.expect_mapping(value, key, "a mapping of environment variables")
        env: dict[str, str | None] = {}
        for name, raw in mapping.items():
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                raise self.fail(f"{key}", f"expected environment variable names, got {show(name)}")
            if name in RESERVED_ENV:
                hint = " (use 'gpus')" if name.startswith("CUDA_") else ""
                raise self.fail(f"{key}.{name}", f"is set by tflaunch for every task and cannot be overridden{hint}")
            if raw is None:
                env[name] = None  # by name: tflaunch's own value when the run is planned
                continue
            if isinstance(raw, bool):
                raw = "true" if raw else "false"
            if not isinstance(raw, (str, int, float)):
                # A secret's value is not shown, whatever it is: only its kind.
                got = f"a {type(raw).__name__}" if is_secret_name(name) else show(raw)
                raise self.fail(f"{key}.{name}", f"expected a string or number, got {got}")
            env[name] = getattr(raw, "text", None) or str(raw)
        return env

    def read_threads(self, value: Any) -> int | str:
        if value is False:
            return "off"  # YAML reads a bare off as false
        if value in (AUTO, "off"):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        raise self.fail("threads", f"expected 'auto', 'off' or a thread count >= 1, got {show(value)}")

    def check_keys(self, mapping: Mapping[Any, Any], known: tuple[str, ...], key: str) -> None:
        """Every unknown key of ``mapping`` (one error each, raised together)."""
        unknown = [name for name in mapping if name not in known]
        if not unknown:
            return
        import difflib  # only a mistake needs it

        errors = []
        for name in unknown:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; expected one of {', '.join(known)}"
            errors.append(self.fail(join_key(key, str(name)), f"unknown key{hint}"))
        raise ConfigErrors.of(errors)

    def expect_mapping(self, value: Any, key: str, expected: str) -> Mapping[Any, Any]:
        if not isinstance(value, dict):
            raise self.fail(key or "top level", f"expected {expected}, got {show(value)}")
        return value

    def expect_str(self, value: Any, key: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or str(value).strip() == "":
            raise self.fail(key, f"expected a non-empty string, got {show(value)}")
        return str(value)

    def read_host(self, value: Any, key: str) -> str:
        """A host name; YAML reads ``host: 12`` as a number, which is almost never a host's name."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise self.fail(key, f"expected a host name, got the number {value!r}; if the host's name really "
                                 f"is a number, quote it: '{value}'")
        return self.expect_str(value, key)

    def optional_str(self, mapping: Mapping[Any, Any], name: str, key: str) -> str | None:
        return None if mapping.get(name) is None else self.expect_str(mapping[name], join_key(key, name))

    def read_bool(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {show(value)}")
        return value

    def read_count(self, value: Any, key: str, least: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise self.fail(key, f"expected an integer >= {least}, got {show(value)}")
        return value

    def read_seconds(self, value: Any, key: str, allow_zero: bool = False) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value > 0 or allow_zero and value == 0)
        if not ok:
            raise self.fail(key, f"expected a number of seconds {'>= 0' if allow_zero else '> 0'}, got {show(value)}")
        return float(value)

    def optional_seconds(self, mapping: Mapping[Any, Any], name: str, key: str) -> float | None:
        return None if mapping.get(name) is None else self.read_seconds(mapping[name], join_key(key, name))


def join_key(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def show(value: Any) -> str:
    """A short rendering of a bad value of a cluster file, for messages, as YAML writes it (``true``, ``null``)."""
    return shown(value, none="null")
