"""``zres broker / agent / keygen / status / resources / demo``: running and looking at a
cluster."""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from .. import config, logs
from ..core import keys as K
from ..core import protocol as P
from ..core.address import bracketed, is_local, is_loopback, normalize, parse_http_address
from ..core.errors import ZresError
from ..core.report import in_user_units
from ..core.resources import UNIT, format_units, parse_spec
from ..logs import get_logger
from .options import BROKER_ORDER, UsageError, add_daemon_options, broker_address, request, seconds


def add_parsers(sub: Any) -> None:
    """Add the cluster commands to the zres command line."""
    broker = sub.add_parser("broker", help="run the broker (one per cluster)")
    broker.add_argument("--listen", help=f"address to bind (default {config.DEFAULT_ADDRESS})")
    broker.add_argument("--prefetch", type=int, help="short tasks each slot may hold queued, "
                        "to hide the round trip between them (default 32; 0: none)")
    broker.add_argument("--state", metavar="DIR", help="keep the cluster's state (jobs, "
                        "ids) here, so a restarted broker carries on (default: "
                        "$ZRES_STATE_DIR, else [broker] state in the config file, else "
                        "$XDG_STATE_HOME/zres/broker-PORT; a temporary one for port 0)")
    broker.add_argument("--http", metavar="ADDR", help="serve the dashboard, /metrics and "
                        "/health on HOST:PORT (default 127.0.0.1:8787; off: none)")
    broker.add_argument("--fresh", action="store_true",
                        help="start with empty state, saying what it discarded")

    keygen = sub.add_parser("keygen", help="make a cluster's keys (CURVE)")
    keygen.add_argument("dir", nargs="?", help="where (default: this user's own keys, "
                        f"{K.default_dir()})")
    keygen.add_argument("--role", choices=K.ROLES, help="make one more key, for this role")
    keygen.add_argument("--name", help="the added key's name (its owner)")
    keygen.add_argument("--agents", metavar="NODE,...", help="make one agent key per node "
                        "(agent-NODE: only it may register as NODE; remove its file to "
                        "revoke it), with the cluster's keys if DIR has none yet")
    keygen.add_argument("--force", action="store_true", help="replace keys already there")
    add_daemon_options(broker)

    agent = sub.add_parser("agent", help="run a node agent")
    agent.add_argument("address", nargs="?", help=BROKER_ORDER.replace("[client]", "[agent]"))
    agent.add_argument("--resources", "-r", help='what this node offers, e.g. "GPU=2 foo=1"')
    agent.add_argument("--nworkers", type=int, help="worker processes (slots), default 1")
    agent.add_argument("--nthreads", type=int, help="threads per worker (default: cores)")
    agent.add_argument("--name", help="agent name (default: the node's own key's, agent-NAME;"
                       " else host-pid)")
    agent.add_argument("--state", metavar="DIR", help="keep this agent's files here (job "
                       "logs, its workers' lease and socket), a directory of its own that "
                       "nobody else may read (default: $XDG_STATE_HOME/zres/agent-NAME, "
                       "else ~/.local/state/zres/agent-NAME)")
    agent.add_argument("--job-logs", metavar="DIR", help="keep command jobs' logs here "
                       "instead (private too; default: jobs in the --state directory)")
    agent.add_argument("--job-log-retention", metavar="SECONDS", help="how long an ended "
                       "command job's log is kept (default 604800: 7 days; inf: for ever)")
    agent.add_argument("--job-log-max-bytes", metavar="BYTES", help="the most bytes of "
                       "ended jobs' logs kept, the oldest removed first (default: no cap)")
    agent.add_argument("--job-grace", type=seconds, help="seconds a cancelled command job "
                       "has between SIGTERM and SIGKILL (default 5)")
    agent.add_argument("--data-listen", metavar="ADDR", help="where this agent serves the "
                       "results it holds to other agents and clients, e.g. tcp://0.0.0.0:7071 "
                       "(default: a free port, on loopback when the broker is on loopback)")
    agent.add_argument("--data-advertise", metavar="ADDR", help="the address others reach "
                       "this agent's data port at, when not the one it listens on (behind "
                       "NAT: the public address forwarded to it), e.g. tcp://203.0.113.5:7071; "
                       "who cannot reach it goes through the broker's relay")
    agent.add_argument("--store-memory", metavar="BYTES", help="how much of the results it "
                       "holds stay in memory before the oldest spill to its disk, e.g. 8GiB "
                       "(default: 30%% of the MEMORY it offers)")
    agent.add_argument("--memory-limits", choices=("auto", "cgroup", "watcher", "off"),
                       help="how a task's MEMORY is enforced (see README's Limits): auto "
                       "(the default) by cgroups where the agent can make them, else by a "
                       "watcher that kills a task's processes past it; off: not at all")
    agent.add_argument("--memory-reserve", metavar="BYTES", help="when the node has less "
                       "memory available than this, take no work and stop the newest task "
                       "of the lowest priority, e.g. 2GiB (default: 5%% of its memory; 0: "
                       "never)")
    agent.add_argument("--bind-cpus", action="store_true", default=None,
                       help="bind a task asking CPU=k to k cores of the agent's own")
    agent.add_argument("--drain-grace", type=float, metavar="SECONDS",
                       help="on SIGTERM, seconds running work has to finish before it is "
                       "stopped (default 30; 0: stop it at once); a second SIGTERM stops now")
    agent.add_argument("--no-detect", action="store_true",
                       help="offer only CPU=threads and --resources, no detected MEMORY/GPU")
    add_daemon_options(agent)

    status = sub.add_parser("status", help="show agents, resources and waiting tasks")
    status.add_argument("address", nargs="?", help=BROKER_ORDER)
    status.add_argument("--timeout", type=seconds, default=10.0,
                        help="seconds to wait for the broker's answer (default 10)")
    status.add_argument("--json", action="store_true", help="print the report as JSON "
                        "(amounts in user units; one line per refresh with --watch)")
    status.add_argument("--watch", type=seconds, nargs="?", const=2.0, metavar="SECONDS",
                        help="refresh every SECONDS (default 2) until Ctrl-C")

    res = sub.add_parser("resources", help="change an agent's capacity while it runs")
    res.add_argument("agent", help="agent name, as zres status shows it")
    res.add_argument("spec", help='new amounts, e.g. "GPU=1 foo=3" (0 removes a name)')
    res.add_argument("--broker", help=BROKER_ORDER)
    res.add_argument("--timeout", type=seconds, default=10.0,
                     help="seconds to wait for the broker's answer (default 10)")

    demo = sub.add_parser("demo", help="run the example on a local cluster")
    demo.add_argument("--inputs", type=_count, default=20,
                      help="how many inputs the example loads and processes (default 20)")


def _count(text: str) -> int:
    """An argument type: a whole number, 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 1 or more")
    return int(text)


def broker(args: argparse.Namespace) -> int:
    import shutil
    import sqlite3
    import tempfile

    from ..broker.server import Broker
    from ..broker.store import Store
    from ..core.limits import Limits
    settings = config.load("broker", {"listen": args.listen, "prefetch": args.prefetch,
                                      "state": args.state, "http": args.http},
                           path=args.config)
    quotas = config.quotas(path=args.config)  # (bad ones refused before anything starts)
    logs.setup(args.log_format, args.log_level)
    _open_files_to_hard_limit()
    given = "off" if settings["http"] is False else settings["http"]  # (TOML: http = false)
    if not isinstance(given, (str, type(None))):
        raise ValueError(f"http must be HOST:PORT or off, got {given!r}")
    http = parse_http_address(given or config.DEFAULT_HTTP)  # (ValueError: exit 2)
    keys_dir = _broker_keys(args, settings["listen"])
    directory = settings["state"]
    temporary = directory is None
    if temporary:
        directory = tempfile.mkdtemp(prefix="zres-broker-state-")
    try:
        store = Store(directory, fresh=args.fresh)
    except (OSError, sqlite3.Error) as exc:
        raise ZresError(f"cannot keep the broker's state in {directory}: {exc} (--state "
                        "DIR names another directory)") from None
    dashboard = None
    if store.discarded:
        held = ", ".join(f"{state}: {n}" for state, n in sorted(store.discarded.items()))
        print(f"zres broker: --fresh discarded the state in {directory} ({held})",
              file=sys.stderr, flush=True)
    try:
        try:
            broker = Broker(settings["listen"], settings["heartbeat_interval"],
                            settings["heartbeat_timeout"], settings["client_timeout"],
                            settings["starvation_after"], prefetch=settings["prefetch"],
                            limits=Limits.from_settings(settings), store=store,
                            keys=keys_dir, half_life=settings["fairshare_half_life"],
                            quotas=quotas, client_grace=settings["client_grace"],
                            relay=settings["relay_listen"], spin=settings["spin"])
        except zmq.ZMQError as exc:  # its address: taken, not this host's, not a host
            raise ZresError(f"cannot listen on {settings['listen']}: {exc.strerror}" + (
                " (bind to an address of this host, an interface's name or *)"
                if exc.errno in (errno.ENODEV, errno.EADDRNOTAVAIL) else "")) from None
        dashboard = _serve_http(broker, http, given is not None,
                                settings["http_request_timeout"])
        broker.dashboard_url = dashboard.url if dashboard is not None else None
        _exit_with(args, broker.stop)
        broker.run(ready=lambda: print(f"zres broker serving {broker.address}" + (
            f"\nzres broker dashboard {dashboard.url}" if dashboard else ""), flush=True))
    finally:
        if dashboard is not None:
            dashboard.close()
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


def _open_files_to_hard_limit() -> None:
    """Let the broker hold as many connections as the system lets it: every agent keeps
    two, and each of its worker processes one (results sent straight: agent/direct.py),
    so a few hundred agents pass the usual soft limit of 1,024 open files."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # (no hard limit: 65,536, or macOS's most, OPEN_MAX, which it refuses to pass)
    wanted = [hard] if hard != resource.RLIM_INFINITY else [1 << 16, 10240]
    error = None
    for target in wanted:
        if soft == resource.RLIM_INFINITY or soft >= target:
            return
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return
        except (ValueError, OSError) as exc:
            error = exc
    get_logger("zres.broker").warning("open_files_limit", soft=soft, hard=hard,
                                      error=str(error))


def _data_address(value: Any, what: str) -> None:
    """Refuse VALUE (a setting, WHAT) unless it is a zmq address a data port listens or is
    reached at: tcp://HOST:PORT (a port up to 65535) or ipc://PATH (None: not given)."""
    match = re.fullmatch(r"tcp://(\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\]|[^\s/:\[\]]+):(\d{1,5})"
                         r"|ipc://\S+", value) if isinstance(value, str) else None
    if value is not None and (match is None or int(match[2] or 0) > 65535):
        example = bracketed(value.removeprefix("tcp://")) if isinstance(value, str) else None
        raise ValueError(f"{what} {value!r} is not a data port's address: " + (
            f"an IPv6 address goes in brackets, its port after them: tcp://{example}"
            if example else "give tcp://HOST:PORT (an IPv6 HOST in brackets) or ipc://PATH"))
    if match is not None and match[1] is not None:
        try:
            normalize(value)  # (what else it says: a link-local address with no zone)
        except ValueError as exc:
            raise ValueError(f"{what} {exc}") from None


def _serve_http(broker: Any, address: tuple[str, int] | None, given: bool,
                request_timeout: float) -> Any:
    """Start the broker's HTTP server on ADDRESS (None: none), closing a connection that has
    not sent its whole request within REQUEST_TIMEOUT seconds. A port taken fails the
    broker when the address was GIVEN; the default one taken, it serves without HTTP."""
    from ..broker.http import DashboardServer
    if address is None:
        return None
    log = get_logger("zres.broker")
    if not is_loopback(address[0]):
        log.warning("http_public", http=f"{address[0]}:{address[1]}",
                    why="anyone who reaches it reads the cluster's status (names, owners); "
                    "nothing there can change the cluster")
    try:
        return DashboardServer(*address, broker.snapshots, broker.metrics,
                               request_timeout=request_timeout)
    except ZresError as exc:
        if given:
            raise
        log.warning("http_unavailable", error=str(exc), why="serving without a dashboard")
        return None


def _broker_keys(args: argparse.Namespace, listen: str) -> str | None:
    """The keys directory the broker serves with: --keys (or $ZRES_KEYS), else [security]
    keys, else this user's own, made on first start; None when insecure."""
    security = config.load("security", path=args.config)
    if config.insecure(security):
        if not is_local(listen) and not args.insecure:  # (given here: not the file's)
            raise ZresError(f"refusing to listen on {listen} without keys: insecure is set "
                            "in the configuration; only --insecure on the command line "
                            "lets anyone who reaches this address run code on every agent")
        get_logger("zres.broker").warning(
            "broker_insecure", listen=listen,
            why="no keys: anyone who can reach this address can run code on every agent")
        return None
    given = os.environ.get("ZRES_KEYS") or security["keys"]
    directory = Path(given) if given else K.default_dir()
    if not (directory / f"{K.BROKER}.key_secret").exists():  # a first start: make them
        try:
            K.keygen(directory)
        except K.KeysError:
            if not (directory / f"{K.BROKER}.key_secret").exists():
                raise
            return str(directory)  # another broker made them meanwhile: they are ours
        print(f"zres broker: made this cluster's keys in {directory} (agents and clients "
              "of this user find them there; copy them to other machines: see `zres "
              "keygen`)", file=sys.stderr, flush=True)
    return str(directory)


def keygen(args: argparse.Namespace) -> int:
    directory = args.dir or str(K.default_dir())
    if bool(args.role) != bool(args.name):
        raise UsageError("--role and --name go together")
    agents = [a.strip() for a in (args.agents or "").split(",") if a.strip()]
    if args.agents is not None and (args.role or not agents):
        raise UsageError("--agents takes node names (NODE1,NODE2,...), without --role")
    made = K.keygen(directory, args.role, args.name, args.force, agents=agents)
    print(f"made {', '.join(p.name for p in made)} in {directory}")
    if agents:
        print(f"give each node {K.BROKER}.key and its own agent-NODE.key_secret (in a "
              "directory of its own); start its agent with --name NODE. Removing a node's "
              f"agent-NODE.key from {directory} revokes it at once")
    elif args.role:
        print(f"give its owner {K.BROKER}.key and {made[0].name} (in a directory of their "
              "own, e.g. ~/.config/zres/keys, or one named by --keys / $ZRES_KEYS)")
    else:
        print(f"the broker uses the whole directory; give each agent {K.BROKER}.key and "
              f"agent.key_secret, each user {K.BROKER}.key and client.key_secret (or one "
              "made for them with --role client --name NAME), operators admin.key_secret; "
              "keep the secret files private (mode 0600)")
    return 0


def agent(args: argparse.Namespace) -> int:
    from ..agent.daemon import Agent
    from ..agent.memory.monitor import MODES
    from ..agent.slots import plan_slots
    from ..core import relaying
    settings = config.load("agent", {"broker": args.address, "resources": args.resources,
                                     "nworkers": args.nworkers, "nthreads": args.nthreads,
                                     "name": args.name, "job_logs": args.job_logs,
                                     "job_grace": args.job_grace,
                                     "job_log_retention": args.job_log_retention,
                                     "job_log_max_bytes": args.job_log_max_bytes,
                                     "drain_grace": args.drain_grace,
                                     "state": args.state, "data_listen": args.data_listen,
                                     "data_advertise": args.data_advertise,
                                     "store_memory": args.store_memory,
                                     "memory_limits": args.memory_limits,
                                     "memory_reserve": args.memory_reserve,
                                     "bind_cpus": args.bind_cpus},
                           path=args.config)
    # (bad input is refused before anything is detected, logged or made)
    store_memory = _bytes(settings["store_memory"], "store_memory")
    reserve = _bytes(settings["memory_reserve"], "memory_reserve")
    log_bytes = _bytes(settings["job_log_max_bytes"], "job_log_max_bytes")
    if log_bytes is not None and log_bytes <= 0:
        raise UsageError(f"job_log_max_bytes {settings['job_log_max_bytes']!r}: give a "
                         "positive number of bytes (or leave it out: no cap)")
    limits = str(settings["memory_limits"])
    if limits not in MODES:
        raise UsageError(f"memory_limits {limits!r}: give one of {', '.join(MODES)}")
    _data_address(settings["data_listen"], "data_listen")
    _data_address(settings["data_advertise"], "data_advertise")
    logs.setup(args.log_format, args.log_level)
    slots = plan_slots(settings["resources"], settings["nworkers"], settings["nthreads"],
                       detect=not args.no_detect)
    relaying.mode_of(None)  # ($ZRES_RELAY, which its workers read: refused here if wrong)
    address = settings["broker"] or config.DEFAULT_ADDRESS
    key = config.find_key(None, ("agent",), address, args.config, settings["name"])
    while True:
        # A node's own key (agent-NODE, from `zres keygen --agents`) names its agent.
        name = settings["name"] or (key.name if key is not None and key.role == "agent"
                                    and key.name != "agent" else None)
        agent = Agent(address, slots, name,
                      settings["heartbeat_interval"], settings["heartbeat_timeout"],
                      settings["job_logs"], settings["job_grace"], settings["drain_grace"],
                      key, settings["state"], settings["data_listen"],
                      store_memory, settings["data_advertise"], limits, reserve,
                      bind_cpus=bool(settings["bind_cpus"]),
                      job_log_keep=(settings["job_log_retention"], log_bytes))
        _exit_with(args, agent.stop)
        agent.run()
        # A broker starting on this machine makes this user's keys before it listens: an
        # agent that looked before they were made, refused for having none, looks again.
        if key is None and agent.refused == K.refusal(None):
            key = config.find_key(None, ("agent",), address, args.config, settings["name"])
            if key is not None:
                get_logger("zres.agent").info("agent_found_keys", directory=key.directory)
                continue
            get_logger("zres.agent").error("agent_refused", broker=address, why=agent.refused)
        return agent.exit_code


def _bytes(value: Any, what: str) -> int | None:
    """VALUE ("8GiB", "1e9", 1000000) as a number of bytes; None if not given."""
    if value is None:
        return None
    try:
        return parse_spec(f"MEMORY={value}")["MEMORY"] // UNIT
    except (ValueError, KeyError):
        raise UsageError(f"{what} {value!r}: give a number of bytes, e.g. 8GiB") from None


def _exit_with(args: argparse.Namespace, stop: Any) -> None:
    if args.exit_with is not None:
        from ..local import exit_with
        exit_with(args.exit_with, stop)


def status(args: argparse.Namespace) -> int:
    from .status_text import render_status

    address = broker_address(args.address)
    while True:
        report = in_user_units(request(address, P.STATUS, {}, args.timeout))
        if args.json:
            print(json.dumps(report, indent=None if args.watch else 2), flush=True)
        else:
            if args.watch and sys.stdout.isatty():
                print("\033[H\033[2J", end="")  # clear the terminal: one screen each time
            print(render_status(report) + ("\n" if args.watch else ""), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)  # (a refresh period the user asked for, not an ordering)


def resources(args: argparse.Namespace) -> int:
    units = parse_spec(args.spec)
    reply = request(broker_address(args.broker), P.RESOURCES,
                    {"agent": args.agent, "units": units}, args.timeout)
    if "error" in reply:
        raise ZresError(reply["error"])
    for index, slot in enumerate(reply["slots"]):
        label = args.agent if len(reply["slots"]) == 1 else f"{args.agent}[{index}]"
        print(f"{label}: {format_units(slot)}")
    return 0


def demo(args: argparse.Namespace) -> int:
    from ..demo import run
    return run(args.inputs)


COMMANDS = {"broker": broker, "agent": agent, "status": status, "resources": resources,
            "demo": demo, "keygen": keygen}
