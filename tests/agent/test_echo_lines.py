"""A joined node's own console: its tasks' output as whole lines, each with the task's name."""

from __future__ import annotations

import tempfile

import pytest

from launcher.agent.channel import CHUNK_LINE, echo_lines

pytestmark = pytest.mark.unit


def echoed(chunks: list[bytes]) -> tuple[bytes, bytes]:
    with tempfile.TemporaryFile() as out:  # a file: a pipe would fill up with nobody reading it
        rest = b""
        for chunk in chunks:
            rest = echo_lines(out.fileno(), "worker-1", rest, chunk)
        out.seek(0)
        return out.read(), rest


def test_whole_lines_go_out_with_the_task_name_and_a_partial_line_waits():
    out, rest = echoed([b"epoch 1\nepo", b"ch 2\nloss"])
    assert out == b"worker-1 | epoch 1\nworker-1 | epoch 2\n"
    assert rest == b"loss"


def test_a_line_without_end_is_not_held_forever():
    out, rest = echoed([b"x" * CHUNK_LINE])
    assert out == b"worker-1 | " + b"x" * CHUNK_LINE + b"\n" and rest == b""
