// The node's interconnect drawn in layers: CPUs, PCIe switches, GPUs and NICs, NVSwitch; edges sized by traffic.
import { el, fmt } from "./charts.js";

const LAYER = { cpu: 60, "pcie-switch": 170, gpu: 300, nic: 300, nvswitch: 470 };
const SIZE = { cpu: [130, 34], "pcie-switch": [96, 28], gpu: [74, 46], nic: [74, 40], nvswitch: [260, 34] };
const LABEL_MIN = 1e8; // edges carrying less than 100 MB/s are drawn but not labelled

function layout(graph, width) {
  const pos = {};
  const leaves = graph.nodes.filter((n) => n.kind === "gpu" || n.kind === "nic");
  const switchOf = {};
  for (const e of graph.edges) {
    if ((e.kind === "pcie" || e.kind === "nic") && e.b.startsWith("pcie")) switchOf[e.a] = e.b;
  }
  // order leaves by their switch so each switch sits above its own GPUs and NICs
  leaves.sort((a, b) => (switchOf[a.id] || "").localeCompare(switchOf[b.id] || "") || a.label.localeCompare(b.label, undefined, { numeric: true }));
  const step = width / (leaves.length + 1);
  leaves.forEach((n, i) => { pos[n.id] = [step * (i + 1), LAYER[n.kind]]; });
  const mean = (ids) => ids.reduce((s, id) => s + pos[id][0], 0) / Math.max(1, ids.length);
  for (const n of graph.nodes.filter((n) => n.kind === "pcie-switch")) {
    const members = Object.keys(switchOf).filter((k) => switchOf[k] === n.id);
    pos[n.id] = [mean(members), LAYER["pcie-switch"]];
  }
  for (const n of graph.nodes.filter((n) => n.kind === "cpu")) {
    const switches = graph.edges.filter((e) => e.b === n.id && e.a.startsWith("pcie")).map((e) => e.a);
    pos[n.id] = [switches.length ? mean(switches) : width / 2, LAYER.cpu];
  }
  for (const n of graph.nodes.filter((n) => n.kind === "nvswitch")) pos[n.id] = [width / 2, LAYER.nvswitch];
  return pos;
}

function strokeWidth(bytesPerSecond) {
  if (!bytesPerSecond) return 1.5;
  return Math.min(14, 1.5 + 2 * Math.log10(1 + bytesPerSecond / 1e8));
}

export function drawTopology(container, graph) {
  const leaves = graph.nodes.filter((n) => n.kind === "gpu" || n.kind === "nic").length;
  const width = Math.max(1100, 86 * (leaves + 1));
  const svg = el("svg", { viewBox: `0 0 ${width} 540`, "data-testid": "topology-svg" });
  const pos = layout(graph, width);
  for (const e of graph.edges) {
    if (!pos[e.a] || !pos[e.b]) continue;
    const [x1, y1] = pos[e.a], [x2, y2] = pos[e.b];
    const line = el("line", {
      x1, y1, x2, y2, class: `edge ${e.kind} ${e.state}`, "stroke-width": strokeWidth(e.bytes_per_second),
      "data-edge": `${e.kind}:${e.a}:${e.b}`, "data-state": e.state,
    }, svg);
    el("title", {}, line).textContent = `${e.kind} ${e.label || ""} ${e.state}: ${fmt(e.bytes_per_second, "B/s")}`;
    if (e.bytes_per_second >= LABEL_MIN && e.kind !== "cpu-link" && !e.b.startsWith("cpu")) {
      el("text", { x: x1 + (x2 - x1) * 0.35 + 4, y: y1 + (y2 - y1) * 0.35, class: "edge-label" }, svg).textContent = fmt(e.bytes_per_second, "B/s");
    }
  }
  for (const n of graph.nodes) {
    if (!pos[n.id]) continue;
    const [w, h] = SIZE[n.kind];
    const [cx, cy] = pos[n.id];
    const g = el("g", { class: `n ${n.kind} ${n.flags.join(" ")}`, "data-node": n.id, "data-kind": n.kind, "data-flags": n.flags.join(" ") }, svg);
    el("rect", { x: cx - w / 2, y: cy - h / 2, width: w, height: h, rx: 5 }, g);
    el("text", { x: cx, y: cy - (n.kind === "gpu" ? 6 : 0) }, g).textContent = n.label;
    if (n.kind === "gpu") el("text", { x: cx, y: cy + 10, class: "edge-label" }, g).textContent = n.verdict || "";
    if (n.kind === "nic") el("text", { x: cx, y: cy + 10, class: "edge-label" }, g).textContent = n.detail;
    el("title", {}, g).textContent = `${n.label}${n.flags.length ? " — " + n.flags.join(", ") : ""}`;
  }
  container.appendChild(svg);
}
