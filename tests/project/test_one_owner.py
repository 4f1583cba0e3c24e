"""Facts with one owner: the launcher compares states through the enums of launcher/records/states.py
and roles through its Role, not through the words they are spelled with; the
probes' output marks are spelled by the probe modules only; no signature re-declares a run option's
default. Read from the launcher's source with ast, so strings in messages and docstrings do not
count, only comparisons (and, for the marks, code)."""

from __future__ import annotations

import ast
from pathlib import Path

import click
import pytest

from launcher.cluster import mesh_probe, probe
from launcher.records.states import Role
from launcher.records.states import Outcome, RunStatus, TaskState
from source_scan import LAUNCHER, code_strings, launcher_modules

pytestmark = pytest.mark.project

STATES = LAUNCHER / "records" / "states.py"
STATE_WORDS = {w.value for enum in (RunStatus, TaskState, Outcome) for w in enum} | {"died"}


def compared_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant a comparison (==, !=, in, not in, is) or a match case holds, with its line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        for operand in operands:
            items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            found += [(item.lineno, item.value) for item in items
                      if isinstance(item, ast.Constant) and isinstance(item.value, str)]
    return found


def state_word_comparisons(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [f"{path.relative_to(LAUNCHER.parent)}:{line}: {word!r}" for line, word in compared_strings(tree)
            if word in STATE_WORDS]


def test_the_finder_sees_every_form_of_comparison(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('if a == "running" or "failed" != b or c in ("stopped", "x") or d not in {"pending"}:\n'
                      '    pass\n'
                      'match e:\n'
                      '    case "succeeded":\n'
                      '        pass\n'
                      'message = "the run failed"; f(status="running")\n')
    words = [word for _, word in compared_strings(ast.parse(sample.read_text()))]
    assert sorted(w for w in words if w in STATE_WORDS) == ["failed", "pending", "running", "stopped", "succeeded"]


def test_no_module_outside_states_compares_a_state_word():
    found = [hit for path in launcher_modules() if path != STATES for hit in state_word_comparisons(path)]
    assert found == [], "compare with RunStatus/TaskState/Outcome from launcher/records/states.py:\n" + "\n".join(found)


def test_the_enums_still_compare_equal_to_the_words_run_json_holds():
    # Readers compare raw JSON values (slurm.json's neighbour run.json, a summary's status) with the enums.
    assert RunStatus.RUNNING == "running" and "launcher-lost" in (RunStatus.RUNNING, RunStatus.LAUNCHER_LOST)
    assert TaskState.FAILED == "failed" and Outcome.INTERRUPTED == "interrupted"


# -- the run folder's layout -------------------------------------------------------------------

FOLDER = LAUNCHER / "records" / "folder.py"


def layout_names() -> tuple[set[str], set[str]]:
    """(names distinctive enough to look for anywhere in code, plain words looked for only in paths)."""
    from launcher.records import folder

    names = {value for key, value in vars(folder).items() if key.isupper() and isinstance(value, str)
             and key not in ("DEFAULT_LOG_DIR",)}
    plain = {name for name in names if name.isalpha()}  # backup, stacks, tensorboard: words in other senses too
    return names - plain - {".log", ".txt"}, plain | {".log", ".txt"}


def layout_spelled(path: Path) -> list[str]:
    """Where a module spells a name of the run folder's layout: anywhere in code for a distinctive
    name (run.json, attempt-), in a path for a plain word (x / "backup", f"{run_dir}/stacks", ".log")."""
    distinct, plain = layout_names()
    tree = ast.parse(path.read_text(), str(path))
    found = [(node.lineno, node.value) for node in code_strings(tree) if any(name in node.value for name in distinct)]
    for node in ast.walk(tree):
        sides = [node.left, node.right] if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) else []
        if isinstance(node, ast.JoinedStr):
            sides = [v for v in node.values if isinstance(v, ast.Constant)]
        for side in sides:
            if isinstance(side, ast.Constant) and isinstance(side.value, str) and side.value.lstrip("/*") in plain:
                found.append((side.lineno, side.value))
    where = path.relative_to(LAUNCHER.parent) if path.is_relative_to(LAUNCHER) else path.name
    return [f"{where}:{line}: {value!r}" for line, value in sorted(set(found))]


def test_the_layout_finder_sees_names_in_paths_and_messages(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Writes run.json."""\n'
                      'a = folder / "backup"\n'
                      'b = f"{run_dir}/checkpoints"\n'
                      'c = run.path / f"{task}.log"\n'
                      'd = path.glob("attempt-*/stacks")\n'
                      'e = f"see {x} (merged.log has them all)"\n'
                      'f = {"op": "stacks"}\n')
    found = [hit.split(": ", 1)[1] for hit in layout_spelled(sample)]
    assert found == ["'backup'", "'/checkpoints'", "'.log'", "'attempt-*/stacks'", "' (merged.log has them all)'"]


def test_no_module_outside_folder_spells_the_run_folders_layout():
    found = [hit for path in launcher_modules() if path != FOLDER for hit in layout_spelled(path)]
    assert found == [], "import the name from launcher/records/folder.py:\n" + "\n".join(found)


# -- defaults shown in help -----------------------------------------------------------------------

def test_no_help_or_message_spells_the_default_log_dir_by_hand():
    from launcher.cli.group import cli
    from launcher.options import DEFAULT_LOG_DIR

    spelled = f"./{DEFAULT_LOG_DIR}"
    found = [f"{path.relative_to(LAUNCHER.parent)}:{node.lineno}: {node.value!r}" for path in launcher_modules()
             for node in code_strings(ast.parse(path.read_text(), str(path))) if spelled in node.value]
    assert found == [], "derive it from launcher.options.DEFAULT_LOG_DIR:\n" + "\n".join(found)
    # ... and the help that names it still does, in its one spelling.
    run = cli.get_command(click.Context(cli), "run")
    (log_dir,) = [p for p in run.params if p.name == "log_dir"]
    assert log_dir.help.endswith(f"else {spelled}).")


# -- the run options' defaults ----------------------------------------------------------------------

# The names of the run options' defaults in launcher/options.py, which only RunOptions may take as a
# default (MAX_RESTARTS and RESTART_DELAY are the cluster file's defaults too: ClusterSpec takes them).
OPTION_DEFAULTS = {"GRACE", "EVALUATOR_TIMEOUT", "STRAGGLER_TIMEOUT", "STRAGGLER_WARM_UP", "LOG_MAX_SIZE"}
OPTIONS = LAUNCHER / "options.py"


def defaults_taken(path: Path) -> list[str]:
    """Where a function's parameter or a class's field takes one of :data:`OPTION_DEFAULTS` as its default."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
        elif isinstance(node, ast.ClassDef):
            defaults = [item.value for item in node.body if isinstance(item, ast.AnnAssign) and item.value is not None]
        else:
            continue
        for default in defaults:
            names = {n.id for n in ast.walk(default) if isinstance(n, ast.Name)} | \
                    {n.attr for n in ast.walk(default) if isinstance(n, ast.Attribute)}
            found += [f"{path.relative_to(LAUNCHER.parent)}:{default.lineno}: {name}" for name in names & OPTION_DEFAULTS]
    return found


def test_the_defaults_finder_sees_parameters_and_fields(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f(a, grace=GRACE, *, b=options.EVALUATOR_TIMEOUT, c=1.0): pass\n"
                      "class S:\n    size: int = LOG_MAX_SIZE\n    other: int = 3\n")
    sample = sample.rename(LAUNCHER / "_defaults_sample.py")
    try:
        found = sorted(hit.split(": ")[1] for hit in defaults_taken(sample))
    finally:
        sample.unlink()
    assert found == ["EVALUATOR_TIMEOUT", "GRACE", "LOG_MAX_SIZE"]


def test_no_signature_outside_the_options_takes_a_run_options_default():
    # The run's options go down whole (one RunOptions); a parameter with its own default for one of
    # them would be a second copy that a caller could forget to pass.
    found = [hit for path in launcher_modules() if path != OPTIONS for hit in defaults_taken(path)]
    assert found == [], "take the value from the run's RunOptions:\n" + "\n".join(found)


# -- roles and the probes' marks ----------------------------------------------------------------------

SPEC = LAUNCHER / "records" / "states.py"
ROLE_WORDS = {role.value for role in Role}


def test_no_module_outside_the_spec_compares_a_role_word():
    found = [f"{path.relative_to(LAUNCHER.parent)}:{line}: {word!r}" for path in launcher_modules() if path != SPEC
             for line, word in compared_strings(ast.parse(path.read_text(), str(path))) if word in ROLE_WORDS]
    assert found == [], "compare with launcher.records.states.Role:\n" + "\n".join(found)


def test_a_role_compares_equal_to_the_word_a_task_holds():
    # A task's role stays the plain word (it goes into YAML and TF_CONFIG); the members compare equal to it.
    assert Role.CHIEF == "chief" and "ps" in (Role.PS,) and {"worker": 1}[Role.WORKER] == 1 and f"{Role.EVALUATOR}" == "evaluator"


PROBES = {Path(probe.__file__), Path(mesh_probe.__file__)}
MARKS = {probe.MARK.strip(), mesh_probe.LISTENING_MARK.strip(), mesh_probe.RESULT_MARK.strip()}


def test_only_the_probe_modules_spell_their_output_marks():
    found = [f"{path.relative_to(LAUNCHER.parent)}:{node.lineno}: {node.value!r}" for path in launcher_modules()
             if path not in PROBES for node in code_strings(ast.parse(path.read_text(), str(path)))
             if any(mark in node.value for mark in MARKS)]
    assert found == [], "take the mark from the probe module:\n" + "\n".join(found)
