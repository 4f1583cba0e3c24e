"""Facts with one owner: the launcher compares states through the enums of launcher/records/states.py,
not through the words they are spelled with; read from the launcher's source with ast, so strings in
messages and docstrings do not count, only comparisons."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from launcher.records.states import Outcome, RunStatus, TaskState

pytestmark = pytest.mark.unit

LAUNCHER = Path(__file__).resolve().parent.parent / "launcher"
STATES = LAUNCHER / "records" / "states.py"
# Programs shipped to hosts as standalone source: they cannot import the launcher's modules.
SHIPPED = {LAUNCHER / "transports" / "hostagent.py", LAUNCHER / "cluster" / "probe.py",
           LAUNCHER / "cluster" / "mesh_probe.py"}
STATE_WORDS = {w.value for enum in (RunStatus, TaskState, Outcome) for w in enum} | {"died"}


def launcher_modules() -> list[Path]:
    return sorted(p for p in LAUNCHER.rglob("*.py") if p not in SHIPPED)


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
