"""The ``zres`` command: argument parsing only; the work lives in the modules it calls."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

import zmq

from . import config, jobs_cli, logs
from . import protocol as P
from .errors import ZresError
from .resources import format_amount, format_units, parse_spec

EXIT_USAGE = 2


class _Fail(Exception):
    """A one-line error for the user: printed as ``zres CMD: MESSAGE``, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="zres", description="Resource-aware task scheduler.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    broker = sub.add_parser("broker", help="run the broker (one per cluster)")
    broker.add_argument("--listen", help=f"address to bind (default {config.DEFAULT_ADDRESS})")
    broker.add_argument("--prefetch", type=int, help="short tasks each slot may hold queued, "
                        "to hide the round trip between them (default 32; 0: none)")
    _common(broker)

    agent = sub.add_parser("agent", help="run a node agent")
    agent.add_argument("address", nargs="?", help="broker address (default $ZRES_BROKER)")
    agent.add_argument("--resources", "-r", help='what this node offers, e.g. "GPU=2 foo=1"')
    agent.add_argument("--nworkers", type=int, help="worker processes (slots), default 1")
    agent.add_argument("--nthreads", type=int, help="threads per worker (default: cores)")
    agent.add_argument("--name", help="agent name (default host-pid)")
    agent.add_argument("--job-logs", help="where command jobs' logs are kept "
                       "(default: zres-jobs-UID in the temporary directory)")
    agent.add_argument("--job-grace", type=_seconds, help="seconds a cancelled command job "
                       "has between SIGTERM and SIGKILL (default 5)")
    agent.add_argument("--no-detect", action="store_true",
                       help="offer only CPU=threads and --resources, no detected MEMORY/GPU")
    _common(agent)

    status = sub.add_parser("status", help="show agents, resources and waiting tasks")
    status.add_argument("address", nargs="?", help="broker address (default $ZRES_BROKER)")
    status.add_argument("--timeout", type=_seconds, default=10.0)

    res = sub.add_parser("resources", help="change an agent's capacity while it runs")
    res.add_argument("agent", help="agent name, as zres status shows it")
    res.add_argument("spec", help='new amounts, e.g. "GPU=1 foo=3" (0 removes a name)')
    res.add_argument("--broker", help="broker address (default $ZRES_BROKER)")
    res.add_argument("--timeout", type=_seconds, default=10.0)

    demo = sub.add_parser("demo", help="run the example on a local cluster")
    demo.add_argument("--inputs", type=int, default=20)
    jobs_cli.add_parsers(sub, _seconds)
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id")
    return int(text)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML config file (default $ZRES_CONFIG, ./zres.toml)")
    parser.add_argument("--exit-with", type=_pid, metavar="PID",
                        help="stop when process PID ends (LocalCluster passes its own)")
    parser.add_argument("--log-format", choices=["console", "json"])
    parser.add_argument("--log-level", default=None)


def main(argv: list[str] | None = None) -> None:
    """Run the zres command line; exit with its status."""
    parser = _parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_usage(sys.stderr)
        sys.exit(EXIT_USAGE)
    args = parser.parse_args(argv)
    try:
        code = _COMMANDS[args.command](args)
    except (_Fail, ValueError) as exc:  # bad input: resource specs, config, flags
        print(f"zres {args.command}: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except (ZresError, zmq.ZMQError) as exc:  # e.g. no broker answered, address in use
        print(f"zres {args.command}: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


def _broker(args: argparse.Namespace) -> int:
    from .broker import Broker
    settings = config.load("broker", {"listen": args.listen, "prefetch": args.prefetch},
                           path=args.config)
    logs.setup(args.log_format, args.log_level)
    broker = Broker(settings["listen"], settings["heartbeat_interval"],
                    settings["heartbeat_timeout"], settings["client_timeout"],
                    settings["starvation_after"], prefetch=settings["prefetch"])
    _exit_with(args, broker.stop)
    broker.run(ready=lambda: print(f"zres broker serving {broker.address}", flush=True))
    return 0


def _agent(args: argparse.Namespace) -> int:
    from .agent import Agent, plan_slots
    settings = config.load("agent", {"broker": args.address, "resources": args.resources,
                                     "nworkers": args.nworkers, "nthreads": args.nthreads,
                                     "name": args.name, "job_logs": args.job_logs,
                                     "job_grace": args.job_grace},
                           path=args.config)
    if not settings["broker"]:
        raise _Fail("no broker address: give one (tcp://HOST:7070) or set ZRES_BROKER")
    logs.setup(args.log_format, args.log_level)
    slots = plan_slots(settings["resources"], settings["nworkers"], settings["nthreads"],
                       detect=not args.no_detect)
    os.environ["ZRES_JOB_GRACE"] = str(settings["job_grace"])  # read by its workers' jobs
    agent = Agent(settings["broker"], slots, settings["name"], settings["heartbeat_interval"],
                  settings["heartbeat_timeout"], settings["job_logs"])
    _exit_with(args, agent.stop)
    agent.run()
    return agent.exit_code


def _exit_with(args: argparse.Namespace, stop: Any) -> None:
    if args.exit_with is not None:
        from .local import exit_with
        exit_with(args.exit_with, stop)


def _broker_address(given: str | None) -> str:
    return given or config.load("client")["broker"] or config.DEFAULT_ADDRESS


def _status(args: argparse.Namespace) -> int:
    from .local import request
    print(render_status(request(_broker_address(args.address), P.STATUS, {}, args.timeout)))
    return 0


def _resources(args: argparse.Namespace) -> int:
    from .local import request
    units = parse_spec(args.spec)
    reply = request(_broker_address(args.broker), P.RESOURCES,
                    {"agent": args.agent, "units": units}, args.timeout)
    if "error" in reply:
        raise ZresError(reply["error"])
    for index, slot in enumerate(reply["slots"]):
        label = args.agent if len(reply["slots"]) == 1 else f"{args.agent}[{index}]"
        print(f"{label}: {format_units(slot)}")
    return 0


def render_status(status: dict[str, Any]) -> str:
    """Format a broker status reply for people."""
    lines = [f"broker {status['address']}  clients: {status['clients']}", "", "agents:"]
    if not status["agents"]:
        lines.append("  (none)")
    for agent in status["agents"]:
        for index, slot in enumerate(agent["slots"]):
            label = agent["name"] if len(agent["slots"]) == 1 else f"{agent['name']}[{index}]"
            amounts = "  ".join(
                f"{n}={format_amount(n, slot['free'].get(n, 0))}/{format_amount(n, t)}"
                for n, t in sorted(slot["total"].items()))
            gpus = f"  gpus={','.join(slot['gpus'])}" if slot["gpus"] else ""
            lines.append(f"  {label:<20} running={slot['running']:<4} free/total: "
                         f"{amounts}{gpus}")
    counts = status["counts"]
    lines += ["", "tasks: " + (", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                               or "none")]
    if status.get("actors"):
        lines += ["", "actors:"]
        for actor in status["actors"]:
            label = f"{actor['cls']}({actor['name'] or actor['id'][:8]})"
            where = f" on {actor['agent']}" if actor["agent"] else ""
            why = f": {actor['reason']}" if actor.get("reason") else ""
            lines.append(f"  {label:<24} {actor['state']}{where}  {format_units(actor['units'])}"
                         f"  calls: {actor['running']} sent, {actor['queued']} queued"
                         f"  restarts left: {actor['restarts_left']}{why}")
    if status["waiting"]:
        lines += ["", "waiting:"]
        lines += [f"  {t['name']} (id {t['id']}): {t['reason']}" for t in status["waiting"]]
    return "\n".join(lines)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run
    return run(args.inputs)


_COMMANDS = {**jobs_cli.COMMANDS,
             "broker": _broker, "agent": _agent, "status": _status, "resources": _resources,
             "demo": _demo}
