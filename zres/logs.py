"""Logging: zres logs through the standard ``logging`` module (loggers under ``zres``);
the daemons render it with structlog, readable on a terminal, JSON lines otherwise.

A program using zres configures those loggers as it likes (``logging.basicConfig``, or
``logging.getLogger("zres")``); left alone, only warnings and errors reach its stderr
(logging's last resort), and nothing ever reaches its stdout. Each record's message reads
``event key=value ...``, and its ``zres_event`` attribute holds the fields themselves.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog
from structlog.types import EventDict, WrappedLogger

LEVELS = ("debug", "info", "warning", "error", "critical")
_KEY_VALUES = structlog.processors.LogfmtRenderer(bool_as_flag=False)


def _to_record(logger: WrappedLogger, method: str, event: EventDict
               ) -> tuple[tuple[str], dict[str, Any]]:
    """Turn a structlog event into a stdlib call: a readable message, the fields apart."""
    exc_info = event.pop("exc_info", None)
    fields = {k: v for k, v in event.items() if k != "event"}
    message = str(event.get("event", ""))
    if fields:
        message = f"{message} {_KEY_VALUES(logger, method, fields)}"
    return (message,), {"extra": {"zres_event": event}, "exc_info": exc_info}


def get_logger(name: str) -> Any:
    """Return a structlog logger for zres module NAME that hands each event to
    ``logging.getLogger(NAME)``, whatever the program did to structlog's own set-up."""
    return structlog.wrap_logger(
        logging.getLogger(name), wrapper_class=structlog.stdlib.BoundLogger,
        processors=[structlog.stdlib.filter_by_level, _to_record])


def level_number(level: str | None) -> int:
    """Return the logging level named LEVEL (any case); ValueError naming it if unknown."""
    name = (level or "info").lower()
    if name not in LEVELS:
        raise ValueError(f"unknown log level {level!r} (choose from {', '.join(LEVELS)})")
    return int(getattr(logging, name.upper()))


def _fields(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    """Put a zres record's fields back in place of its rendered message."""
    fields = getattr(event["_record"], "zres_event", None)
    if fields is None:
        return event  # another library's record: its message is the event
    return {**fields, **{k: v for k, v in event.items() if k != "event"}}


def setup(fmt: str | None = None, level: str | None = None) -> None:
    """Render every log record on stderr as console text (a TTY) or JSON (anything else),
    from LEVEL up (default $ZRES_LOG_LEVEL, else info): the daemons' set-up."""
    fmt = fmt or os.environ.get("ZRES_LOG_FORMAT") or ("console" if sys.stderr.isatty()
                                                       else "json")
    if fmt not in ("console", "json"):
        raise ValueError(f"unknown log format {fmt!r} (choose from console, json)")
    number = level_number(level or os.environ.get("ZRES_LOG_LEVEL"))
    renderer: list[Any] = ([structlog.dev.ConsoleRenderer(colors=False)] if fmt == "console"
                           else [structlog.processors.format_exc_info,
                                 structlog.processors.JSONRenderer()])
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[_fields, structlog.stdlib.add_log_level,
                           structlog.processors.TimeStamper(fmt="iso", utc=True)],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(number)
