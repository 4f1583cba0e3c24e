"""What a failure summary shows of a task that died of a Python exception: the exception and
its frame, not the last lines a long message fills."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launcher.run.console.chatter import meaningful
from launcher.run.console.pyerror import exception_lines

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "console" / "keras3_data_error.log"


def keep(lines: list[str]) -> list[str]:
    shown = meaningful()
    return [line for line in lines if shown(line)]


@pytest.mark.unit
def test_a_keras_3_error_with_an_array_in_its_message_shows_its_exception_and_frames():
    lines = keep(FIXTURE.read_text().splitlines())
    assert not any("ValueError" in line for line in lines[-20:])  # the last 20 lines: array rows only
    shown = exception_lines(lines)
    assert shown[0] == "Traceback (most recent call last):"
    assert shown[1] == "  [... 1 frame of it not shown here ...]"  # keras's error_handler
    assert shown[2].startswith('  File "/src/tflaunch/tests/fixtures/console/keras3_error.py", line 16')
    assert shown[3].strip() == 'model.fit([x, "a"], np.zeros(50), verbose=0)'
    assert "data_adapters/__init__.py" in shown[4]  # where it was raised
    assert shown[6].startswith("ValueError: Unrecognized data type: x=[array([[ 0.  ")
    assert shown[-1] == "[... 47 more lines after it ...]" and len(shown) == 11


@pytest.mark.unit
@pytest.mark.parametrize("lines", [
    [],
    ["just output", "more"],
    ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>'],  # cut before its exception
    ["Traceback (most recent call last):", "KeyboardInterrupt"],  # no frame
])
def test_no_complete_traceback_is_no_exception(lines):
    assert exception_lines(lines) is None


@pytest.mark.unit
def test_the_last_of_chained_exceptions_is_the_one_shown():
    lines = ["Traceback (most recent call last):", '  File "a.py", line 3, in <module>', "    f()",
             "KeyError: 'x'", "", "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", '  File "a.py", line 5, in <module>', "    g()",
             "RuntimeError: it broke"]
    assert exception_lines(lines) == lines[7:]


@pytest.mark.timeout(60)
def test_the_failure_summary_shows_the_exception_not_the_last_lines(tflaunch):
    code = f"import sys; sys.stderr.write(open({str(FIXTURE)!r}).read()); sys.exit(1)"
    done = tflaunch.run("--local", "1", "--", sys.executable, "-c", code)
    assert done.returncode == 1, done.stderr
    summary = done.stderr[done.stderr.index("root cause: "):]
    assert summary.startswith("root cause: worker-0 (host localhost, exit code 1); its exception:\n"), summary
    assert "worker-0 | ValueError: Unrecognized data type: x=[array([[ 0." in summary
    assert "worker-0 | [... 47 more lines after it ...]" in summary


@pytest.mark.timeout(60)
def test_a_task_that_ends_with_its_own_exit_code_shows_its_last_lines_whatever_it_printed_before(tflaunch):
    code = (f"import sys; sys.stderr.write(open({str(FIXTURE)!r}).read()); "
            "print('recovered, then gave up', flush=True); sys.exit(3)")
    done = tflaunch.run("--local", "1", "--", sys.executable, "-c", code)
    assert done.returncode == 3, done.stderr
    assert "root cause: worker-0 (host localhost, exit code 3); last 20 lines of its output:" in done.stderr
    assert "worker-0 | recovered, then gave up" in done.stderr
