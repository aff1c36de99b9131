"""How clients, clusters, futures and actor handles show in Jupyter (``_repr_html_``)."""

from __future__ import annotations

from html import escape
from typing import Any

from ..core.report import STATES, format_user_amount


def cluster(title: str, address: str, status: dict[str, Any] | None,
            error: str | None = None) -> str:
    """A client's or cluster's card: its broker, dashboard link, agents, task counts."""
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
    rows.append("<div>tasks: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATES)
                + "</div>")
    agents = [_agent_row(agent) for agent in status.get("agents", [])]
    if agents:
        rows.append('<table><tr><th style="text-align:left">agent</th>'
                    '<th style="text-align:left">free / total</th>'
                    '<th style="text-align:left">GPUs</th></tr>' + "".join(agents)
                    + "</table>")
    return _card(rows)


def _agent_row(agent: dict[str, Any]) -> str:
    free: dict[str, float] = {}
    total: dict[str, float] = {}
    gpus: list[str] = []
    for slot in agent.get("slots", []):
        for name, amount in slot.get("total", {}).items():
            total[name] = total.get(name, 0) + amount
            free[name] = free.get(name, 0) + slot.get("free", {}).get(name, 0)
        gpus += [str(g) for g in slot.get("gpus", [])]
    amounts = ", ".join(escape(f"{n} {format_user_amount(n, free[n])} / "
                               f"{format_user_amount(n, total[n])}") for n in sorted(total))
    state = " (draining)" if agent.get("draining") else " (away)" if agent.get("away") else ""
    return (f"<tr><td>{escape(str(agent.get('name', '')))}{state}</td><td>{amounts}</td>"
            f"<td>{escape(', '.join(gpus))}</td></tr>")


def future(name: str, task_id: int, state: str, agent: str | None,
           detail: str | None) -> str:
    """A future's line: its task, state, where it ran, and why it cannot run if so."""
    where = f" on {escape(agent)}" if agent else ""
    more = f"<div>{escape(detail)}</div>" if detail else ""
    return _card([f"<b>zres.Future</b> {escape(name)} (id {task_id}): "
                  f"<b>{escape(state)}</b>{where}", more])


def actor(cls: str, actor_id: str, name: str, methods: list[str]) -> str:
    """An actor handle's line: its class, name, id and methods."""
    named = f" {escape(repr(name))}" if name else ""
    return _card([f"<b>zres.ActorHandle</b> {escape(cls)}{named} (id {escape(actor_id[:8])})",
                  f"<div>methods: {escape(', '.join(methods))}</div>"])


def _card(rows: list[str]) -> str:
    return ('<div style="font-family: sans-serif; font-size: 90%">' + "".join(rows)
            + "</div>")
