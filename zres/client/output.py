"""Print what a client's tasks printed, line by line, each line prefixed
``(TASK AGENT) ``, on this process's stdout or stderr as the task wrote it.

The I/O thread prints a batch as it arrives, before it reads the results that follow
it, so a task's output is printed before its ``result()`` returns. The stream is looked
up at each batch, so pytest's capsys and notebooks that swap ``sys.stdout`` get it.
"""

from __future__ import annotations

import sys
from typing import Any


def print_output(items: list[Any]) -> None:
    """Print ITEMS ([id, task name, agent, stream, bytes]) from an ``output`` message."""
    out: list[str] = []
    err: list[str] = []
    for item in items:
        try:
            _, name, agent, stream, data = item
            text = data.decode("utf-8", "replace")
        except (TypeError, ValueError, AttributeError):
            continue  # malformed: not worth failing the client for
        prefix = f"({name} {agent}) "
        lines = out if stream == 1 else err
        for line in text.splitlines(keepends=True):
            lines.append(prefix + line if line.endswith("\n") else prefix + line + "\n")
    for lines, stream in ((out, sys.stdout), (err, sys.stderr)):
        if lines and stream is not None:
            try:
                stream.write("".join(lines))
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing to tell
                pass
