"""The benchmarks' shared statistics (benchmarks/_bench.py), which every RESULT line rests on."""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "_bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["_bench"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_ratio_interval_holds_the_ratio_repeats_itself_and_narrows_with_steadier_runs():
    bench = load_bench()
    slow = [1.78, 1.63, 2.08, 1.70, 1.80, 1.65, 1.90]
    fast = [1.40, 1.22, 1.61, 1.35, 1.45, 1.30, 1.50]
    low, high = bench.ratio_interval(slow, fast)
    ratio = statistics.median(slow) / statistics.median(fast)
    assert low < ratio < high
    assert (low, high) == bench.ratio_interval(slow, fast)  # a fixed seed: the same runs, the same interval
    steady_low, steady_high = bench.ratio_interval([1.75, 1.76, 1.74, 1.75, 1.76, 1.75, 1.74],
                                                   [1.40, 1.41, 1.39, 1.40, 1.40, 1.41, 1.39])
    assert steady_high - steady_low < (high - low) / 5
    assert steady_low <= 1.75 / 1.40 <= steady_high


def test_a_side_without_runs_has_no_interval():
    bench = load_bench()
    assert all(math.isnan(x) for x in bench.ratio_interval([], [1.0, 1.1]))
    assert all(math.isnan(x) for x in bench.ratio_interval([1.0], []))


def test_a_missed_goal_ends_the_benchmark_with_a_failed_line_and_exit_1_and_a_missed_target_does_not():
    import subprocess

    def run(body: str) -> subprocess.CompletedProcess:
        code = f"import sys; sys.path.insert(0, {str(BENCH.parent)!r}); import _bench\n{body}"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    missed = run('_bench.main_guard(lambda: _bench.verdict("start CPU per host", 6.5, 5.0, " ms", guard=True))')
    assert missed.returncode == 1, missed.stdout + missed.stderr
    assert missed.stdout.splitlines()[-1] == "FAILED start CPU per host: 6.500 ms, over its goal of 5 ms"
    nothing = run('_bench.main_guard(lambda: _bench.verdict("running", float("nan"), 7.5, " ms/s", guard=True))')
    assert nothing.returncode == 1 and nothing.stdout.splitlines()[-1].startswith("FAILED running: nan")
    held = run('_bench.main_guard(lambda: _bench.verdict("start CPU per host", 4.5, 5.0, " ms", guard=True))')
    over = run('_bench.main_guard(lambda: _bench.verdict("a ratio", 1.4, 1.2))')
    assert (held.returncode, over.returncode) == (0, 0) and "FAILED" not in held.stdout + over.stdout
    assert "OVER TARGET" in over.stdout
