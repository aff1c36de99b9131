"""How ``zres status`` reads for people: every line within WIDTH columns, long lists cut,
the task states in the words every view uses, amounts written by the one formatter."""

from __future__ import annotations

import textwrap
import time
from typing import Any

from ..core.report import STATES, format_user_amount
from ..core.resources import format_bytes


def _state_line(state: dict[str, Any]) -> str:
    """Where the broker keeps its state, how big it is, and when it last wrote it."""
    shown = format_bytes(state.get("bytes", 0))
    last = state.get("last_commit")
    when = f"last written {time.time() - last:.0f}s ago" if last else "nothing written yet"
    line = f"state: {state.get('dir')}  {shown}  {when}"
    if state.get("error"):
        line += f"  CANNOT WRITE: {state['error']} (new jobs are refused)"
    return line


WIDTH = 100   # every line of zres status fits in this many columns
SHOWN = 20    # entries shown per list before "... and N more"


def _request(units: dict[str, float]) -> str:
    return " ".join(f"{n}={format_user_amount(n, v)}"
                    for n, v in sorted(units.items())) or "nothing"


def _wrap(text: str, indent: str = "  ") -> list[str]:
    """TEXT as lines of at most WIDTH columns, the later ones indented further: broken
    between its fields (two spaces apart) where it can, inside one only if it must."""
    more = indent + "    "
    lines: list[str] = []
    line = indent
    for field in text.split("  "):
        if line.strip():
            if len(f"{line}  {field}") <= WIDTH:
                line = f"{line}  {field}"
                continue
            lines.append(line)
            line = more
        parts = textwrap.wrap(field, WIDTH, initial_indent=line, subsequent_indent=more)
        lines += parts[:-1]
        line = parts[-1] if parts else line
    return lines + [line]


def _cut(lines: list[list[str]], total: int, what: str = "") -> list[str]:
    """The first SHOWN entries (each a list of lines), then how many more of TOTAL."""
    out = [line for entry in lines[:SHOWN] for line in entry]
    if total > min(len(lines), SHOWN):
        out.append(f"  ... and {total - min(len(lines), SHOWN)} more{what}")
    return out


def render_status(status: dict[str, Any]) -> str:
    """Format a status report (amounts in user units: ``in_user_units``) for people, every
    line within WIDTH columns."""
    lines = _wrap(f"broker {status['address']}  cluster: {status.get('cluster', '?')}  "
                  f"clients: {status['clients']}", "")
    state = status.get("state")
    if isinstance(state, dict):
        lines += _wrap(_state_line(state), "")
    lines += ["", "agents:"]
    if not status["agents"]:
        lines.append("  (none)")
    agents = []
    for agent in status["agents"]:
        for index, slot in enumerate(agent["slots"]):
            label = agent["name"] if len(agent["slots"]) == 1 else f"{agent['name']}[{index}]"
            amounts = "  ".join(
                f"{n}={format_user_amount(n, slot['free'].get(n, 0))}/"
                f"{format_user_amount(n, t)}"
                for n, t in sorted(slot["total"].items()))
            gpus = f"  gpus={','.join(slot['gpus'])}" if slot["gpus"] else ""
            store = agent.get("store") or {}
            objects = store.get("objects")
            held = (f"  holds {objects} result{'s' if objects != 1 else ''}: "
                    f"{_bytes(store['memory'])} in "
                    f"memory, {_bytes(store['spilled'])} on disk"
                    if store.get("objects") and index == 0 else "")
            agents.append(_wrap(f"{label:<20} running={slot['running']:<4} free/total: "
                                f"{amounts}{gpus}{held}"
                                f"{_memory(agent.get('memory')) if index == 0 else ''}"))
    lines += _cut(agents, len(agents), " agents")
    lines += _relayed(status.get("relay"))
    counts = status["counts"]
    ordered = [*STATES, *sorted(set(counts) - set(STATES))]
    lines += ["", *_wrap("tasks: " + (", ".join(f"{k}={counts[k]}" for k in ordered
                                                if counts.get(k)) or "none"), "")]
    lines += _owners(status.get("owners", []))
    if status.get("actors"):
        lines += ["", "actors:"]
        actors = []
        for actor in status["actors"]:
            label = f"{actor['cls']}({actor['name'] or actor['id'][:8]})"
            where = f" on {actor['agent']}" if actor["agent"] else ""
            why = f": {actor['reason']}" if actor.get("reason") else ""
            holds = _request(actor["units"])
            memory = f"  memory {actor['memory_shown']}" if actor.get("memory_shown") else ""
            actors.append(_wrap(f"{label:<24} {actor['state']}{where}  holds {holds}{memory}"
                                f"  calls: {actor['running']} sent, {actor['queued']} queued"
                                f"  restarts left: {actor['restarts_left']}{why}"))
        lines += _cut(actors, len(actors), " actors")
    lines += _placement_groups(status.get("placement_groups", []))
    groups = status.get("groups", [])
    if groups:
        lines += ["", "waiting and queued:"]
        shown = []
        for group in groups:
            names = ", ".join(group["names"]) + (", ..." if group["count"] > 3 else "")
            shown.append(_wrap(f"{group['count']} x {group['request']} ({names}): "
                               f"{group['reason']}"))
        rest = sum(g["count"] for g in groups[SHOWN:])
        lines += _cut(shown, len(groups), f" groups ({rest} tasks)")
    running = status.get("running", [])
    if running:
        lines += ["", "running:"]
        lines += _cut([_wrap(f"{t['name']} (id {t['id']}) on {t['agent']}  "
                             f"{_request(t['units'])}  for {t['seconds']:.0f}s"
                             + (f"  memory {t['memory_shown']}" if t.get("memory_shown")
                                else "") + _running_notes(t))
                       for t in running], max(counts.get("running", 0), len(running)))
    return "\n".join(lines)


def _placement_groups(groups: list[dict[str, Any]]) -> list[str]:
    """Each placement group: its state, strategy, and each bundle and where it is."""
    if not groups:
        return []
    shown = []
    for group in groups:
        label = f"{group['name'] or group['id'][:8]}"
        bundles = "  ".join(f"[{i}] {_request(b['units'])}" + (f" on {b['agent']}"
                                                                if b["agent"] else "")
                            for i, b in enumerate(group["bundles"]))
        owner = f"  owner {group['owner']}" if group.get("owner") else ""
        why = f"  {group['reason']}" if group.get("reason") else ""
        shown.append(_wrap(f"{label:<20} {group['state']} {group['strategy']}{owner}  "
                           f"restarts left: {group['restarts_left']}  {bundles}{why}"))
    return ["", "placement groups:", *_cut(shown, len(shown), " placement groups")]


def _running_notes(task: dict[str, Any]) -> str:
    """Whose a running task is, and whether its client is gone (detached, or being
    stopped): what lets its owner find it and cancel it (zres cancel --task ID)."""
    notes = f"  owner {task['owner']}" if task.get("owner") else ""
    if task.get("client_gone"):
        notes += "  client gone"
    flags = [word for word in ("detached", "stopping") if task.get(word)]
    return notes + (f" ({', '.join(flags)})" if flags else "")


def _owners(owners: list[dict[str, Any]]) -> list[str]:
    """Each owner's holdings, share of recent use and quotas, in the order a pass serves
    them: shown when there are several owners or a quota (one user sees no change)."""
    if len(owners) < 2 and not any(o["quota"] or o["queued_quota"] is not None
                                   for o in owners):
        return []
    shown = []
    for owner in owners:
        quota = f"  quota {_request(owner['quota'])}" if owner["quota"] else ""
        if owner["queued_quota"] is not None:
            quota += f"  may queue {owner['queued_quota']:,}"
        shown.append(_wrap(f"{owner['owner'] or '(default key)':<20} holds "
                           f"{_request(owner['holds'])} ({owner['grants']} "
                           f"grant{'' if owner['grants'] == 1 else 's'})  "
                           f"recent use {owner['share']:.0%}  waiting {owner['waiting']:,}"
                           f"{quota}"))
    return ["", "owners (fair share: served in this order, least recent use first):",
            *_cut(shown, len(shown), " owners")]


def _relayed(relay: Any) -> list[str]:
    """What the broker's relay moved for those that could not reach an agent (nothing
    said when it moved nothing)."""
    if not isinstance(relay, dict) or not relay.get("transfers") and not relay.get("bytes"):
        return []
    shown = [_wrap(f"{c['client'] or '?'}{' (' + c['owner'] + ')' if c['owner'] else ''}: "
                   f"{_transfers(c['transfers'])}, {_bytes(c['bytes'])}")
             for c in relay.get("clients", [])]
    return ["", *_wrap(f"relayed through the broker (for peers that could not reach an "
                       f"agent): {_transfers(relay['transfers'])}, {_bytes(relay['bytes'])}"
                       f"  relay: {relay['address']}", ""),
            *_cut(shown, len(shown), " peers")]


def _transfers(count: int) -> str:
    return f"{count} transfer{'' if count == 1 else 's'}"


def _memory(memory: dict[str, Any] | None) -> str:
    """How an agent limits memory, and whether its node is low (taking no work)."""
    if not memory or "limits" not in memory:
        return ""
    low = (f"  NODE LOW ON MEMORY: {_bytes(memory.get('available', 0))} available, reserve "
           f"{_bytes(memory.get('reserve', 0))} (taking no work)" if memory.get("low") else "")
    return f"  memory limits: {memory['limits']}{low}"


def _bytes(count: int) -> str:
    """COUNT bytes as people read them (binary units, as memory is everywhere)."""
    return format_user_amount("MEMORY", count)
