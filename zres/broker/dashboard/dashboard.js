// The zres dashboard: polls /api/status (read only) and redraws. Everything from the
// cluster goes into the page as text (textContent), never as HTML: task names are user data.
"use strict";

const PERIOD_MS = 1000;
const HISTORY = 120;  // points of the tasks-over-time chart (two minutes at one a second)
// A task's states, in the words of every view (zres.core.report.STATES).
const STATES = ["waiting", "queued", "running", "finished", "error", "cancelled"];
const MEANINGS = {waiting: "waiting for dependencies", queued: "queued for resources",
                  running: "running", finished: "finished with a result",
                  error: "ended in an error", cancelled: "cancelled"};
const CHARTED = ["waiting", "queued", "running"];  // the others only grow: counted
const COLOURS = {waiting: "#9aa5b1", queued: "#e0a100", running: "#2f80ed",
                 finished: "#27ae60", error: "#d64545", cancelled: "#8e6c8a"};
const history = [];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    // Styles through the CSSOM: the page's Content-Security-Policy refuses inline ones.
    if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function seconds(s) {
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${Math.round(s % 60)}s`;
  return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
}

function fillTable(id, rows, empty) {
  const body = document.querySelector(`#${id} tbody`);
  const columns = document.querySelectorAll(`#${id} thead th`).length;
  body.replaceChildren(...(rows.length ? rows.map((cells) =>
    el("tr", {}, ...cells.map((c) => el("td", {}, c)))) :
    [el("tr", {}, el("td", {colspan: columns, class: "dim"}, empty))]));
}

function agentCard(agent) {
  const card = el("div", {class: "agent", "data-agent": agent.name});
  const flags = [agent.draining ? "draining" : "", agent.away ? "away" : ""].filter(Boolean);
  card.append(el("h3", {}, agent.name, el("span", {class: "dim"},
    ` ${agent.host} pid ${agent.pid}${flags.length ? " - " + flags.join(", ") : ""}`)));
  agent.slots.forEach((slot, index) => {
    if (agent.slots.length > 1) card.append(el("div", {class: "dim"}, `worker ${index}`));
    for (const name of Object.keys(slot.total).sort()) {
      const total = slot.total[name];
      const free = slot.free[name] ?? 0;
      const used = total > 0 ? Math.min(100, Math.max(0, (total - free) / total * 100)) : 0;
      // Amounts as the broker words them (one formatter for every view: 64 GiB).
      card.append(el("div", {class: "resource", "data-resource": name},
        el("span", {class: "name"}, name),
        el("span", {class: "bar"}, el("span", {class: "used", style: {width: `${used}%`}})),
        el("span", {class: "amount"},
           `${slot.shown.free[name]} / ${slot.shown.total[name]} free`)));
    }
    if (slot.gpus.length) card.append(el("div", {class: "gpus"}, `GPUs ${slot.gpus.join(", ")}`));
    card.append(el("div", {class: "dim"}, `${slot.running} running`));
  });
  return card;
}

function drawHistory() {
  const svg = document.getElementById("history");
  const top = Math.max(1, ...history.map((h) => Math.max(...CHARTED.map((s) => h[s] || 0))));
  const span = Math.max(history.length, HISTORY / 2) - 1;  // fills from the left at first
  const x = (i) => i * 600 / span;
  const y = (v) => 115 - v / top * 105;
  const lines = CHARTED.map((state) => {
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", history.map((h, i) => `${x(i)},${y(h[state] || 0)}`).join(" "));
    line.setAttribute("stroke", COLOURS[state]);
    line.setAttribute("fill", "none");
    line.setAttribute("stroke-width", "2");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    return line;
  });
  svg.replaceChildren(...lines);
  document.getElementById("legend").replaceChildren(...CHARTED.map((s) =>
    el("span", {class: "key"}, el("i", {style: {background: COLOURS[s]}}), s)),
    el("span", {class: "dim"}, `(most ${top}, over the last ${history.length}s)`));
}

function render(status) {
  document.getElementById("broker").textContent =
    `broker ${status.address} - cluster ${status.cluster} - ${status.clients} clients`;
  document.getElementById("updated").textContent =
    `updated ${new Date(status.time * 1000).toLocaleTimeString()}`;
  const agents = document.getElementById("agents");
  agents.replaceChildren(...(status.agents.length ? status.agents.map(agentCard) :
    [el("p", {class: "dim"}, "(none)")]));

  const counts = status.counts;
  document.getElementById("counts").replaceChildren(...STATES.map((s) =>
    el("span", {class: "count", "data-state": s, title: MEANINGS[s]},
       el("b", {}, counts[s] || 0), ` ${s}`)),
    el("span", {class: "count dim", id: "ended"}, "ended since the broker started: " +
      ["finished", "error", "cancelled"].map((s) => `${status.finished[s] || 0} ${s}`)
        .join(", ")));
  history.push(counts);
  if (history.length > HISTORY) history.shift();
  drawHistory();

  fillTable("waiting", status.groups.map((g) => [
    String(g.count), g.state, g.request, g.reason,
    g.names.join(", ") + (g.count > g.names.length ? ", ..." : "")]),
    "nothing waits or is queued");
  const more = (counts.running || 0) - status.running.length;
  fillTable("running", status.running.map((t) => [
    `${t.name} (id ${t.id})`, t.owner || "-", t.agent, t.request, seconds(t.seconds),
    t.memory_shown || "-",
    [t.client_gone ? "gone" : "connected", t.detached ? "detached" : "",
     t.stopping ? "stopping" : ""].filter(Boolean).join(", ")])
    .concat(more > 0 ? [[`... and ${more} more`, "", "", "", "", "", ""]] : []), "nothing runs");
  fillTable("jobs", status.jobs.map((j) => [
    String(j.id), j.name, j.owner || "-", j.reason ? `${j.state}: ${j.reason}` : j.state,
    j.agent || "-", j.request,
    el("code", {title: j.agent ? `kept on agent ${j.agent}` : "not started"},
       `zres logs ${j.id}`)]).concat(status.jobs_total > status.jobs.length ?
    [[`... and ${status.jobs_total - status.jobs.length} more (zres jobs --all)`]] : []),
    "no command jobs");
  fillTable("actors", status.actors.map((a) => [
    `${a.cls}(${a.name || a.id.slice(0, 8)})`, a.reason ? `${a.state}: ${a.reason}` : a.state,
    a.agent || "-", a.request, `${a.running} sent, ${a.queued} queued`]), "no actors");
  fillTable("placement-groups", (status.placement_groups || []).map((g) => [
    g.name || g.id.slice(0, 8), g.owner || "-", g.reason ? `${g.state}: ${g.reason}` : g.state,
    g.strategy, g.bundles.map((b, i) => `[${i}] ${b.request} on ${b.agent || "-"}`)
      .join(", ")]), "no placement groups");
  document.body.dataset.ready = "1";
}

async function poll() {
  try {
    const reply = await fetch("/api/status", {cache: "no-store"});
    if (!reply.ok) throw new Error(`${reply.status} ${await reply.text()}`);
    render(await reply.json());
    document.body.classList.remove("offline");
  } catch (error) {
    document.body.classList.add("offline");
    document.getElementById("updated").textContent = `broker not answering (${error.message})`;
  }
  setTimeout(poll, PERIOD_MS);
}

poll();
