// Small SVG charts: a time series with the learned baseline band drawn behind it and event markers on the time axis.
const NS = "http://www.w3.org/2000/svg";

export function el(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

export function fmt(value, unit = "") {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const abs = Math.abs(value);
  if (unit === "B/s" || unit === "B") {
    const units = ["", "K", "M", "G", "T"];
    let v = value, i = 0;
    while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i += 1; }
    return `${v.toFixed(v >= 100 ? 0 : 1)} ${units[i]}${unit}`;
  }
  if (unit === "ratio") return `${(value * 100).toFixed(0)}%`; // a share of the GPU's own limit, 0-1
  if (unit === "%") return `${value.toFixed(0)}%`; // a reading already in percent, 0-100
  return `${abs >= 100 ? value.toFixed(0) : value.toFixed(abs >= 10 ? 1 : 2)}${unit ? " " + unit : ""}`;
}

// spec: {title, unit, tMin, tMax, series: [{points: [[t, v]], cls}], band: {p05, p50, p95} | null, markers: [{t, severity, text}]}
export function lineChart(container, spec) {
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.field = spec.field || "";
  const title = document.createElement("div");
  title.className = "chart-title";
  title.textContent = spec.title;
  box.appendChild(title);
  const W = 440, H = 160, L = spec.unit === "B/s" || spec.unit === "B" ? 60 : 44, R = 8, T = 8, B = 18;
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" }, box);
  const values = spec.series.flatMap((s) => s.points.map((p) => p[1]));
  if (spec.band) values.push(spec.band.p05, spec.band.p95);
  const finite = values.filter((v) => Number.isFinite(v));
  let lo = finite.length ? Math.min(...finite) : 0, hi = finite.length ? Math.max(...finite) : 1;
  // a share is drawn on its whole range (0-100 %), so noise at the top does not fill the chart as drama would
  if (spec.unit === "%" || spec.unit === "ratio") { lo = Math.min(lo, 0); hi = Math.max(hi, spec.unit === "%" ? 100 : 1); }
  if (hi - lo < 1e-9) { const pad = Math.abs(hi) * 0.1 || 1; hi += pad; lo -= pad; }
  lo = Math.min(lo, 0 <= lo && lo < hi * 0.25 ? 0 : lo);
  const x = (t) => L + ((t - spec.tMin) / Math.max(1, spec.tMax - spec.tMin)) * (W - L - R);
  const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }, svg);
  el("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }, svg);
  for (const v of finite.length ? [lo, (lo + hi) / 2, hi] : []) { // a chart of marks alone has no value axis
    el("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end", class: "axis-label" }, svg).textContent = fmt(v, spec.unit);
  }
  // a window of half a day or more says the dates too (24 h ends at the clock time it starts at)
  const stamp = (t) => spec.tMax - spec.tMin >= 12 * 3600000
    ? new Date(t).toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" })
    : new Date(t).toLocaleTimeString();
  el("text", { x: L, y: H - 4, class: "axis-label", "data-axis": "from" }, svg).textContent = stamp(spec.tMin);
  el("text", { x: W - R, y: H - 4, "text-anchor": "end", class: "axis-label", "data-axis": "to" }, svg).textContent = stamp(spec.tMax);
  if (spec.band) {
    el("rect", { x: L, width: W - L - R, y: y(spec.band.p95), height: Math.max(1, y(spec.band.p05) - y(spec.band.p95)), class: "band" }, svg);
    el("line", { x1: L, x2: W - R, y1: y(spec.band.p50), y2: y(spec.band.p50), class: "band-mid" }, svg);
  }
  for (const m of spec.markers || []) {
    if (m.t < spec.tMin || m.t > spec.tMax) continue;
    const line = el("line", { x1: x(m.t), x2: x(m.t), y1: T, y2: H - B, class: `marker ${m.severity || ""}` }, svg);
    el("title", {}, line).textContent = m.text;
  }
  for (const s of spec.series) {
    if (!s.points.length) continue;
    const d = s.points.filter((p) => Number.isFinite(p[1])).map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
    const path = el("path", { d, class: `series ${s.cls || ""}` }, svg);
    if (s.name) el("title", {}, path).textContent = s.name;
  }
  // the reading under the pointer: its time and value, top right
  const points = spec.series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]));
  const readout = document.createElement("span");
  readout.className = "readout";
  title.appendChild(readout);
  svg.addEventListener("mousemove", (ev) => {
    if (!points.length) return;
    const r = svg.getBoundingClientRect();
    const t = spec.tMin + (((ev.clientX - r.left) / r.width) * W - L) / (W - L - R) * (spec.tMax - spec.tMin);
    const p = points.reduce((a, b) => (Math.abs(b[0] - t) < Math.abs(a[0] - t) ? b : a));
    readout.textContent = `${stamp(p[0])}  ${fmt(p[1], spec.unit)}`;
  });
  svg.addEventListener("mouseleave", () => { readout.textContent = ""; });
  container.appendChild(box);
  return box;
}
