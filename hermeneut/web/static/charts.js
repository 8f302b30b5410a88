// Time-series charts drawn by uPlot (static/vendor/uplot, loaded by index.html as the global `uPlot`): a reading
// with its application's learned baseline band shaded behind it, the events of the window as marks on the same
// time axis, drag to zoom in (double-click for the whole window again), and the reading or mark under the pointer
// in the title. The SVG helper `el` serves the topology drawing.
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

// the axes' type, and room for the widest value label in it and the tick before it
const FONT = '11px system-ui, -apple-system, "Segoe UI", sans-serif';
const meter = document.createElement("canvas").getContext("2d");
meter.font = FONT;
const labelWidth = (values) => Math.ceil(14 + Math.max(20, ...(values || []).map((v) => meter.measureText(String(v)).width)));

const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

// the value range of a chart: a share on its whole range (0-100 %), so noise at the top does not fill the chart as
// drama would; other readings from their data (band included), from 0 where the data sit near it
export function valueRange(unit, lo, hi) {
  if (lo === null || hi === null || !Number.isFinite(lo) || !Number.isFinite(hi)) return [0, unit === "%" ? 100 : 1];
  if (unit === "%" || unit === "ratio") return [Math.min(lo, 0), Math.max(hi, unit === "%" ? 100 : 1)];
  if (hi - lo < 1e-9) { const pad = Math.abs(hi) * 0.1 || 1; return [lo - pad, hi + pad]; }
  return [0 <= lo && lo < hi * 0.25 ? 0 : lo, hi + (hi - lo) * 0.05];
}

// every series on one x axis (seconds): the window's two ends and each reading's time; a series is null where it
// has no reading, and the window's ends hold none, so the x axis spans the whole window however few readings it has
function aligned(spec, bandRows) {
  const times = new Set([spec.tMin, spec.tMax]);
  for (const s of spec.series) for (const [t] of s.points) times.add(t);
  const xs = [...times].sort((a, b) => a - b);
  const at = new Map(xs.map((t, i) => [t, i]));
  const columns = spec.series.map((s) => {
    const ys = new Array(xs.length).fill(null);
    for (const [t, v] of s.points) if (Number.isFinite(v)) ys[at.get(t)] = v;
    return ys;
  });
  return [xs.map((t) => t / 1000), ...columns, ...bandRows.map((v) => new Array(xs.length).fill(v))];
}

// spec: {field, title, unit, tMin, tMax (ms), series: [{points: [[t ms, v]], cls, name}], band: {p05, p50, p95} | null,
// markers: [{t ms, severity, text}]}
export function lineChart(container, spec) {
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.field = spec.field || "";
  const title = document.createElement("div");
  title.className = "chart-title";
  title.textContent = spec.title;
  const readout = document.createElement("span");
  readout.className = "readout";
  title.appendChild(readout);
  const plot = document.createElement("div");
  plot.className = "plot";
  const ends = document.createElement("div");
  ends.className = "chart-ends";
  ends.title = "drag across the chart to zoom in, double-click for the whole window";
  const [from, to] = ["from", "to"].map((end) => { const s = document.createElement("span"); s.dataset.axis = end; ends.appendChild(s); return s; });
  box.append(title, plot, ends);

  const drawn = spec.series.filter((s) => s.points.some((p) => Number.isFinite(p[1])));
  const height = drawn.length ? 160 : 90; // a chart of marks alone is a strip
  const markers = (spec.markers || []).filter((m) => m.t >= spec.tMin && m.t <= spec.tMax);
  box.dataset.series = String(drawn.length);
  box.dataset.marks = String(markers.length);
  const bandRows = spec.band ? [spec.band.p95, spec.band.p05, spec.band.p50] : [];
  const data = aligned(spec, bandRows);
  const n = spec.series.length;
  const muted = css("--muted"), grid = css("--line");
  const series = [{}, ...spec.series.map((s) => ({
    label: s.name || spec.title, stroke: s.cls === "straggler" ? css("--fallback") : "#e6edf3", width: s.cls === "straggler" ? 2.4 : 1.6,
    spanGaps: false, points: { show: false },
  }))];
  if (spec.band) {
    const band = css("--nvlink");
    series.push({ label: "baseline p95", stroke: "transparent", points: { show: false } },
      { label: "baseline p5", stroke: "transparent", points: { show: false } },
      { label: "baseline median", stroke: band, dash: [3, 3], width: 1, points: { show: false } });
  }
  // a window of half a day or more says the dates too (24 h ends at the clock time it starts at)
  const long = spec.tMax - spec.tMin >= 12 * 3600000;
  const stamp = (t) => long
    ? new Date(t).toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" })
    : new Date(t).toLocaleTimeString();
  const points = drawn.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]));
  const severity = { "": css("--anomalous"), critical: css("--anomalous"), warning: css("--unusual"), info: css("--unscored") };
  const opts = {
    width: 440, height,
    legend: { show: false },
    cursor: { drag: { x: true, y: false, setScale: true }, points: { show: false } },
    scales: { x: { time: true }, y: { range: (u, lo, hi) => valueRange(spec.unit, lo, hi) } },
    series,
    bands: spec.band ? [{ series: [n + 1, n + 2], fill: "rgba(90, 169, 230, 0.16)" }] : [],
    axes: [
      { font: FONT, stroke: muted, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } },
      // a chart of marks alone has no value axis
      { show: drawn.length > 0, stroke: muted, font: FONT, size: (u, values) => labelWidth(values),
        grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, values: (u, splits) => splits.map((v) => fmt(v, spec.unit)) },
    ],
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        ctx.save();
        ctx.lineWidth = 1.5 * devicePixelRatio;
        for (const m of markers) {
          const t = m.t / 1000;
          if (t < u.scales.x.min || t > u.scales.x.max) continue;
          const x = Math.round(u.valToPos(t, "x", true));
          ctx.strokeStyle = severity[m.severity || ""] || severity[""];
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
        }
        ctx.restore();
        box.dataset.yRange = `${u.scales.y.min} ${u.scales.y.max}`;
      }],
      setScale: [(u, key) => {
        if (key !== "x") return;
        const lo = u.scales.x.min * 1000, hi = u.scales.x.max * 1000;
        box.dataset.xRange = `${Math.round(lo)} ${Math.round(hi)}`;
        from.textContent = stamp(lo);
        to.textContent = stamp(hi);
      }],
      // what is under the pointer: a mark within 4 px says what happened, else the reading nearest in time
      setCursor: [(u) => {
        const left = u.cursor.left;
        if (left === null || left === undefined || left < 0) { readout.textContent = ""; return; }
        const mark = markers.find((m) => Math.abs(u.valToPos(m.t / 1000, "x") - left) <= 4);
        if (mark) { readout.textContent = `${stamp(mark.t)}  ${mark.text}`; return; }
        if (!points.length) { readout.textContent = ""; return; }
        const t = u.posToVal(left, "x") * 1000;
        const p = points.reduce((a, b) => (Math.abs(b[0] - t) < Math.abs(a[0] - t) ? b : a));
        readout.textContent = `${stamp(p[0])}  ${fmt(p[1], spec.unit)}`;
      }],
    },
  };
  const chart = new uPlot(opts, data, plot);
  // as wide as its place on the page, once it has one and whenever it changes
  new ResizeObserver((entries) => {
    const width = Math.floor(entries[0].contentRect.width);
    if (width > 0 && width !== chart.width) chart.setSize({ width, height });
  }).observe(plot);
  container.appendChild(box);
  return box;
}
