"""Kubernetes objects as YAML text: block style, keys in the order written, scripts as literal blocks;
and the comment lines above them."""

from __future__ import annotations

from typing import Any, Iterable

import yaml


class _ManifestDumper(yaml.SafeDumper):
    """Multi-line strings (the start scripts) as ``|`` blocks, so a manifest reads like the script it runs."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_ManifestDumper.add_representer(str, _represent_str)


def comment(text: str) -> str:
    """``text`` as one comment line, of a manifest or of a shell script: a character that is not
    printable (a newline, a terminal escape) is written escaped, so no value a cluster file or
    the command line holds ends the comment and becomes a line of its own."""
    return "# " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def dump_documents(documents: Iterable[dict[str, Any]], header: str = "") -> str:
    """The documents as one YAML stream, after ``header`` (a comment line)."""
    body = yaml.dump_all(list(documents), Dumper=_ManifestDumper, sort_keys=False, default_flow_style=False,
                         explicit_start=True, width=10_000, allow_unicode=True)
    return f"{header}\n{body}" if header else body
