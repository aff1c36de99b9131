"""The ``zres`` command: one parser, one module per group of subcommands."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Any

import zmq

from .. import logs
from ..core import versions
from ..core.address import Unreachable
from ..core.errors import ZresError
from . import cluster, jobs
from .options import BROKER_ORDER, EXIT_USAGE, Parser, UsageError, add_log_level

_COMMANDS = {**cluster.COMMANDS, **jobs.COMMANDS}


class _Version(argparse.Action):
    """--version: say the versions (read only when asked: cloudpickle's costs an import)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        runs = versions.mine()
        print(f"zres {runs['zres']} (Python {platform.python_version()}, cloudpickle "
              f"{runs['cloudpickle']}, pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()})")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="zres", description="Resource-aware task scheduler.",
                    epilog=f"Every command finds its {BROKER_ORDER}. Agents read [agent] "
                    "instead of [client]; Python's zres.Client() reads the same, and with "
                    "no broker anywhere starts a private one.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="show the versions of zres and what it runs on, and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    cluster.add_parsers(sub)
    jobs.add_parsers(sub)
    for name, command in sub.choices.items():
        if "--log-level" not in command._option_string_actions:
            add_log_level(command)
        if name != "keygen":
            command.add_argument("--keys", metavar="DIR", help="the cluster's keys (default: "
                                 "$ZRES_KEYS, else [security] keys in the config file, else "
                                 "this user's own; see zres keygen)")
            command.add_argument("--insecure", action="store_true", help="no keys: a broker "
                                 "lets anyone in (beyond loopback only when given here, with "
                                 "a warning); others connect to such a broker")
    return parser


def _log_level(given: str | None) -> None:
    """Log from GIVEN (--log-level), else $ZRES_LOG_LEVEL, up; else leave logging alone
    (warnings only). A word that is not a level is a usage error naming where it was."""
    level = given or os.environ.get("ZRES_LOG_LEVEL")
    if not level:
        return
    try:
        logs.level_number(level)
    except ValueError as exc:
        raise UsageError(str(exc) if given else f"$ZRES_LOG_LEVEL: {exc}") from None
    logs.setup(None, level)


def main(argv: list[str] | None = None) -> None:
    """Run the zres command line; exit with its status."""
    parser = _parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_usage(sys.stderr)
        sys.exit(EXIT_USAGE)
    args = parser.parse_args(argv)
    if getattr(args, "keys", None) and getattr(args, "insecure", False):
        parser.error("--keys and --insecure: give one (keys, or none at all)")
    if getattr(args, "keys", None):
        os.environ["ZRES_KEYS"] = args.keys  # where every part of the command looks first
    if getattr(args, "insecure", False):
        os.environ["ZRES_INSECURE"] = "1"
    try:
        if args.command not in ("broker", "agent"):  # (the daemons set theirs up themselves)
            _log_level(args.log_level)
        code = _COMMANDS[args.command](args)
    except (UsageError, ValueError) as exc:  # bad input: resource specs, config, flags
        print(f"zres {args.command}: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except Unreachable as exc:  # nothing listens there: say how to get a broker
        print(f"zres {args.command}: {exc} (is a broker running? start one with `zres "
              f"broker`, or name another: see zres {args.command} --help)", file=sys.stderr)
        code = 1
    except (ZresError, zmq.ZMQError) as exc:  # e.g. no broker answered, address in use
        print(f"zres {args.command}: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `zres status --watch | head`: its reader has gone; so do we
        # (quietly: Python would complain again flushing stdout at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(code)
