"""Configure structlog: readable on a terminal, JSON lines otherwise."""

from __future__ import annotations

import logging
import os
import sys

import structlog


def setup(fmt: str | None = None, level: str | None = None) -> None:
    """Send structlog events to stderr as console text (a TTY) or JSON (anything else)."""
    fmt = fmt or os.environ.get("ZRES_LOG_FORMAT") or ("console" if sys.stderr.isatty()
                                                       else "json")
    level_name = (level or os.environ.get("ZRES_LOG_LEVEL") or "info").upper()
    renderer: structlog.types.Processor = (structlog.dev.ConsoleRenderer(colors=False)
                                           if fmt == "console"
                                           else structlog.processors.JSONRenderer())
    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    renderer],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level_name, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
