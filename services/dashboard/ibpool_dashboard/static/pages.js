// The pages: each loads its model from the dashboard's JSON API, draws it, and says which bus events
// (or overview ticks) make it load again. Elements carry data-* attributes naming what they show.
import { h, s, table, pill, ago, time, lineChart, stackedBar } from "./dom.js";
import { getJson, act, operatorToken } from "./app.js";

const STATE_COLOURS = { busy: "#2f6fdf", shared: "#8fb3f0", idle: "#d5dbe3" };
const LINK_COLOURS = { up: "#9fb8a8", degraded: "#e39b25", flapping: "#9a46c8", down: "#d64545" };
const jobLink = (id) => h("a", { href: `#/job/${encodeURIComponent(id)}`, "data-job-link": id }, id);
const domain = (row) => (row.subject || "").split(".")[1];

const overview = {
  load: () => getJson("/api/overview"),
  draw(m) {
    const xs = m.history.map((p) => p[0]);
    const card = (k, v, attrs = {}) => h("div", { class: "card", ...attrs }, h("div", { class: "v" }, v), h("div", { class: "k" }, k));
    const parts = Object.entries(m.gpus_by_state).map(([name, value]) => ({ name, value, color: STATE_COLOURS[name] || "#d64545" }));
    return h("section", { "data-view": "overview" },
      h("h2", {}, `Cluster ${m.fabric ? `(${m.fabric})` : ""}`),
      h("div", { class: "cards" },
        card("GPUs", m.gpus, { "data-gpus": m.gpus }),
        card("allocated", `${m.allocated_pct}%`),
        card("GPU utilisation", m.mean_utilization_pct === null ? "-" : `${m.mean_utilization_pct}%`),
        card("queued jobs", m.queued, { "data-queued": m.queued }),
        card("running jobs", m.running, { "data-running": m.running }),
        card("nodes", Object.entries(m.nodes_by_health).map(([k, v]) => `${v} ${k}`).join(", ") || "-"),
        card("links with problems", m.links_with_problems)),
      h("h3", {}, "GPUs by state"),
      stackedBar(parts),
      h("div", { class: "legend" }, parts.map((p) => h("span", {}, h("i", { style: `background:${p.color}` }), `${p.name} ${p.value}`))),
      h("h3", {}, "Allocated GPU share (%) over time"),
      lineChart(xs, [{ name: "allocated %", color: "#2f6fdf", values: m.history.map((p) => p[1]) }], { ymax: 100 }),
      h("h3", {}, "Queue depth over time"),
      lineChart(xs, [
        { name: "queued", color: "#e39b25", values: m.history.map((p) => p[2]) },
        { name: "running", color: "#2e9d5b", values: m.history.map((p) => p[3]) },
      ]),
      h("div", { class: "legend" }, h("span", {}, h("i", { style: "background:#e39b25" }), "queued"), h("span", {}, h("i", { style: "background:#2e9d5b" }), "running")),
      h("h3", {}, "Jobs by state"),
      table(["state", "jobs"], Object.entries(m.jobs_by_state).map(([k, v]) => h("tr", {}, h("td", {}, pill(k)), h("td", { class: "num" }, v)))));
  },
  onEvent: (row) => ["job", "pool", "health"].includes(domain(row)),
  onTick: () => true,
};

function fabricSvg(m) {
  const rows = [];
  for (let t = m.tiers; t >= 1; t--) rows.push(m.switches.filter((sw) => sw.tier === t).map((sw) => ({ id: sw.guid, label: sw.name, sharp: sw.sharp })));
  const orphans = m.switches.filter((sw) => sw.tier === 0);
  if (orphans.length) rows.unshift(orphans.map((sw) => ({ id: sw.guid, label: sw.name })));
  rows.push(m.hosts.map((name) => ({ id: name, label: name, host: true })));
  const widest = Math.max(1, ...rows.map((r) => r.length));
  const width = Math.max(900, widest * 76);
  const height = rows.length * 110 + 20;
  const pos = {};
  rows.forEach((r, i) => r.forEach((n, j) => { pos[n.id] = { x: ((j + 0.5) * width) / r.length, y: 40 + i * 110, n }; }));
  const lit = new Set([...m.highlighted_hosts, ...(m.highlighted_switches || [])]);
  const edges = m.edges.filter((e) => pos[e.a] && pos[e.b]).map((e) => s("line", {
    x1: pos[e.a].x, y1: pos[e.a].y, x2: pos[e.b].x, y2: pos[e.b].y,
    stroke: e.highlighted ? "#d6247a" : LINK_COLOURS[e.state] || "#999",
    "stroke-width": e.highlighted ? 3 : e.state === "up" ? 1 : 2.5,
    "data-link-state": e.state,
  }, s("title", {}, `${e.a} - ${e.b}: ${e.cables} cable(s), ${e.state}${e.problems.length ? ` (${e.problems.join(", ")})` : ""}`)));
  const nodes = Object.values(pos).map(({ x, y, n }) => s("g", { "data-fabric-node": n.id, "data-lit": lit.has(n.id) ? "yes" : null },
    n.host
      ? s("rect", { x: x - 30, y: y - 12, width: 60, height: 24, rx: 4, fill: lit.has(n.id) ? "#d6247a" : "#1d232b" })
      : s("circle", { cx: x, cy: y, r: 10, fill: lit.has(n.id) ? "#f2a3c9" : n.sharp ? "#2f6fdf" : "#6b7480" }),
    s("text", { x, y: n.host ? y + 4 : y + 24, "text-anchor": "middle", fill: n.host ? "#fff" : "#1d232b" }, n.label),
    s("title", {}, n.sharp ? `${n.label} (SHARP)` : n.label)));
  return s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "chart" }, edges, nodes);
}

const fabric = {
  load: (r) => getJson(`/api/fabric${r.query.get("job") ? `?job=${encodeURIComponent(r.query.get("job"))}` : ""}`),
  draw(m, r) {
    const input = h("input", { placeholder: "job id", value: r.query.get("job") || "" });
    const problems = m.edges.filter((e) => e.state !== "up");
    return h("section", { "data-view": "fabric" },
      h("h2", {}, `Fabric ${m.name} — ${m.tiers} switch tier(s), ${m.hosts.length} hosts`),
      h("p", {}, h("form", { onsubmit: (ev) => { ev.preventDefault(); location.hash = input.value ? `#/fabric?job=${encodeURIComponent(input.value)}` : "#/fabric"; } },
        "highlight a job's placement: ", input, " ", h("button", {}, "show"),
        m.job ? h("span", { "data-highlighted-job": m.job }, ` — ${m.job} on ${m.highlighted_hosts.join(", ") || "no hosts (not placed)"}`) : null)),
      h("div", { class: "legend" }, Object.entries(LINK_COLOURS).map(([k, c]) => h("span", {}, h("i", { style: `background:${c}` }), k)),
        h("span", {}, h("i", { style: "background:#d6247a" }), "the job's placement"), h("span", {}, h("i", { style: "background:#2f6fdf" }), "SHARP switch")),
      fabricSvg(m),
      h("h3", {}, `Links with problems (${problems.length})`),
      problems.length ? table(["between", "and", "cables", "state", "problems"], problems.map((e) =>
        h("tr", {}, h("td", {}, e.a), h("td", {}, e.b), h("td", { class: "num" }, e.cables), h("td", {}, pill(e.state)), h("td", {}, e.problems.join(", "))))) : h("p", { class: "muted" }, "every link is up"));
  },
  onEvent: (row, r) => domain(row) === "fabric" || (r.query.get("job") && row.key === r.query.get("job")),
};

const gpus = {
  load: () => getJson("/api/gpus"),
  draw(m) {
    return h("section", { "data-view": "gpus" },
      h("h2", {}, `GPUs (${m.nodes.reduce((a, n) => a + n.gpus.length, 0)})`),
      h("div", { class: "legend" }, Object.entries(STATE_COLOURS).map(([k, c]) => h("span", {}, h("i", { style: `background:${c}` }), k)), " slices: whole, fraction, MIG; bar: utilisation"),
      h("div", { class: "grid" }, m.nodes.map((n) => h("div", { class: "gpurow", "data-node": n.node_id },
        h("div", { class: "name" }, h("strong", {}, n.node_id), h("br"), pill(n.health), " ", n.state !== "ready" ? pill(n.state) : null),
        h("div", { class: "gpus" }, n.gpus.map((g) => h("div", {
          class: `gpu ${g.state}`, "data-gpu": `${n.node_id}/${g.index}`,
          title: `${g.model} #${g.index}: ${g.state}, ${g.granted_milli / 1000} GPU granted`,
        },
        h("div", {}, `#${g.index} `, g.temperature_c === null ? "" : `${Math.round(g.temperature_c)}°C `, g.utilization_pct === null ? "" : `${Math.round(g.utilization_pct)}%`),
        g.slices.map((sl) => h("div", { class: `slice ${sl.mig ? "mig" : sl.milli < 1000 ? "part" : ""}`, "data-slice-job": sl.job, title: `${sl.job}: ${sl.mig || `${sl.milli / 1000} GPU`}` },
          `${sl.job} ${sl.mig || (sl.milli < 1000 ? sl.milli / 1000 : "")}`)),
        h("div", { class: "fill", style: `width:${g.utilization_pct || 0}%` }))))))));
  },
  onEvent: (row) => domain(row) === "pool" || domain(row) === "health",
  onTick: () => true,
};

const jobRow = (j, live) => h("tr", { "data-job": j.job_id },
  h("td", {}, jobLink(j.job_id)), h("td", {}, j.tenant), h("td", {}, j.queue), h("td", {}, pill(j.state)),
  h("td", { class: "num" }, j.priority), h("td", {}, j.shape), h("td", { class: "num" }, ago(j.waited_s)),
  live ? null : h("td", {}, j.wait_code ? h("code", {}, j.wait_code) : null, " ", j.reason));

const queue = {
  load: () => getJson("/api/queue"),
  draw(m) {
    return h("section", { "data-view": "queue" },
      h("h2", {}, `Queue — ${m.jobs.length} waiting, ${m.running.length} running`),
      table(["queue", "policy", "backfill", "queued", "running", "GPUs waiting", "GPUs running", "oldest wait"], m.queues.map((q) => h("tr", {},
        h("td", {}, q.queue), h("td", {}, q.policy), h("td", {}, q.backfill), h("td", { class: "num" }, q.queued), h("td", { class: "num" }, q.running),
        h("td", { class: "num" }, q.waiting_gpus), h("td", { class: "num" }, q.running_gpus), h("td", { class: "num" }, ago(q.oldest_wait_s))))),
      h("h3", {}, "Waiting, in the order the scheduler weighs them"),
      table(["job", "tenant", "queue", "state", "priority", "GPUs", "waited", "why it waits"], m.jobs.map((j) => jobRow(j, false))),
      h("h3", {}, "Running"),
      table(["job", "tenant", "queue", "state", "priority", "GPUs", "since submit"], m.running.map((j) => jobRow(j, true))));
  },
  onEvent: (row) => domain(row) === "job",
};

const job = {
  load: (r) => getJson(`/api/jobs/${encodeURIComponent(r.arg)}`),
  draw(m) {
    const j = m.job;
    const kv = (k, v) => (v === null || v === undefined || v === "" ? null : h("tr", {}, h("td", {}, k), h("td", {}, v)));
    const cancel = operatorToken() && !["completed", "failed", "cancelled"].includes(j.state)
      ? h("button", { "data-action": "cancel", onclick: () => act(`/api/actions/jobs/${encodeURIComponent(j.job_id)}/cancel`) }, "cancel job") : null;
    return h("section", { "data-view": "job", "data-job": j.job_id, "data-state": j.state },
      h("h2", {}, `Job ${j.job_id} `, pill(j.state), " ", cancel),
      h("table", { class: "kv" },
        kv("name", j.name), kv("tenant / queue", `${j.tenant} / ${j.queue}`), kv("GPUs", m.shape), kv("priority", j.priority),
        kv("submitted", j.submitted_at), kv("scheduled", j.scheduled_at), kv("started", j.started_at), kv("finished", j.finished_at),
        kv("why it waits", j.reason), kv("attempt", j.attempt), kv("allocation", j.allocation_id),
        kv("trace id", m.trace_id ? h("code", { "data-trace": m.trace_id }, m.trace_id) : "-")),
      h("h3", {}, "Placement"),
      h("table", { class: "kv" },
        kv("ranks (in order)", m.ranks.length ? m.ranks.join(", ") : "not placed"),
        kv("SHARP", m.sharp === null || m.sharp === undefined ? "-" : `${m.sharp ? "yes" : "no"}${m.sharp_reason ? ` — ${m.sharp_reason}` : ""}`),
        kv("fabric tier spanned", m.tier), kv("on the fabric", m.ranks.length ? h("a", { href: `#/fabric?job=${encodeURIComponent(j.job_id)}` }, "show the placement") : null)),
      m.assignments.length ? h("table", { class: "kv" }, h("tr", {}, ["GPUs assigned", "GPU", "share", "MIG"].map((c) => h("th", {}, c))),
        m.assignments.map((a) => h("tr", {}, h("td", {}, a.node_id), h("td", {}, `#${a.gpu_index}`), h("td", {}, a.milli / 1000), h("td", {}, a.mig_profile || "-")))) : null,
      h("h3", {}, `Events (${m.events.length})`),
      h("ul", { class: "events" }, m.events.map(eventItem)));
  },
  onEvent: (row, r) => row.key === r.arg || (row.fields && row.fields.job_id === r.arg),
};

const nodeActions = (n) => operatorToken()
  ? ["cordon", "uncordon", "drain", "recover"].map((v) => h("button", { "data-action": v, onclick: () => act(`/api/actions/nodes/${encodeURIComponent(n.node_id)}/${v}`) }, v))
  : null;

const nodes = {
  load: () => getJson("/api/nodes"),
  draw(m) {
    return h("section", { "data-view": "nodes" },
      h("h2", {}, `Nodes (${m.nodes.length})`),
      table(["node", "pool", "health", "cordon / drain", "GPUs free/all", "jobs", "last heartbeat", "health history", operatorToken() ? "actions" : null].filter(Boolean),
        m.nodes.map((n) => h("tr", { "data-node": n.node_id, "data-health": n.health, "data-drained": n.drained || null },
          h("td", {}, h("strong", {}, n.node_id)), h("td", {}, pill(n.pool_state)), h("td", {}, pill(n.health), n.reason ? ` ${n.reason}` : ""),
          h("td", {}, n.cordoned ? pill("cordoned") : "", n.drained ? ` drained: ${n.drained}` : ""),
          h("td", { class: "num" }, `${n.free_gpus}/${n.gpus}`),
          h("td", {}, n.jobs.map((j, i) => [i ? ", " : "", jobLink(j)])),
          h("td", {}, time(n.last_beat)),
          h("td", {}, n.history.length ? h("details", {}, h("summary", {}, `${n.history[0].type} ${time(n.history[0].at)} (${n.history.length})`),
            h("ul", { class: "events" }, n.history.map((v) => h("li", {}, h("span", { class: "t" }, time(v.at)), h("span", { class: "ty" }, v.type), v.reason)))) : h("span", { class: "muted" }, "none")),
          operatorToken() ? h("td", {}, nodeActions(n)) : null))));
  },
  onEvent: (row) => ["health", "pool"].includes(domain(row)) || row.type === "NodeRegistered",
};

function eventItem(e) {
  const fields = JSON.stringify(e.fields);
  return h("li", { "data-event-type": e.type, "data-event-key": e.key },
    h("span", { class: "t" }, time(e.at)), h("span", { class: "ty" }, e.type), h("span", { class: "k" }, e.key, " "),
    h("span", { class: "muted" }, fields.length > 200 ? `${fields.slice(0, 200)}…` : fields));
}

const events = {
  load: () => getJson("/api/events?limit=300"),
  draw(m) {
    const filter = h("input", { placeholder: "filter by type or key", oninput: () => applyFilter(filter.value) });
    return h("section", { "data-view": "events" },
      h("h2", {}, "Event stream ", m.following ? "" : h("span", { class: "muted" }, "(not following the bus)")),
      h("p", {}, filter),
      h("ul", { class: "events", id: "event-list" }, m.events.slice().reverse().map(eventItem)));
  },
  onEvent(row) {
    const list = document.getElementById("event-list");
    if (list) {
      list.prepend(eventItem(row));
      while (list.children.length > 500) list.lastChild.remove();
    }
    return false;
  },
};

function applyFilter(text) {
  for (const li of document.querySelectorAll("#event-list li")) li.hidden = Boolean(text) && !li.textContent.toLowerCase().includes(text.toLowerCase());
}

export const pages = { overview, fabric, gpus, queue, job, nodes, events };
