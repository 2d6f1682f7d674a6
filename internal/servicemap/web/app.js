// Rampart service map: polls api/map and api/flows (relative paths, so the page also works
// behind a proxy under a prefix) and redraws. Everything from the agent is put into the
// page as text (textContent, attributes), never as markup: names and L7 paths come from
// traffic.
"use strict";

const POLL_MS = 1000;
const NODE_W = 180, NODE_H = 30, NODE_GAP = 10, PAD = 12, TITLE_H = 22, COL_GAP = 150, ROW_GAP = 40;
// Room above the boxes for the arcs of long edges, and right of them for the curves and
// labels of edges within the last column.
const TOP = 80, RIGHT = 260;
const COLORS = { FORWARDED: "#2e7d32", DROPPED: "#c62828", REDIRECTED: "#1565c0", AUDIT: "#ef6c00", OTHER: "#656d76" };
const SVG_NS = "http://www.w3.org/2000/svg";

const filters = document.getElementById("filters");
const statusEl = document.getElementById("status");

// el makes an element: attrs are attributes (class, data-*), children nodes or strings.
function el(ns, tag, attrs, ...children) {
  const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c !== undefined && c !== null) e.append(c);
  }
  return e;
}
const h = (tag, attrs, ...c) => el(null, tag, attrs, ...c);
const s = (tag, attrs, ...c) => el(SVG_NS, tag, attrs, ...c);

function verdictClass(v) { return "v-" + (COLORS[v] ? v : "OTHER"); }

// decidedBy names what decided a verdict: the rules' policies, or for a drop without a
// rule the default deny (no policy rule allows it).
function decidedBy(d) {
  if (d.rules && d.rules.length) return d.rules.map(r => r.policy + (r.rule ? " " + r.rule : "")).join(", ");
  if ((d.reasons || []).some(r => r.value === "policy-default-deny")) return "default deny (no rule allows)";
  return "";
}
const list = (xs, f) => (xs || []).map(f).join(", ");
const counted = c => c.value + (c.count > 1 ? " ×" + c.count : "");
const l7Text = l => l.method + " " + l.path + " " + (l.status || "reset");

// layout places the namespaces as columns, wrapped into rows to fit the width, each node
// a box in its namespace's column. It returns the node positions by ID and the size.
function layout(namespaces, width) {
  const colW = NODE_W + 2 * PAD;
  const perRow = Math.max(1, Math.floor((width + COL_GAP) / (colW + COL_GAP)));
  const pos = new Map(), boxes = [];
  let y = TOP, maxX = 0;
  for (let i = 0; i < namespaces.length; i += perRow) {
    const row = namespaces.slice(i, i + perRow);
    let rowH = 0;
    row.forEach((ns, j) => {
      const x = 10 + j * (colW + COL_GAP);
      const hgt = TITLE_H + PAD + ns.nodes.length * (NODE_H + NODE_GAP);
      boxes.push({ ns, x, y, w: colW, h: hgt });
      ns.nodes.forEach((n, k) => pos.set(n.id, { x: x + PAD, y: y + TITLE_H + k * (NODE_H + NODE_GAP), node: n }));
      rowH = Math.max(rowH, hgt);
      maxX = Math.max(maxX, x + colW);
    });
    y += rowH + ROW_GAP;
  }
  return { pos, boxes, width: maxX + RIGHT, height: Math.max(y - ROW_GAP + 10, TOP + 60) };
}

// edgeGeometry is a quadratic curve between two node boxes, bent to the left of its
// direction so that a->b and b->a do not overlap, the more the longer it is so that an edge
// across several columns arcs over the boxes between; within a column it bulges right.
function edgeGeometry(a, b) {
  let x1, y1 = a.y + NODE_H / 2, x2, y2 = b.y + NODE_H / 2, cx, cy;
  if (Math.abs(a.x - b.x) < 1) {
    x1 = a.x + NODE_W; x2 = b.x + NODE_W;
    cx = x1 + 50 + Math.abs(y2 - y1) / 4; cy = (y1 + y2) / 2 + (y2 > y1 ? -8 : 8);
  } else {
    const right = b.x > a.x;
    x1 = right ? a.x + NODE_W : a.x; x2 = right ? b.x : b.x + NODE_W;
    const mx = (x1 + x2) / 2, my = (y1 + y2) / 2, dx = x2 - x1, dy = y2 - y1, len = Math.hypot(dx, dy) || 1;
    const bend = Math.min(24 + 0.2 * len, 150);
    cx = mx + (dy / len) * bend; cy = my - (dx / len) * bend;
  }
  const lx = 0.25 * x1 + 0.5 * cx + 0.25 * x2, ly = 0.25 * y1 + 0.5 * cy + 0.25 * y2;
  // A label beside a curve within a column starts at its bulge, into the gap; others are
  // centred on the curve.
  const anchor = Math.abs(a.x - b.x) < 1 ? "start" : "middle";
  return { d: `M${x1},${y1} Q${cx},${cy} ${x2},${y2}`, lx: anchor === "start" ? lx + 4 : lx, ly, anchor, minX: Math.min(x1, x2) + 6 };
}

function renderMap(m) {
  const svg = document.getElementById("map");
  const width = Math.max(600, document.documentElement.clientWidth - 40);
  const namespaces = m.namespaces || [];
  const { pos, boxes, width: w, height } = layout(namespaces, width);
  svg.setAttribute("width", w);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${w} ${height}`);
  const defs = s("defs");
  for (const [v, c] of Object.entries(COLORS)) {
    defs.append(s("marker", { id: "arrow-" + v, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M0,0 L10,5 L0,10 z", fill: c })));
  }
  const nsLayer = s("g", { class: "namespaces" }), edgeLayer = s("g", { class: "edges" }), labelLayer = s("g", { class: "labels" });
  for (const b of boxes) {
    const g = s("g", { class: "ns", "data-namespace": b.ns.name },
      s("rect", { class: "ns-box", x: b.x, y: b.y, width: b.w, height: b.h, rx: 6 }),
      s("text", { class: "ns-title", x: b.x + PAD, y: b.y + 15 }, b.ns.name ? "namespace " + b.ns.name : "outside the pods"));
    for (const n of b.ns.nodes) {
      const p = pos.get(n.id);
      const tip = [n.id, n.kind, n.ip, n.node && "node " + n.node].filter(Boolean).join("\n");
      const node = s("g", { class: "node", "data-node": n.id, "data-kind": n.kind, "data-namespace": n.namespace || "" },
        s("title", {}, tip),
        s("rect", { x: p.x, y: p.y, width: NODE_W, height: NODE_H, rx: 4 }),
        s("text", { x: p.x + 8, y: p.y + 19 }, n.name + (n.node ? " @" + n.node : "")));
      node.addEventListener("click", () => { filters.elements.pod.value = n.id; filtersChanged(); });
      g.append(node);
    }
    nsLayer.append(g);
  }
  for (const e of m.edges || []) {
    const a = pos.get(e.source), b = pos.get(e.destination);
    if (!a || !b || e.source === e.destination) continue; // listed in the table below
    const geo = edgeGeometry(a, b);
    const vk = COLORS[e.verdict] ? e.verdict : "OTHER";
    const bad = e.verdicts.filter(d => d.verdict === "DROPPED" || d.verdict === "AUDIT");
    const reasons = [...new Set(bad.flatMap(d => (d.reasons || []).map(r => r.value)))];
    const policies = [...new Set(bad.flatMap(d => (d.rules || []).map(r => r.policy)))];
    const tip = e.id + "\n" + e.verdicts.map(d => `${d.verdict} ×${d.flows}` +
      (d.ports ? " ports " + list(d.ports, counted) : "") +
      (d.reasons ? " reasons " + list(d.reasons, counted) : "") +
      (decidedBy(d) ? " by " + decidedBy(d) : "") +
      (d.l7 ? " L7 " + list(d.l7, l7Text) : "")).join("\n");
    const g = s("g", {
      class: "edge " + verdictClass(e.verdict), "data-edge": e.id, "data-verdict": e.verdict,
      "data-verdicts": e.verdicts.map(d => d.verdict).join(" "),
      "data-reasons": reasons.join(" "), "data-policies": policies.join(" "), "data-flows": e.flows,
    }, s("title", {}, tip), s("path", { d: geo.d, "marker-end": `url(#arrow-${vk})` }));
    edgeLayer.append(g);
    let label = "";
    if (bad.length) {
      // Short: the reasons and the deciding policies; the rules are in the tooltip and table.
      label = (bad[0].verdict === "AUDIT" ? "audit: " : "✕ ") + reasons.join(", ") + (policies.length ? " · " + policies.join(", ") : "");
    } else {
      const l7 = e.verdicts.flatMap(d => d.l7 || []);
      if (l7.length) label = l7Text(l7[0]) + (l7.length > 1 ? ` +${l7.length - 1}` : "");
    }
    if (label) {
      const t = s("text", { class: "edge-label " + verdictClass(e.verdict), "data-edge-label": e.id, x: geo.lx, y: geo.ly + 4, "text-anchor": geo.anchor }, label);
      t.minX = geo.minX;
      labelLayer.append(t);
    }
  }
  svg.replaceChildren(defs, nsLayer, edgeLayer, labelLayer);
  // A centred label wider than its curve would cover the box it leaves: start it past the
  // box instead (the text's width is known only once it is in the page).
  for (const t of labelLayer.children) {
    const half = t.getComputedTextLength() / 2;
    if (t.getAttribute("text-anchor") === "middle" && Number(t.getAttribute("x")) - half < t.minX) {
      t.setAttribute("x", t.minX + half);
    }
  }

  const st = m.stats;
  document.getElementById("stats").textContent =
    `${st.flowsSeen} flows seen · ${st.edges} edges (at most ${st.maxEdges}; ${st.edgesEvicted} evicted, ${st.detailsOmitted} details over the per-edge bound) · ` +
    `flow table: the last ${st.flowsKept} (at most ${st.maxFlows}; ${st.flowsEvicted} older ones dropped)` +
    (st.flowsLost ? ` · ${st.flowsLost} flows lost (the map read slower than they came)` : "") + (m.error ? " · " + m.error : "");

  const rows = [];
  for (const e of m.edges || []) {
    for (const d of e.verdicts) {
      rows.push(h("tr", { class: "row-" + d.verdict, "data-edge": e.id, "data-verdict": d.verdict },
        h("td", {}, e.source), h("td", {}, e.destination), h("td", { class: verdictClass(d.verdict) }, d.verdict),
        h("td", { class: "num" }, String(d.flows)), h("td", {}, list(d.ports, counted)), h("td", {}, list(d.reasons, counted)),
        h("td", {}, decidedBy(d)), h("td", {}, list(d.l7, l => l7Text(l) + (l.count > 1 ? " ×" + l.count : "")))));
    }
  }
  document.querySelector("#edges tbody").replaceChildren(...rows);

  // The namespace filter offers the namespaces on the map, and keeps a chosen one.
  const sel = filters.elements.namespace, chosen = sel.value;
  const names = new Set(namespaces.map(n => n.name).filter(Boolean));
  if (chosen) names.add(chosen);
  sel.replaceChildren(h("option", { value: "" }, "all"), ...[...names].sort().map(n => h("option", { value: n }, n)));
  sel.value = chosen;
}

function renderFlows(t) {
  const rows = (t.flows || []).map(f => {
    const port = (p, n) => p.id + (n ? ":" + n : "");
    const by = f.policy ? f.policy + (f.rule ? " " + f.rule : "") : (f.reason === "policy-default-deny" ? "default deny" : "");
    return h("tr", { class: "row-" + f.verdict, "data-flow": f.seq, "data-verdict": f.verdict, "data-source": f.source.id, "data-destination": f.destination.id },
      h("td", {}, new Date(f.time).toTimeString().slice(0, 8)),
      h("td", {}, port(f.source, f.sourcePort)), h("td", {}, port(f.destination, f.destinationPort)),
      h("td", {}, f.protocol), h("td", {}, f.direction || ""), h("td", { class: verdictClass(f.verdict) }, f.verdict),
      h("td", {}, f.reason || ""), h("td", {}, by), h("td", {}, f.l7 ? l7Text(f.l7) : ""));
  });
  document.querySelector("#flows tbody").replaceChildren(...rows);
}

function query() {
  const q = new URLSearchParams();
  for (const k of ["namespace", "pod", "verdict", "port"]) {
    const v = filters.elements[k].value.trim();
    if (v) q.set(k, v);
  }
  return q;
}

async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()).trim());
  return r.json();
}

let timer = null;
async function tick() {
  clearTimeout(timer);
  try {
    const q = query();
    q.set("limit", "200");
    const [m, t] = await Promise.all([get("api/map"), get("api/flows?" + q)]);
    renderMap(m);
    renderFlows(t);
    statusEl.dataset.state = "live";
    statusEl.textContent = "live · updated " + new Date().toTimeString().slice(0, 8);
  } catch (err) {
    statusEl.dataset.state = "error";
    statusEl.textContent = "cannot reach the agent: " + err.message;
  }
  timer = setTimeout(tick, POLL_MS);
}

// The filters live in the page's query string, so a filtered view can be bookmarked.
function filtersChanged() {
  const q = query().toString();
  history.replaceState(null, "", q ? "?" + q : location.pathname);
  tick();
}

const initial = new URLSearchParams(location.search);
for (const k of ["pod", "verdict", "port"]) filters.elements[k].value = initial.get(k) || "";
if (initial.get("namespace")) {
  const ns = initial.get("namespace");
  filters.elements.namespace.append(h("option", { value: ns }, ns));
  filters.elements.namespace.value = ns;
}
filters.addEventListener("input", filtersChanged);
filters.addEventListener("submit", ev => ev.preventDefault());
tick();
