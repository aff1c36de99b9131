"""Logging: zres logs through the standard ``logging`` module (loggers under ``zres``);
the daemons render it with structlog, readable on a terminal, JSON lines otherwise.

A program using zres configures those loggers as it likes (``logging.basicConfig``, or
``logging.getLogger("zres")``); left alone, only warnings and errors reach its stderr
(logging's last resort), and nothing ever reaches its stdout. Each record's message reads
``event key=value ...``, and its ``zres_event`` attribute holds the fields themselves.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from structlog.types import EventDict, WrappedLogger

LEVELS = ("debug", "info", "warning", "error", "critical")


class Logger:
    """The logger of zres module NAME: each event (``log.info("event", key=value)``) goes
    to ``logging.getLogger(NAME)`` as a record whose message reads ``event key=value``
    (structlog's logfmt) and whose ``zres_event`` holds the fields, whatever the program
    did to structlog's own set-up.

    An event below the logger's level costs one check, and structlog (with the asyncio it
    imports: 60 ms of a process's start here) is imported only once one is emitted: most
    ``zres`` commands, a worker process and a client program emit none, and start that
    much sooner (the daemons render with structlog: see ``setup``)."""

    __slots__ = ("_logger",)

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def _emit(self, level: int, event: str, fields: dict[str, Any],
              exc_info: Any = None) -> None:
        if not self._logger.isEnabledFor(level):
            return
        exc_info = fields.pop("exc_info", exc_info)
        message = str(event)
        if fields:
            message = f"{message} {_key_values()(None, '', fields)}"
        self._logger.log(level, message, exc_info=exc_info, stacklevel=3,  # (the caller's line)
                         extra={"zres_event": {"event": event, **fields}})

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the exception being handled (its traceback)."""
        self._emit(logging.ERROR, event, fields, exc_info=True)


@functools.cache
def _key_values() -> Any:
    """structlog's logfmt renderer (imported and made on first use: see Logger)."""
    import structlog
    return structlog.processors.LogfmtRenderer(bool_as_flag=False)


def get_logger(name: str) -> Logger:
    """Return the logger of zres module NAME (see Logger)."""
    return Logger(name)


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
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Rendered(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(number)


class _Rendered(logging.Formatter):
    """structlog's ProcessorFormatter for FMT, made at the first record it formats: a
    daemon that logs only warnings (a LocalCluster's, whose logs go nowhere) and has none
    to tell starts without importing structlog."""

    def __init__(self, fmt: str) -> None:
        super().__init__()
        self._fmt_name = fmt
        self._made: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        if self._made is None:
            import structlog
            renderer: list[Any] = (
                [structlog.dev.ConsoleRenderer(colors=False)] if self._fmt_name == "console"
                else [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()])
            self._made = structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=[_fields, structlog.stdlib.add_log_level,
                                   structlog.processors.TimeStamper(fmt="iso", utc=True)],
                processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                            *renderer])
        return self._made.format(record)
