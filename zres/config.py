"""Settings from defaults < config file < ZRES_* environment < command-line flags.

The file is TOML: ``--config PATH``, else ``$ZRES_CONFIG``, else ``./zres.toml`` if present.

    [broker]
    listen = "tcp://127.0.0.1:7070"
    [agent]
    resources = "GPU=2 MEMORY=100GB"     # or a table: [agent.resources] GPU = 2

Environment: ``ZRES_<SECTION>__<KEY>``, e.g. ``ZRES_AGENT__NTHREADS=4``, and for resources
either ``ZRES_AGENT__RESOURCES="GPU=2 foo=1"`` or one per name,
``ZRES_AGENT__RESOURCES__GPU=2``. Resource names keep their case on every route.

The broker's quotas, per owner (the name of a key), are a section of their own (``quotas``):

    [quotas]                  # what an owner's work holds at once, at most
    alice = "GPU=4"
    default = "GPU=8"         # every owner not named (none: no cap)
    [quotas.queued]           # how many tasks an owner may have waiting at once
    alice = 100000
    default = 1000000

or ``ZRES_QUOTAS__ALICE="GPU=4"`` and ``ZRES_QUOTAS__QUEUED__ALICE=100000`` (an owner
named in the environment is lower case: the file names any).
``ZRES_BROKER`` is the broker address for agents, clients and every command; it comes after
an address given on the command line (or to ``Client()``) and before the file's ``broker``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .core import keys
from .core.address import normalize
from .core.errors import ZresError
from .core.resources import Units, mapping_to_units, parse_spec
from .scheduler.owners import DEFAULT_HALF_LIFE, Quotas

DEFAULT_ADDRESS = "tcp://127.0.0.1:7070"
DEFAULT_HTTP = "127.0.0.1:8787"  # the broker's HTTP port (dashboard, /metrics, /health)

DEFAULTS: dict[str, dict[str, Any]] = {
    "broker": {"listen": DEFAULT_ADDRESS, "heartbeat_interval": 0.5, "heartbeat_timeout": 3.0,
               "client_timeout": 30.0, "starvation_after": 5.0, "prefetch": 32,
               # Fair share: an owner's recent use halves every this many seconds.
               "fairshare_half_life": DEFAULT_HALF_LIFE,
               # Seconds a client whose connection closed has to come back before its
               # (undetached) work is stopped.
               "client_grace": 5.0,
               # Seconds the loop polls for messages after a turn before it sleeps, while
               # that catches them (zres.broker.spinning); 0: off. None: the default there.
               "spin": None,
               # Limits (zres.core.limits); None: the default there.
               "max_header_bytes": None, "max_payload_bytes": None, "max_name_bytes": None,
               "max_resources": None, "max_slots": None, "max_tasks": None,
               "max_deps": None, "max_object_bytes": None, "state": None,
               # The HTTP port (dashboard, /metrics, /health): HOST:PORT or "off"; None:
               # DEFAULT_HTTP, given up with a warning if that port is taken.
               "http": None,
               # Seconds an HTTP connection has to send its whole request before it is closed.
               "http_request_timeout": 5.0,
               # Its relay (transfers for peers that cannot reach an agent): a zmq
               # address, or "off"; None: the broker's host (or socket path), a free port.
               "relay_listen": None},
    "agent": {"broker": None, "resources": None, "nworkers": 1, "nthreads": None,
              "name": None, "heartbeat_interval": 0.5, "heartbeat_timeout": 3.0,
              "job_logs": None, "job_grace": 5.0, "drain_grace": 30.0,
              # Seconds an ended command job's log is kept (inf: for ever), and the ended
              # jobs' logs' bytes kept at most, the oldest removed first (None: no cap);
              # see zres.agent.log_retention.
              "job_log_retention": 7 * 24 * 3600.0, "job_log_max_bytes": None,
              # The agent's own files (job logs, its workers' lease and socket); None:
              # $XDG_STATE_HOME/zres/agent-NAME (zres.agent.files).
              "state": None,
              # Its data port (zres.agent.data): where it listens (None: loopback when
              # its broker is on loopback, else every interface), where others reach it
              # (None: there, a wildcard replaced by this host's address towards the
              # broker), and how much its store keeps in memory before spilling to disk
              # (None: 30% of its MEMORY).
              "data_listen": None, "data_advertise": None, "store_memory": None,
              # Memory limits (zres.agent.memory): auto (cgroups where it can make them,
              # else a watcher), cgroup, watcher or off; the node's reserve (None: 5% of its
              # memory); and binding CPU=k tasks to k cores of the agent's affinity set.
              "memory_limits": "auto", "memory_reserve": None, "bind_cpus": False},
    "client": {"broker": None, "broker_timeout": 300.0, "forward_output": True},
    # keys: the cluster's keys directory (after --keys and $ZRES_KEYS: see core.keys);
    # insecure: no keys at all (a broker then listens on loopback only, unless --insecure).
    "security": {"keys": None, "insecure": False},
}
_TYPES = {"heartbeat_interval": float, "heartbeat_timeout": float, "broker_timeout": float,
          "client_timeout": float, "client_grace": float, "starvation_after": float,
          "job_grace": float, "fairshare_half_life": float, "job_log_retention": float,
          "drain_grace": float, "spin": float, "http_request_timeout": float,
          "nworkers": int, "nthreads": int, "prefetch": int, "forward_output": bool,
          "bind_cpus": bool, "insecure": bool,
          **{f"max_{name}": int for name in ("header_bytes", "payload_bytes", "name_bytes",
                                              "resources", "slots", "tasks", "deps",
                                              "object_bytes")}}
# Settings that are a name, a path or an address: a string with something in it.
_STRINGS = {"name", "state", "job_logs", "keys", "data_listen", "data_advertise",
            "relay_listen", "memory_limits"}
# prefetch=0: no pipelining; drain_grace=0: stop now; spin=0: sleep at once
_ZERO_OK = {"prefetch", "drain_grace", "spin"}
# (use that never decays would never forgive; a connection given for ever is never closed)
_FINITE = {"fairshare_half_life", "spin", "http_request_timeout"}
# (a spin is meant to bridge a wake-up's 100-200 us: one of seconds would spin on a core
# between heartbeats, and stretch the loop's waits)
_AT_MOST = {"spin": 0.1}


class _Parsed(dict[str, int]):
    """Resources already converted to units (so they are not converted twice)."""


class ConfigError(ZresError, ValueError):
    """A setting is malformed; the message names the setting and where it came from."""


def load(section: str, flags: Mapping[str, Any] | None = None,
         path: str | None = None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return SECTION's settings merged by precedence, with resources parsed to units."""
    env = os.environ if environ is None else environ
    settings = dict(DEFAULTS[section])
    layers: list[tuple[str, Mapping[str, Any]]] = [
        (_file_name(path, env) or "", _read_file(path, env).get(section, {})),
        ("environment", _from_env(section, env)),
        ("command line", {k: v for k, v in (flags or {}).items() if v is not None}),
    ]
    resources: Units | None = None
    for origin, layer in layers:
        for key, value in layer.items():
            if key == "resources":
                parsed = _resources(value, origin)
                resources = parsed if resources is None else {**resources, **parsed}
            elif key not in settings:
                raise ConfigError(f"{origin}: unknown setting {section}.{key}")
            else:
                settings[key] = _convert(key, value, origin)
    if section == "agent":
        settings["resources"] = resources or {}
    if section in ("broker", "agent") and \
            settings["heartbeat_timeout"] <= settings["heartbeat_interval"]:
        # (a peer would be lost between two of its own heartbeats)
        raise ConfigError(f"heartbeat_timeout ({settings['heartbeat_timeout']}) must be "
                          f"longer than heartbeat_interval ({settings['heartbeat_interval']})")
    if section == "broker":
        try:
            settings["listen"] = normalize(settings["listen"])
        except ValueError as exc:
            raise ConfigError(f"listen: {exc}") from None
        # The state directory: the flag, then $ZRES_STATE_DIR, then the file, then one per
        # user and port (None: a temporary one, for a broker on a port picked at random).
        settings["state"] = ((flags or {}).get("state") or env.get("ZRES_STATE_DIR")
                             or settings["state"]
                             or default_state_dir(settings["listen"], env))
    if section in ("agent", "client"):
        # The broker: the flag, then $ZRES_BROKER, then the file (or ZRES_<SECTION>__BROKER).
        given = (flags or {}).get("broker") or env.get("ZRES_BROKER") or settings["broker"]
        try:
            settings["broker"] = normalize(given) if given else None
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return settings


def insecure(settings: Mapping[str, Any]) -> bool:
    """Whether the [security] SETTINGS (or $ZRES_INSECURE, set by --insecure) say to use
    no keys at all."""
    return any(str(v).lower() in ("true", "1", "yes")
               for v in (settings.get("insecure"), os.environ.get("ZRES_INSECURE")))


def find_key(given: str | None, roles: tuple[str, ...], address: str,
             path: str | None = None, name: str | None = None) -> keys.PeerKey | None:
    """The key a peer (of one of ROLES, called NAME) uses to connect to ADDRESS: none if
    insecure, else as ``keys.find`` says, the config file (PATH) giving ``[security]
    keys``."""
    security = load("security", path=path)
    if insecure(security) and not given:
        return None
    return keys.find(given, roles, address, security["keys"], name)


def default_state_dir(listen: str, env: Mapping[str, str]) -> str | None:
    """Where a broker listening on LISTEN keeps its state unless told: under
    ``$XDG_STATE_HOME`` (else ``~/.local/state``) ``/zres/``, one directory per port (or
    ipc path). None for a port picked at random (0): nothing could find it again."""
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                     "state")
    scheme, _, rest = listen.partition("://")
    if scheme == "tcp":
        port = rest.rpartition(":")[2]
        if not port.isdigit() or int(port) == 0:
            return None
        name = f"broker-{port}"
    else:
        name = f"broker-{scheme}-" + "".join(c if c.isalnum() else "_" for c in rest)[-80:]
    return os.path.join(base, "zres", name)


def _file_name(path: str | None, env: Mapping[str, str]) -> str | None:
    if path:
        return path
    if env.get("ZRES_CONFIG"):
        return env["ZRES_CONFIG"]
    return "zres.toml" if Path("zres.toml").is_file() else None


def _read_file(path: str | None, env: Mapping[str, str]) -> dict[str, Any]:
    name = _file_name(path, env)
    if name is None:
        return {}
    try:
        with open(name, "rb") as fh:
            tables = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {name}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {name} is not valid TOML: {exc}") from None
    for section, table in tables.items():  # (a misspelt section would be ignored)
        if section not in DEFAULTS and section != "quotas":
            raise ConfigError(f"{name}: unknown section [{section}] (sections: "
                              f"{', '.join([*DEFAULTS, 'quotas'])})")
        if not isinstance(table, dict):
            raise ConfigError(f"{name}: {section} must be a section ([{section}]), got "
                              f"{table!r}")
    return tables


def _from_env(section: str, env: Mapping[str, str]) -> dict[str, Any]:
    prefix = f"ZRES_{section.upper()}__"
    out: dict[str, Any] = {}
    per_name: dict[str, str] = {}
    for key, value in env.items():
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix):]
        if rest.upper().startswith("RESOURCES__"):
            per_name[rest[len("RESOURCES__"):]] = value
        else:
            out[rest.lower()] = value
    if per_name:
        # One variable per name overrides the same name in ZRES_<SECTION>__RESOURCES.
        whole = _resources(out.get("resources", ""), "environment")
        out["resources"] = _Parsed(whole | _resources(per_name, "environment"))
    return out


def _resources(value: Any, origin: str) -> Units:
    try:
        if isinstance(value, str):
            return parse_spec(value)
        if isinstance(value, _Parsed):
            return dict(value)
        if isinstance(value, Mapping):
            return mapping_to_units(value)
    except ValueError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    raise ConfigError(f"{origin}: resources must be a string like 'GPU=2' or a table")


def _convert(key: str, value: Any, origin: str) -> Any:
    if key in _STRINGS and value is not None and not (isinstance(value, str)
                                                      and value.strip()):
        raise ConfigError(f"{origin}: {key} must be a non-empty string, got {value!r}")
    kind = _TYPES.get(key)
    if kind is None or value is None:
        return value
    if kind is bool:
        text = str(value).lower()
        if isinstance(value, bool) or text in ("true", "1", "yes", "false", "0", "no"):
            return value if isinstance(value, bool) else text in ("true", "1", "yes")
        raise ConfigError(f"{origin}: {key} must be true or false, got {value!r}")
    low = "non-negative" if key in _ZERO_OK else "positive"
    wrong = ConfigError(f"{origin}: {key} must be a {low} {kind.__name__}, got {value!r}")
    if isinstance(value, bool) or (kind is int and isinstance(value, float)):
        raise wrong  # TOML true is not 1, and 2.5 threads is not 2
    try:
        converted = kind(value)
    except (TypeError, ValueError):
        raise wrong from None
    if not (converted > 0 or key in _ZERO_OK and converted == 0) or (
            key in _FINITE and converted == float("inf")):
        raise wrong  # refuses NaN too; inf is allowed (starvation_after=inf: never)
    if converted > _AT_MOST.get(key, converted):
        raise ConfigError(f"{origin}: {key} must be at most {_AT_MOST[key]}, got {value!r}")
    return converted


def quotas(path: str | None = None, environ: Mapping[str, str] | None = None) -> Quotas:
    """Return the broker's quotas (``[quotas]``, see above): the file's, each owner's
    overridden by the environment's."""
    env = os.environ if environ is None else environ
    hold: dict[str, Any] = {}
    queued: dict[str, Any] = {}
    origin = _file_name(path, env) or ""
    table = _read_file(path, env).get("quotas", {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"{origin}: quotas must be a table of owner = \"RESOURCES\"")
    for name, value in table.items():
        if name == "queued":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{origin}: quotas.queued must be a table of owner = count")
            queued.update((owner, (origin, count)) for owner, count in value.items())
        else:
            hold[name] = (origin, value)
    for key, value in env.items():
        if key.startswith("ZRES_QUOTAS__QUEUED__"):
            queued[key[len("ZRES_QUOTAS__QUEUED__"):].lower()] = ("environment", value)
        elif key.startswith("ZRES_QUOTAS__"):
            hold[key[len("ZRES_QUOTAS__"):].lower()] = ("environment", value)
    out = Quotas()
    for owner, (where, value) in hold.items():
        if isinstance(value, Mapping) or isinstance(value, str):
            units = _resources(value, f"{where}: quotas.{owner}")
        else:
            raise ConfigError(f"{where}: quotas.{owner} must be resources like \"GPU=4\", "
                              f"got {value!r}")
        if owner == "default":
            out.default_hold = units
        else:
            out.hold[owner] = units
    for owner, (where, value) in queued.items():
        count = _count(value, f"{where}: quotas.queued.{owner}")
        if owner == "default":
            out.default_queued = count
        else:
            out.queued[owner] = count
    return out


def _count(value: Any, what: str) -> int:
    """VALUE as a count of tasks (0 or more), from the file or the environment."""
    if isinstance(value, str) and value.strip().replace("_", "").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{what} must be a whole number of tasks (0 or more), got {value!r}")
    return value
