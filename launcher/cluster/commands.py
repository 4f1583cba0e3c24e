"""Which task commands can meet TensorFlow's Keras, so the note on tflaunch's Keras choice concerns them.

Pure: a script's text is read by the caller (``script_text``), never here. A command counts as one
that may run Keras unless it shows otherwise: the built-in trainer (it chooses its Keras itself and
its start line says which), a program that is not Python, and Python code, given with ``-c`` or
as a script on this machine, that imports only the standard library and runs no code it loads.
"""

from __future__ import annotations

import ast
import posixpath
import re
import sys
from typing import Callable

LEGACY_KERAS_NOTE = (
    "TF_USE_LEGACY_KERAS=1 set for every task: tf.keras is tf_keras there, because Keras 3 cannot run "
    "Model.fit under MultiWorkerMirroredStrategy (TF_USE_LEGACY_KERAS=0 in 'env' keeps Keras 3, and "
    "Model.fit then fails under MultiWorkerMirroredStrategy)"
)
_SHELLS = ("sh", "bash", "dash", "zsh")
_PYTHON_WORD = re.compile(r"(?:^|[\s/;&|(])python[\w.]*(?:\s|$)|\.py(?:\s|$)")
# Calls that run code the parser cannot see: what they load may import TensorFlow.
_DYNAMIC_CALLS = frozenset({"__import__", "exec", "eval", "compile", "import_module", "run_path", "run_module"})
_STDLIB = frozenset(sys.stdlib_module_names) - {"idlelib", "test"}

ScriptText = Callable[[str], "str | None"]  # a script's path (as the task sees it) -> its text, None if unread


def runs_python(argv: tuple[str, ...], python: str = "", workdir: str = "",
                script_text: ScriptText | None = None) -> bool:
    """Whether a task's command can run TensorFlow's Keras.

    Yes for the task's interpreter or any ``python*`` running a module other than the built-in
    trainer, a script, or ``-c`` code that may import TensorFlow; for a Python script
    (``train.py``) run directly; either behind ``env [NAME=VALUE ...]``; and for a shell's ``-c``
    line that names Python. A script is read with ``script_text`` (relative to ``workdir``): one
    that imports only the standard library is a no. Without ``script_text``, every script is a yes.
    """
    words = list(argv)
    if words and words[0].rsplit("/", 1)[-1] == "env":
        words = words[1:]
        while words and (words[0].startswith("-") or "=" in words[0]):
            words = words[1:]
    if not words:
        return False
    program = words[0].rsplit("/", 1)[-1]
    if words[0] == python or program.startswith("python"):
        if words[1:3] == ["-m", "trainer"]:
            return False
        if words[1:2] == ["-c"]:
            return len(words) < 3 or may_import_tensorflow(words[2])
        if len(words) > 1 and words[1].endswith(".py"):
            return _script_may_import(words[1], workdir, script_text)
        return True
    if program.endswith(".py"):
        return _script_may_import(words[0], workdir, script_text)
    if program in _SHELLS and "-c" in words[1:-1]:
        return _PYTHON_WORD.search(words[words.index("-c", 1) + 1]) is not None
    return False


def _script_may_import(path: str, workdir: str, script_text: ScriptText | None) -> bool:
    text = script_text(posixpath.normpath(posixpath.join(workdir, path))) if script_text else None
    return text is None or may_import_tensorflow(text)


def may_import_tensorflow(source: str) -> bool:
    """Whether Python ``source`` may import TensorFlow: it imports a module outside the standard
    library (or a relative one), calls what loads code (``exec``, ``__import__``, ``runpy``...),
    or cannot be parsed."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(alias.name.split(".")[0] not in _STDLIB for alias in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            if node.level or (node.module or "").split(".")[0] not in _STDLIB:
                return True
        elif isinstance(node, ast.Call):
            called = node.func
            name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", "")
            if name in _DYNAMIC_CALLS:
                return True
    return False
