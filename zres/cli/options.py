"""What every zres command shares: one-line usage errors, argument types, common options,
and where to find the broker."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from .. import config, logs

EXIT_USAGE = 2


class UsageError(Exception):
    """A one-line error for the user: printed as ``zres CMD: MESSAGE``, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def seconds(text: str) -> float:
    """An argument type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value


def pid(text: str) -> int:
    """An argument type: a process id."""
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id")
    return int(text)


def log_level(text: str) -> str:
    """An argument type: a logging level's name (any case)."""
    try:
        logs.level_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.lower()


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """The --log-level option (every command has it)."""
    parser.add_argument("--log-level", type=log_level, metavar="LEVEL",
                        help=f"log from this level up: {', '.join(logs.LEVELS)} (default "
                        "$ZRES_LOG_LEVEL, else info for the broker and agents, else only "
                        "warnings)")


def add_daemon_options(parser: argparse.ArgumentParser) -> None:
    """The options of the long-running commands (broker, agent)."""
    parser.add_argument("--config", help="TOML config file (default $ZRES_CONFIG, ./zres.toml)")
    parser.add_argument("--exit-with", type=pid, metavar="PID",
                        help="stop when process PID ends (LocalCluster passes its own)")
    parser.add_argument("--log-format", choices=["console", "json"],
                        help="how log lines are written on stderr (default $ZRES_LOG_FORMAT, "
                        "else console on a terminal, json otherwise)")
    add_log_level(parser)


# Said by every command that talks to a broker (and by --help).
BROKER_ORDER = ("broker address: the one given here, else $ZRES_BROKER, else broker in the "
                "config file's [client] section (zres.toml), else "
                f"{config.DEFAULT_ADDRESS}; HOST:PORT means tcp://HOST:PORT")


def broker_address(given: str | None) -> str:
    """The broker to talk to: GIVEN, else $ZRES_BROKER, else the config file, else the
    default address."""
    return config.load("client", {"broker": given})["broker"] or config.DEFAULT_ADDRESS


def request(address: str, kind: str, body: dict[str, Any], timeout: float = 10.0
            ) -> dict[str, Any]:
    """Send one request to the broker at ADDRESS and return its reply's body."""
    from ..local import request as one_request
    return one_request(address, kind, body, timeout)
