"""How clients, clusters, futures and actor handles show in Jupyter (``_repr_html_``).

What the cards say is what ``zres status`` and the dashboard say: the same state words
(``core.report.STATES``), amounts written by the one formatter (``core.resources``), and
why a task waits as ``client.why`` says it.
"""

from __future__ import annotations

from html import escape
from typing import Any

from ..core.report import MEANINGS, STATES, format_user_amount

_BAR = ('<span style="display:inline-block;width:8em;height:0.8em;background:#e4e7eb;'
        'vertical-align:middle"><span style="display:block;height:100%;width:{used:.0f}%;'
        'background:#2f80ed"></span></span>')


def cluster(title: str, address: str, status: dict[str, Any] | None,
            error: str | None = None) -> str:
    """A client's or cluster's card: its broker, dashboard link, agents (a bar of what is
    in use per resource), task counts by state."""
    rows = [f"<b>{escape(title)}</b> <code>{escape(address)}</code>"]
    if status is None:
        rows.append(f"<div>the broker does not answer: {escape(error or '')}</div>")
        return _card(rows)
    url = status.get("dashboard")
    link = f' · <a href="{escape(url)}" target="_blank">dashboard</a>' if url else ""
    rows.append(f"<div>cluster {escape(str(status.get('cluster', '')))} · "
                f"{len(status.get('agents', []))} agents · {status.get('clients', 0)} "
                f"clients{link}</div>")
    counts = status.get("counts", {})
    rows.append("<div>tasks: " + ", ".join(
        f'<span title="{escape(MEANINGS[s])}">{counts.get(s, 0)} {s}</span>' for s in STATES)
        + "</div>")
    agents = [_agent_rows(agent) for agent in status.get("agents", [])]
    if agents:
        rows.append('<table><tr><th style="text-align:left">agent</th>'
                    '<th style="text-align:left">resource</th>'
                    '<th style="text-align:left">in use</th>'
                    '<th style="text-align:left">free / total</th></tr>' + "".join(agents)
                    + "</table>")
    return _card(rows)


def _agent_rows(agent: dict[str, Any]) -> str:
    """One row per resource an agent offers: a bar of what is in use, free / total."""
    free: dict[str, float] = {}
    total: dict[str, float] = {}
    gpus: list[str] = []
    for slot in agent.get("slots", []):
        for name, amount in slot.get("total", {}).items():
            total[name] = total.get(name, 0) + amount
            free[name] = free.get(name, 0) + slot.get("free", {}).get(name, 0)
        gpus += [str(g) for g in slot.get("gpus", [])]
    state = " (draining)" if agent.get("draining") else " (away)" if agent.get("away") else ""
    label = escape(str(agent.get("name", ""))) + state
    if gpus:
        label += f"<br><small>GPUs {escape(', '.join(gpus))}</small>"
    rows = []
    for index, name in enumerate(sorted(total)):
        used = 100 * (total[name] - free[name]) / total[name] if total[name] > 0 else 0.0
        first = f'<td rowspan="{len(total)}">{label}</td>' if index == 0 else ""
        rows.append(f"<tr>{first}<td>{escape(name)}</td>"
                    f"<td>{_BAR.format(used=min(100, max(0, used)))}</td>"
                    f"<td>{escape(format_user_amount(name, free[name]))} / "
                    f"{escape(format_user_amount(name, total[name]))}</td></tr>")
    return "".join(rows) or f"<tr><td>{label}</td><td></td><td></td><td></td></tr>"


def future(name: str, task_id: int | None, state: str, agent: str | None,
           detail: str | None, why: str | None = None) -> str:
    """A future's card: its task, id, state, where it ran, and why it waits if it does."""
    where = f" on {escape(agent)}" if agent else ""
    shown = f"id {task_id}" if task_id is not None else "not taken by the broker yet"
    rows = [f"<b>zres.Future</b> {escape(name)} ({shown}): "
            f'<b title="{escape(MEANINGS.get(state, state))}">{escape(state)}</b>{where}']
    if detail:
        rows.append(f"<div>infeasible: {escape(detail)}</div>")
    if why:
        rows.append(f"<div>{escape(why)}</div>")
    return _card(rows)


def actor(cls: str, actor_id: str, name: str, methods: list[str],
          status: dict[str, Any] | None = None, error: str | None = None) -> str:
    """An actor handle's card: its class, name, id, state, agent, what it holds, its
    calls, and its methods (the public ones)."""
    named = f" {escape(repr(name))}" if name else ""
    rows = [f"<b>zres.ActorHandle</b> {escape(cls)}{named} (id {escape(actor_id[:8])})"]
    if status is not None:
        where = f" on {escape(status['agent'])}" if status.get("agent") else ""
        why = f": {escape(status['reason'])}" if status.get("reason") else ""
        rows.append(f"<div><b>{escape(status.get('state', '?'))}</b>{where}{why}</div>")
        rows.append(f"<div>holds {escape(status.get('request', 'nothing'))} · calls: "
                    f"{status.get('running', 0)} sent, {status.get('queued', 0)} queued · "
                    f"restarts left: {status.get('restarts_left', 0)}</div>")
    elif error:
        rows.append(f"<div>{escape(error)}</div>")
    public = [m for m in methods if not m.startswith("_")]
    rows.append(f"<div>methods: {escape(', '.join(public) or '(none)')}</div>")
    return _card(rows)


def _card(rows: list[str]) -> str:
    return ('<div style="font-family: sans-serif; font-size: 90%">' + "".join(rows)
            + "</div>")
