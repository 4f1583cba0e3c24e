"""srun's own output is held within a bound however much it prints: its start, its latest lines,
the lines that name a lost node, and how much was left out between."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launcher.transports.heldoutput import HEAD, TAIL, HeldOutput

pytestmark = pytest.mark.slow

PRINTER = ("import sys\n"
           "w = sys.stdout.write\n"
           "for i in range(200000):\n"
           "    w(f'srun: line {i} ' + 'x' * 40 + '\\n')\n"
           "    if i == 100000:\n"
           "        w('srun: error: Node failure on node7\\n')\n"
           "sys.stderr.write('srun: error: the last word\\n')\n")


def test_a_child_printing_12_mb_is_held_as_its_start_its_end_and_the_lines_that_matter():
    held = HeldOutput(keep=lambda line: "Node failure on" in line)
    child = subprocess.Popen([sys.executable, "-c", PRINTER], stdout=held.fd, stderr=held.fd)
    held.started()
    assert child.wait(60) == 0
    held.wait(30)
    lines = held.lines()
    assert lines[0].startswith("srun: line 0 ") and lines[-1] == "srun: error: the last word"
    assert held.picked() == ["srun: error: Node failure on node7"]
    marker = next(line for line in lines if line.startswith("[... "))
    assert int(marker.split()[1].replace(",", "")) > 10_000_000
    assert sum(len(line) + 1 for line in lines) <= HEAD + TAIL + 100
