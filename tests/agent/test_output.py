"""A worker keeps what each task prints by whole lines, within bounds (zres.agent.output)."""

from __future__ import annotations

import io
import threading

from zres.agent.output import BURST, LINE_MAX, STDERR, STDOUT, OutputBuffer, TaskStream
from zres.core.context import TaskContext, set_task_context


def _buffer() -> tuple[OutputBuffer, list[int]]:
    wakes: list[int] = []
    return OutputBuffer(lambda: wakes.append(1)), wakes


def test_whole_lines_go_the_rest_at_the_tasks_end():
    buf, wakes = _buffer()
    for piece in ("one", " two\nthr", "ee"):
        buf.write(5, STDOUT, piece)
    buf.write(6, STDERR, "other\n")
    assert wakes == [1]  # once, until the next take
    assert buf.take() == [[5, STDOUT, b"one two\n"], [6, STDERR, b"other\n"]]
    assert buf.take() == []
    buf.end(5)
    assert buf.take() == [[5, STDOUT, b"three\n"]]


def test_a_line_never_ended_is_cut_at_line_max():
    buf, _ = _buffer()
    for _ in range(LINE_MAX + 10):
        buf.write(1, STDOUT, "z")
    assert buf.take() == [[1, STDOUT, b"z" * LINE_MAX + b"\n"]]
    buf.end(1)
    assert buf.take() == [[1, STDOUT, b"z" * 10 + b"\n"]]


def test_what_goes_over_a_tasks_share_is_counted_where_it_was_dropped():
    buf, _ = _buffer()
    line = "y" * 1023 + "\n"
    buf.write(1, STDOUT, line * (BURST // 1024 + 3))
    buf.write(2, STDOUT, "another task's own share\n")
    items = buf.take()
    assert items[0] == [1, STDOUT, line.encode() * (BURST // 1024)]
    assert items[1] == [1, STDOUT, b"[zres: 3072 bytes of output dropped]\n"]
    assert items[2] == [2, STDOUT, b"another task's own share\n"]


def test_only_a_tasks_thread_is_caught_and_the_agent_log_keeps_everything():
    buf, _ = _buffer()
    original = io.StringIO()
    stream = TaskStream(buf, STDOUT, original)  # type: ignore[arg-type]

    def task() -> None:
        set_task_context(TaskContext(9, "node", {}))
        stream.write("from the task\n")
        set_task_context(None)
        stream.write("after it\n")

    thread = threading.Thread(target=task)
    thread.start()
    thread.join()
    stream.write("from elsewhere\n")
    assert buf.take() == [[9, STDOUT, b"from the task\n"]]
    assert original.getvalue() == "from the task\nafter it\nfrom elsewhere\n", \
        "the agent's log keeps what tasks print too"
