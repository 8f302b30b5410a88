// The hermeneut dashboard: fleet, node, GPU, job, topology, alerts, right-sizing and reliability views over the
// project's HTTP API.
// Live state comes as server-sent events; history through the query layer. No secret is ever sent to this page.
import { lineChart, fmt } from "./charts.js";
import { drawTopology } from "./topology.js";

const state = { gpus: new Map(), version: 0, health: null, filters: { cluster: "", application: "", model: "", job: "" } };
// for benchmarks and tests: when the page was usable, how late the last updates were drawn
window.__hermeneut = { loadedAt: null, updates: 0, updateLatencyMs: [] };

const view = () => document.getElementById("view");
const h = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
};
const esc = encodeURIComponent;

async function api(path) {
  const resp = await fetch(path, { credentials: "same-origin" });
  if (resp.status === 401) { location.href = "/login"; throw new Error("login required"); }
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error || resp.statusText);
  return body;
}

function verdictOf(g) {
  if (!g.application || g.application === "idle") return (g.values.utilization_gpu_percent || 0) < 5 ? "idle" : g.verdict;
  return g.verdict;
}
const pct = (v) => (v === undefined || v === null ? "–" : `${Math.round(v * 100)}%`);
const memRatio = (g) => g.relative.memory_used_ratio;
// idle as pipeline.vocab.IDLE_UTIL_PERCENT says (the finding, top wasted and right-sizing count the same); a GPU that
// reports no utilization is not known to be idle
const IDLE_UTIL_PERCENT = 5;
const wasted = (g) => g.job_id && typeof g.values.utilization_gpu_percent === "number" && g.values.utilization_gpu_percent < IDLE_UTIL_PERCENT;
const since = (ms) => new Date(ms).toLocaleTimeString();

// ---------------------------------------------------------------- live state
function applyGpus(list) {
  for (const g of list) state.gpus.set(g.uuid, g);
}

function showFreshness() {
  const badge = document.getElementById("live");
  const newest = Math.max(0, ...[...state.gpus.values()].map((g) => g.ts_ms));
  const age = (Date.now() - newest) / 1000;
  const stale = newest > 0 && age > 60;
  badge.textContent = stale ? `no new samples for ${age < 3600 ? Math.round(age / 60) + " min" : Math.round(age / 3600) + " h"} · ${state.gpus.size} GPUs (their last state)`
    : `live · ${state.gpus.size} GPUs`;
  badge.classList.toggle("on", !stale);
}

function connectLive() {
  const badge = document.getElementById("live");
  const source = new EventSource(`/api/v1/live?since=${state.version}`);
  source.addEventListener("update", (ev) => {
    const msg = JSON.parse(ev.data);
    state.version = msg.version;
    applyGpus(msg.gpus);
    showFreshness();
    requestAnimationFrame(() => {
      if (currentRoute().name === "fleet") renderFleetBody();
      const now = Date.now();
      const stats = window.__hermeneut;
      stats.updates += 1;
      for (const g of msg.gpus) stats.updateLatencyMs.push(now - g.ts_ms);
      if (stats.updateLatencyMs.length > 20000) stats.updateLatencyMs.splice(0, 10000);
    });
  });
  source.onerror = () => { badge.textContent = "reconnecting…"; badge.classList.remove("on"); };
}

// health (GET /api/v1/health: the alerts firing now folded per GPU and node), refreshed every 15 s; a fleet without
// the alert manager's topics shows no health rather than failing
// Only the answer to the latest request is drawn: the page's first (every cluster) can come back after the one for
// the cluster chosen a moment later, and would show the wrong counts until the next refresh.
const HEALTH_STATES = ["healthy", "degraded", "unhealthy", "unknown", "maintenance"];
let healthAsked = 0;
async function loadHealth() {
  const asked = ++healthAsked;
  const cluster = state.filters.cluster;
  let health = null;
  try {
    health = await api(`/api/v1/health${cluster ? "?cluster=" + esc(cluster) : ""}`);
  } catch (err) {
    // no health to draw
  }
  if (asked !== healthAsked) return;
  state.health = health;
  if (currentRoute().name === "fleet") renderFleetBody();
}
const gpuHealth = (uuid) => state.health?.gpus.find((a) => a.gpu === uuid);
const nodeHealth = (cluster, node) => state.health?.nodes.find((a) => a.cluster === cluster && a.node === node);

// ---------------------------------------------------------------- fleet
function filtered() {
  const f = state.filters;
  return [...state.gpus.values()].filter((g) =>
    (!f.cluster || g.cluster === f.cluster) && (!f.application || g.application === f.application) &&
    (!f.model || g.model === f.model) && (!f.job || g.job_id === f.job));
}

function select(name, label, values) {
  const s = h("select", { "data-filter": name, onchange: (e) => {
    state.filters[name] = e.target.value;
    renderFleetBody();
    if (name === "cluster") loadHealth();
  } },
    h("option", { value: "" }, "all"), ...values.map((v) => h("option", { value: v, selected: state.filters[name] === v ? "" : null }, v)));
  return h("label", {}, label, s);
}

function renderFleet() {
  const uniq = (fn) => [...new Set([...state.gpus.values()].map(fn).filter(Boolean))].sort();
  view().replaceChildren(
    h("h2", {}, "Fleet"),
    h("div", { class: "filters" },
      select("cluster", "cluster", uniq((g) => g.cluster)),
      select("application", "application", uniq((g) => g.application)),
      select("model", "GPU model", uniq((g) => g.model)),
      select("job", "job", uniq((g) => g.job_id))),
    h("div", { id: "fleet-body" }));
  renderFleetBody();
}

function renderFleetBody() {
  const body = document.getElementById("fleet-body");
  if (!body) return;
  const gpus = filtered();
  const count = (fn) => gpus.filter(fn).length;
  const counts = h("div", { class: "counts" },
    ...[["GPUs", gpus.length, "total"], ["busy", count((g) => (g.values.utilization_gpu_percent || 0) >= 5), "busy"],
      ["idle", count((g) => (g.values.utilization_gpu_percent || 0) < 5), "idle"],
      ["anomalous", count((g) => g.verdict === "anomalous"), "anomalous"],
      ["with findings", count((g) => Object.keys(g.findings).length > 0), "findings"],
      ["wasted capacity", count(wasted), "wasted"]].map(([label, n, id]) =>
      h("div", { class: "count", "data-count": id }, h("b", {}, n), h("span", {}, label))));
  const health = state.health ? h("div", { class: "counts health" }, ...HEALTH_STATES.map((s) =>
    h("div", { class: `count health-${s}`, "data-count": `health-${s}`, title: "GPUs by health (hermeneut health) in the cluster chosen, else all" },
      h("b", {}, state.health.gpus_by_state[s]), h("span", {}, s))),
    ...state.health.incidents.map((i) => h("div", { class: "count incident", "data-incident": i.detector },
      h("b", {}, `${i.gpus}/${i.of_gpus}`), h("span", {}, `fleet incident: ${i.detector}`)))) : null;
  const legend = h("div", { class: "legend" }, ...["normal", "unusual", "anomalous", "unscored", "idle"].map((v) =>
    h("span", {}, h("i", { style: `background: var(--${v})` }), v)), h("span", {}, "! open finding"));
  const byCluster = new Map();
  for (const g of gpus.sort((a, b) => a.node.localeCompare(b.node) || a.index - b.index)) {
    if (!byCluster.has(g.cluster)) byCluster.set(g.cluster, new Map());
    const nodes = byCluster.get(g.cluster);
    if (!nodes.has(g.node)) nodes.set(g.node, []);
    nodes.get(g.node).push(g);
  }
  const clusters = [...byCluster.entries()].map(([cluster, nodes]) => h("section", { class: "cluster", "data-cluster": cluster },
    h("h3", {}, `${cluster} — ${nodes.size} nodes`),
    h("div", { class: "nodes" }, ...[...nodes.entries()].map(([node, list]) => h("div", {
      class: `node health-${nodeHealth(cluster, node)?.state || "healthy"}`, "data-node": node,
      "data-health": nodeHealth(cluster, node)?.state || "healthy", title: nodeHealth(cluster, node) ? `${nodeHealth(cluster, node).state}: ${nodeHealth(cluster, node).remedy}` : null },
      h("div", { class: "node-name" }, h("a", { href: `#/node/${esc(cluster)}/${esc(node)}`, title: "the node's health" }, node),
        h("a", { href: `#/topology/${esc(cluster)}/${esc(node)}` }, "topology")),
      h("div", { class: "tiles" }, ...list.map((g) => h("a", {
        class: `tile ${verdictOf(g)} ${Object.keys(g.findings).length ? "finding" : ""}`, href: `#/gpu/${esc(g.uuid)}`,
        "data-gpu": g.uuid, "data-verdict": g.verdict, "data-health": gpuHealth(g.uuid)?.state || null,
        title: `${g.node} GPU ${g.index} · ${g.model}\n${g.application || "no workload known"}${g.inferred ? " (inferred)" : ""}` +
          `${g.job_id ? " · job " + g.job_id : ""}\nutil ${fmt(g.values.utilization_gpu_percent)}% · power ${pct(g.relative.power_ratio_of_limit)} of limit` +
          `${g.explanation ? "\n" + g.explanation : ""}` +
          `${gpuHealth(g.uuid) ? "\nhealth: " + gpuHealth(g.uuid).state + ", remedy: " + gpuHealth(g.uuid).remedy : ""}`,
      }))))))));
  body.replaceChildren(...[counts, health, legend].filter(Boolean), ...(clusters.length ? clusters : [h("p", { class: "empty" }, "No GPU has reported yet.")]));
}

// ---------------------------------------------------------------- GPU
const GPU_CHARTS = [
  ["utilization_gpu_percent", "GPU utilization", "%"], ["power_ratio_of_limit", "power / limit", "ratio"],
  ["memory_used_ratio", "memory used / total", "ratio"], ["temperature_ratio_of_slowdown", "temperature / slowdown", "ratio"],
  ["sm_clock_ratio_of_max", "SM clock / max", "ratio"], ["pcie_tx_bytes_per_second", "PCIe TX", "B/s"],
  ["nvlink_tx_bytes_per_second", "NVLink TX", "B/s"],
];

// a history view's window: the route's own (#/gpu/<uuid>?start=...&stop=..., e.g. imported history), else the default
function windowQuery(fallback) {
  const query = currentRoute().query;
  return query || `range=${fallback}`;
}

// the detectors the range's stored readings cannot feed (the API's cannot_see), each with why: a quiet view of
// logs with three columns is not a healthy GPU
function cannotSee(list) {
  if (!list || !list.length) return [];
  return [h("details", { class: "cannot-see", "data-testid": "cannot-see" },
    h("summary", {}, `Cannot be seen in this range: ${list.length} detectors the stored readings cannot feed`),
    h("ul", {}, ...list.map((c) => h("li", { "data-detector": c.detector }, h("b", {}, c.detector), ": ", c.why))))];
}

async function renderGpu(uuid) {
  const g = state.gpus.get(uuid);
  view().replaceChildren(h("h2", {}, `GPU ${uuid}`), h("p", { class: "muted" }, "loading…"));
  const data = await api(`/api/v1/gpus/${esc(uuid)}/history?${windowQuery("30m")}`);
  const head = g ? [
    h("p", {}, `${g.cluster} / ${g.node} · GPU ${g.index} · ${g.model} · `,
      g.application ? `${g.application}${g.inferred ? " (inferred)" : ""}` : "no workload known",
      g.job_id ? h("span", {}, " · job ", h("a", { href: `#/job/${esc(g.job_id)}` }, g.job_id)) : null,
      g.phase ? ` · phase ${g.phase}` : "", " ", h("span", { class: `badge ${g.verdict}`, "data-testid": "verdict" }, g.verdict)),
    g.explanation ? h("p", { class: "explain", "data-testid": "explanation" }, g.explanation) : null,
  ] : [];
  const charts = h("div", { class: "charts" });
  const markers = data.events.map((e) => ({ t: e.ts_ms, severity: e.severity, text: `${e.title}: ${e.text}` }));
  for (const [field, title, unit] of GPU_CHARTS) {
    const points = data.series[field] || [];
    if (!points.length) continue;
    const band = data.band[field] || null;
    lineChart(charts, { field, title: band ? `${title} · shaded: learned baseline p5–p95 of its application` : title, unit, tMin: data.from_ms, tMax: data.to_ms,
      series: [{ points }], band, markers });
  }
  const events = h("ul", { class: "events", "data-testid": "events" }, ...data.events.map((e) =>
    h("li", { "data-detector": e.detector || e.kind }, h("time", {}, since(e.ts_ms)), h("span", { class: `badge ${e.severity}` }, e.severity), " ",
      h("b", {}, e.title), " ", h("span", { class: "explain" }, e.text))));
  view().replaceChildren(h("h2", {}, `GPU ${g ? g.index : ""} on ${g ? g.node : ""}`), ...head.filter(Boolean), ...cannotSee(data.cannot_see), charts,
    h("h3", {}, "Events (same time axis: the marks on the charts)"),
    data.events.length ? events : h("p", { class: "empty" }, "No events in this window."));
}

// ---------------------------------------------------------------- jobs
function renderJobs() {
  const jobs = new Map();
  for (const g of state.gpus.values()) if (g.job_id) {
    if (!jobs.has(g.job_id)) jobs.set(g.job_id, []);
    jobs.get(g.job_id).push(g);
  }
  const rows = [...jobs.entries()].sort((a, b) => b[1].length - a[1].length).map(([job, gpus]) => h("tr", { "data-job": job },
    h("td", {}, h("a", { href: `#/job/${esc(job)}` }, job)), h("td", {}, gpus[0].application || "–"), h("td", {}, gpus[0].user || "–"),
    h("td", { class: "num" }, gpus.length), h("td", {}, [...new Set(gpus.map((g) => g.model))].join(", ")),
    h("td", {}, gpus.some((g) => g.findings.straggler) ? h("span", { class: "badge warning" }, "straggler") : "",
      gpus.some((g) => g.verdict === "anomalous") ? h("span", { class: "badge anomalous" }, "anomalous") : "")));
  view().replaceChildren(h("h2", {}, "Jobs"), rows.length ? h("table", {},
    h("tr", {}, ...["job", "application", "user", "GPUs", "models", ""].map((c) => h("th", {}, c))), ...rows)
    : h("p", { class: "empty" }, "No job context known (see hermeneut context)."));
}

async function renderJob(job) {
  view().replaceChildren(h("h2", {}, `Job ${job}`), h("p", { class: "muted" }, "loading…"));
  const data = await api(`/api/v1/jobs/${esc(job)}/history?${windowQuery("30m")}`);
  const stragglers = new Set(data.stragglers);
  const waitedOn = new Set(data.waited_on || []);
  const name = (u) => { const g = data.gpus.find((x) => x.uuid === u); return g && g.node ? `${g.node} GPU ${g.index}` : u; };
  const cards = h("div", { class: "job-grid" }, ...data.gpus.map((g) => {
    const slow = stragglers.has(g.uuid) || waitedOn.has(g.uuid);
    const card = h("div", { class: `gpu-card ${slow ? "straggler" : ""}`, "data-gpu": g.uuid },
      h("div", {}, h("a", { href: `#/gpu/${esc(g.uuid)}${currentRoute().query ? `?${currentRoute().query}` : ""}` },
        g.node ? `${g.node} GPU ${g.index}` : g.uuid), " ",
        stragglers.has(g.uuid) ? h("span", { class: "badge warning" }, "straggler") : "",
        waitedOn.has(g.uuid) ? h("span", { class: "badge warning" }, "the job waits on it") : "", " ", h("span", { class: `badge ${g.verdict}` }, g.verdict)),
      h("div", { class: "muted" }, `util ${fmt(g.values.utilization_gpu_percent)}% · SM clock ${fmt(g.values.sm_clock_mhz)} MHz · power ${pct(g.relative.power_ratio_of_limit)}`));
    // the GPU's open findings as marks where they started: the card shows when the trouble began
    const marks = Object.entries(g.findings || {}).map(([detector, f]) => ({ t: f.since_ms, severity: f.severity, text: `${detector}: ${f.summary}` }));
    lineChart(card, { field: "utilization_gpu_percent", title: "utilization", unit: "%", tMin: data.from_ms, tMax: data.to_ms,
      series: [{ points: data.series[g.uuid] || [], cls: stragglers.has(g.uuid) ? "straggler" : "" }], band: null, markers: marks });
    return card;
  }));
  const app = data.gpus[0] ? data.gpus[0].application : "";
  // the job's story first: its GPUs' open findings, the worst first, and which GPU the others wait on
  const rank = { critical: 0, warning: 1, info: 2 };
  const open = data.gpus.flatMap((g) => Object.entries(g.findings || {}).map(([detector, f]) => ({ g, detector, f })))
    .sort((a, b) => (rank[a.f.severity] ?? 3) - (rank[b.f.severity] ?? 3) || a.f.since_ms - b.f.since_ms);
  const findings = open.length ? h("ul", { class: "events", "data-testid": "job-findings" }, ...open.map(({ g, detector, f }) =>
    h("li", { "data-detector": detector, "data-gpu": g.uuid }, h("time", {}, since(f.since_ms)), h("span", { class: `badge ${f.severity}` }, f.severity), " ",
      h("b", {}, `${name(g.uuid)}: ${detector}`), " ", h("span", { class: "explain" }, f.summary))))
    : h("p", { class: "empty", "data-testid": "job-findings" }, "No open finding on the job's GPUs.");
  view().replaceChildren(h("h2", {}, `Job ${job}`),
    h("p", {}, `${data.gpus.length} GPUs · ${app || "application unknown"}`,
      stragglers.size ? h("span", { class: "warn", "data-testid": "stragglers" }, ` straggler: ${[...stragglers].map(name).join(", ")}`) : ""),
    waitedOn.size ? h("p", { class: "warn", "data-testid": "waited-on" }, `The job's other GPUs wait on ${[...waitedOn].map(name).join(", ")}.`) : "",
    h("h3", {}, "Open findings"), findings, ...cannotSee(data.cannot_see), cards);
}

// ---------------------------------------------------------------- topology
async function renderTopologyIndex() {
  const data = await api("/api/v1/topology");
  view().replaceChildren(h("h2", {}, "Topology"), data.nodes.length ? h("table", {},
    h("tr", {}, h("th", {}, "node"), ...["GPUs", "NVSwitch", "NICs"].map((c) => h("th", { class: "num" }, c)), h("th", {}, "")),
    ...data.nodes.map((n) => h("tr", {}, h("td", {}, h("a", { href: `#/topology/${esc(n.cluster)}/${esc(n.node)}` }, `${n.cluster} / ${n.node}`)),
      h("td", { class: "num" }, n.gpus), h("td", { class: "num" }, n.nvswitches), h("td", { class: "num" }, n.nics),
      h("td", {}, n.fallback ? h("span", { class: "badge warning" }, "PCIe fallback") : ""))))
    : h("p", { class: "empty" }, "No topology published yet."));
}

let topoTimer = null;
async function renderTopology(cluster, node) {
  const draw = async () => {
    const graph = await api(`/api/v1/topology/${esc(cluster)}/${esc(node)}`);
    const container = h("div", { class: "topo" });
    drawTopology(container, graph);
    const names = graph.fallback_gpus.map((u) => (graph.nodes.find((n) => n.id === u) || { label: u }).label);
    view().replaceChildren(h("h2", {}, `Topology of ${node}`),
      graph.fallback_gpus.length ? h("div", { class: "warn", "data-testid": "fallback" },
        `${names.join(", ")}: NVLink should carry this traffic but it goes over PCIe (link down or idle while PCIe is busy).`) : null,
      h("div", { class: "legend" }, h("span", {}, h("i", { style: "background: var(--nvlink)" }), "NVLink"),
        h("span", {}, h("i", { style: "background: var(--pcie)" }), "PCIe"), h("span", {}, h("i", { style: "background: var(--fallback)" }), "PCIe carrying NVLink traffic"),
        h("span", {}, h("i", { style: "background: var(--down)" }), "link down"), h("span", {}, "line width: live traffic")),
      container);
  };
  await draw();
  topoTimer = setInterval(() => draw().catch(() => {}), 2000);
}

// ---------------------------------------------------------------- alerts
async function renderAlerts() {
  const [alerts, silences, subs, history] = await Promise.all([
    api("/api/v1/alerts"), api("/api/v1/alerts/silences"), api("/api/v1/alerts/subscriptions"), api("/api/v1/alerts/history?range=24h")]);
  const table = (cols, rows) => rows.length ? h("table", {}, h("tr", {}, ...cols.map((c) => h("th", {}, c))), ...rows) : h("p", { class: "empty" }, "none");
  const now = Date.now();
  const timeline = h("div", { class: "charts" });
  lineChart(timeline, { title: "notifications in the last 24 h (red: firing, grey: resolved)", unit: "", tMin: now - 86400000, tMax: now,
    series: [], band: null, markers: history.map((n) => ({ t: Date.parse(n.time), severity: n.status === "firing" ? "" : "info", text: `${n.detector} → ${n.subscription}: ${n.outcome}` })) });
  const where = (l) => `${l.node || ""}${l.gpu && l.gpu !== "-" ? " / " + l.gpu : ""}`;
  const state = (a) => a.silenced_by ? "silenced" : a.inhibited ? "inhibited" : a.acked_by ? `acked by ${a.acked_by}` : a.flapping ? "flapping" : "";
  view().replaceChildren(h("h2", {}, "Alerts"),
    h("h3", {}, "Current"), table(["status", "severity", "detector", "where", "since", "", "summary"], alerts.map((a) =>
      h("tr", { "data-alert": a.dedup_key }, h("td", {}, h("span", { class: `badge ${a.status}` }, a.status)),
        h("td", {}, h("span", { class: `badge ${a.labels.severity || ""}` }, a.labels.severity || "")),
        h("td", {}, a.labels.detector || ""), h("td", {}, where(a.labels)), h("td", {}, since(a.starts_ns / 1e6)),
        h("td", { class: "muted" }, state(a)), h("td", { class: "explain" }, a.summary)))),
    h("h3", {}, "Timeline"), timeline,
    h("h3", {}, "Silences"), table(["matchers", "state", "until", "by", "comment"], silences.map((s) =>
      h("tr", {}, h("td", {}, s.match.join(", ")), h("td", {}, s.state), h("td", {}, new Date(s.ends_ns / 1e6).toLocaleString()),
        h("td", {}, s.created_by), h("td", {}, s.comment)))),
    h("h3", {}, "Subscriptions"), table(["name", "owner", "filters", "receivers"], subs.map((s) =>
      h("tr", {}, h("td", {}, s.name), h("td", {}, s.owner + (s.team ? ` (${s.team})` : "")), h("td", {}, s.match.join(", ")),
        h("td", {}, s.receivers.map((r) => r.kind).join(", "))))),
    h("h3", {}, "Notification history"), table(["time", "status", "detector", "subscription", "receiver", "outcome"], history.slice(0, 50).map((n) =>
      h("tr", {}, h("td", {}, new Date(n.time).toLocaleString()), h("td", {}, n.status), h("td", {}, n.detector), h("td", {}, n.subscription),
        h("td", {}, n.receiver_kind), h("td", {}, n.outcome)))));
}

// ---------------------------------------------------------------- right-sizing
async function renderRightsizing() {
  const data = await api(`/api/v1/rightsizing?${windowQuery("24h")}`);
  const bar = (used, allocated) => h("div", { class: "bar", title: `${fmt(used, "B")} of ${fmt(allocated, "B")}` },
    h("i", { style: `width:${Math.min(100, (100 * used) / Math.max(1, allocated)).toFixed(1)}%` }));
  view().replaceChildren(h("h2", {}, "Right-sizing"),
    h("p", { class: "muted" }, "Peak and p95 use over the range against what the job was given, and what would fit."),
    data.items.length ? h("table", {}, h("tr", {}, ...["job", "application", "GPUs × model", "memory p95 / allocated", "SM p95", "GPU-hours", "wasted (idle)", "recommendation"].map((c) => h("th", {}, c))),
      ...data.items.map((r) => h("tr", { "data-job": r.job_id || "" },
        h("td", {}, r.job_id ? h("a", { href: `#/job/${esc(r.job_id)}` }, r.job_id) : "–"), h("td", {}, r.application),
        h("td", {}, `${r.gpus} × ${r.gpu_model}`), h("td", {}, bar(r.memory_p95_bytes, r.memory_allocated_bytes), fmt(r.memory_p95_bytes, "B")),
        h("td", { class: "num" }, `${fmt(r.sm_p95_percent)}%`), h("td", { class: "num" }, fmt(r.gpu_hours)), h("td", { class: "num", title: `idle: allocated under 5% utilization` }, `${fmt(r.wasted_gpu_hours)} (${fmt(r.idle_gpu_hours)})`),
        h("td", { class: "explain" }, r.recommendation,
          r.answers?.length ? h("ul", { class: "answers" }, ...r.answers.map((line) => h("li", {}, line))) : ""))))
      : h("p", { class: "empty" }, "No job history in range."));
}

// ---------------------------------------------------------------- node (health)
const reasonList = (reasons) => reasons.length ? h("ul", { class: "reasons" }, ...reasons.map((r) =>
  h("li", { "data-detector": r.detector }, h("span", { class: `badge ${r.severity}` }, r.detector), ` ${r.summary}`))) : "–";

async function renderNode(cluster, node) {
  const data = await api(`/api/v1/health?cluster=${esc(cluster)}&node=${esc(node)}`);
  const n = data.nodes[0];
  const index = (uuid) => state.gpus.get(uuid)?.index ?? 1e9;
  const gpus = [...data.gpus].sort((a, b) => index(a.gpu) - index(b.gpu) || a.gpu.localeCompare(b.gpu));
  // the node's own reasons (a node-level finding, a lemon node, its silence); its GPUs' are in their rows
  const theirs = new Set(gpus.flatMap((g) => g.reasons.map((r) => `${r.detector}|${r.summary}`)));
  const own = n ? n.reasons.filter((r) => !theirs.has(`${r.detector}|${r.summary}`)) : [];
  view().replaceChildren(
    h("h2", {}, `Node ${cluster} / ${node} `, h("a", { href: `#/topology/${esc(cluster)}/${esc(node)}` }, "topology")),
    n ? h("p", { class: `node-state health-${n.state}`, "data-health": n.state },
      h("b", {}, n.state), ` · remedy: `, h("b", { "data-testid": "node-remedy" }, n.remedy)) : h("p", { class: "empty" }, "No health known for this node."),
    ...(own.length ? [reasonList(own)] : []),
    h("table", { class: "node-gpus" }, h("tr", {}, ...["GPU", "state", "remedy", "why"].map((c) => h("th", {}, c))),
      ...gpus.map((g) => h("tr", { "data-gpu": g.gpu, "data-health": g.state },
        h("td", { title: state.gpus.get(g.gpu)?.model || g.gpu }, h("a", { href: `#/gpu/${esc(g.gpu)}` },
          state.gpus.has(g.gpu) ? `GPU ${index(g.gpu)}` : g.gpu)),
        h("td", { class: `health-${g.state}` }, g.state), h("td", {}, g.remedy), h("td", {}, reasonList(g.reasons))))));
}

// ---------------------------------------------------------------- reliability
async function renderReliability() {
  const by = new URLSearchParams(currentRoute().query).get("by") || "gpu_model";
  const cluster = state.filters.cluster ? `&cluster=${esc(state.filters.cluster)}` : "";
  const data = await api(`/api/v1/reliability?range=7d&by=${esc(by)}${cluster}`);
  const num = (v) => (v === null || v === undefined ? "–" : String(v));
  const most = Math.max(1, ...data.days.map((d) => d.incidents + d.degradations));
  const bars = h("div", { class: "days", title: "incidents (red) and degradations (amber) by the day they started" },
    ...data.days.map((d) => h("div", { class: "day", "data-day": d.day_ns },
      h("span", {}, new Date(d.day_ns / 1e6).toISOString().slice(5, 10)),
      h("div", { class: "daybar degraded", style: `height: ${(100 * d.degradations) / most}px` }),
      h("div", { class: "daybar unhealthy", style: `height: ${(100 * d.incidents) / most}px` }))));
  view().replaceChildren(h("h2", {}, "Reliability, last 7 days"),
    h("p", {}, "by ", ...["gpu_model", "cluster", "node"].flatMap((b) => [h("a", { href: `#/reliability?by=${b}`, class: b === by ? "active" : "" }, b), " "]),
      " · incidents: GPUs made unhealthy; MTBI: GPU-hours per incident; repair: minutes from a finding's start to its clear;" +
      " tell: seconds from its start to the first notification a receiver took, over the incidents told"),
    h("table", { class: "reliability" },
      h("tr", {}, ...[by, "GPUs", "GPU-hours", "incidents", "MTBI (h)", "repair p50 (min)", "repair p90 (min)", "open", "degradations", "tell p50 (s)", "told"].map((c) => h("th", {}, c))),
      ...data.rows.map((r) => h("tr", { "data-group": r.group },
        h("td", {}, r.group), ...[r.gpus, r.gpu_hours, r.incidents, r.mtbi_hours, r.repair_median_min, r.repair_p90_min,
          r.open_incidents, r.degradations, r.tell_median_s, r.told].map((v, i) => h("td", { class: "num", "data-col": i }, num(v)))))),
    data.days.length ? bars : h("p", { class: "empty" }, "No incident or degradation in range."),
    ...data.lemon_nodes.map((l) => h("p", { class: "warn", "data-lemon": l.node }, `lemon node ${l.cluster}/${l.node}: ${l.why}`)),
    h("h3", {}, "Effective time per job: its GPUs all healthy and busy"),
    data.jobs.length ? h("table", { class: "jobs-effective" },
      h("tr", {}, ...["job", "application", "hours", "GPU-hours", "effective", "lost (h)", "lost to"].map((c) => h("th", {}, c))),
      ...data.jobs.map((j) => h("tr", { "data-job": j.job },
        h("td", {}, `${j.cluster}/${j.job}`), h("td", {}, j.application), h("td", { class: "num" }, num(j.hours)),
        h("td", { class: "num" }, num(j.gpu_hours)), h("td", { class: "num", "data-col": "effective" }, `${(100 * j.effective).toFixed(1)}%`),
        h("td", { class: "num" }, num(j.lost_hours)),
        h("td", {}, j.causes.map((c) => `${c.detector} ${c.hours} h`).join(", ") || "–")))) :
      data.notes.length ? null : h("p", { class: "empty" }, "No job summary in range."),
    ...data.notes.map((n) => h("p", { class: "warn", "data-note": "reliability" }, n)));
}

// ---------------------------------------------------------------- routing
function currentRoute() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?", 2);
  const parts = path.split("/").map(decodeURIComponent);
  return { name: parts[0] || "fleet", args: parts.slice(1), query: query || "" };
}

async function route() {
  clearInterval(topoTimer);
  document.body.dataset.ready = "0"; // a view is ready once it has rendered, also after a hash change
  const { name, args } = currentRoute();
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === (name === "gpu" || name === "node" ? "fleet" : name === "job" ? "jobs" : name));
  try {
    if (name === "gpu") await renderGpu(args[0]);
    else if (name === "jobs") renderJobs();
    else if (name === "job") await renderJob(args[0]);
    else if (name === "topology") await (args.length === 2 ? renderTopology(args[0], args[1]) : renderTopologyIndex());
    else if (name === "alerts") await renderAlerts();
    else if (name === "rightsizing") await renderRightsizing();
    else if (name === "node") await renderNode(args[0], args[1]);
    else if (name === "reliability") await renderReliability();
    else renderFleet();
  } catch (err) {
    view().replaceChildren(h("p", { class: "error" }, `Could not load this view: ${err.message}`));
  }
  document.body.dataset.view = name;
  document.body.dataset.ready = "1";
}

async function main() {
  const fleet = await api("/api/v1/fleet");
  state.version = fleet.version;
  applyGpus(fleet.gpus);
  window.addEventListener("hashchange", route);
  await route();
  window.__hermeneut.loadedAt = performance.now();
  showFreshness();
  setInterval(showFreshness, 15000);
  loadHealth();
  setInterval(loadHealth, 15000);
  connectLive();
}

main().catch((err) => view().replaceChildren(h("p", { class: "error" }, `hermeneut: ${err.message}`)));
