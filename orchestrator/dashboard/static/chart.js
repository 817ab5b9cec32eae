// Line charts as inline SVG, drawn here (no library): one path per series with one vertex per
// point (a null value breaks the line), vertical markers on the same x axis, "nice" ticks.
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#e377c2"];
  const MARKER_COLORS = { preempted: "#d62728", resume: "#2ca02c", restart: "#2ca02c", oom: "#9467bd",
    failed: "#8c564b", lost: "#17becf", checkpointed: "#bcbd22", diverged: "#e377c2", loss_flat: "#7f7f7f",
    cancelled: "#6b7280", stopped: "#6b7280" };

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function niceStep(span, count) {
    const raw = span / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    return (norm >= 5 ? 10 : norm >= 2 ? 5 : norm >= 1 ? 2 : 1) * mag;
  }

  function ticks(min, max, count) {
    if (!(max > min)) return [min];
    const step = niceStep(max - min, count);
    const out = [];
    for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
    return +v.toPrecision(4) + "";
  }

  function fmtTime(t, seconds) {
    const d = new Date(t * 1000);
    const two = (n) => String(n).padStart(2, "0");
    return two(d.getHours()) + ":" + two(d.getMinutes()) + (seconds ? ":" + two(d.getSeconds()) : "");
  }

  // opts: {title, series: [{name, points: [[x, y|null]...], color?, label? (the legend's text)}], markers?: [{step, kind, label}],
  //        xLabel?, time?: bool (x is Unix seconds), width?, height?}
  function line(opts) {
    const W = opts.width || 560, H = opts.height || 240, L = 56, R = 12, T = 14, B = 30;
    const box = document.createElement("div");
    box.className = "chart";
    const h = document.createElement("h3");
    h.textContent = opts.title || "";
    box.appendChild(h);
    const legend = document.createElement("div");
    legend.className = "legend";
    box.appendChild(legend);
    const series = (opts.series || []).map((s, i) => Object.assign({ color: PALETTE[i % PALETTE.length] }, s));
    const markers = opts.markers || [];
    const xs = [], ys = [];
    for (const s of series) for (const [x, y] of s.points) { xs.push(x); if (y !== null && isFinite(y)) ys.push(y); }
    for (const m of markers) xs.push(m.step);
    let x0 = xs.length ? Math.min(...xs) : 0, x1 = xs.length ? Math.max(...xs) : 1;
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    let y0 = ys.length ? Math.min(...ys) : 0, y1 = ys.length ? Math.max(...ys) : 1;
    if (y1 === y0) { const d = Math.abs(y0) * 0.05 || 1; y0 -= d; y1 += d; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const py = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": opts.title || "chart" });
    for (const v of ticks(y0, y1, 4)) {
      el("line", { x1: L, x2: W - R, y1: py(v), y2: py(v), stroke: "#eef0f3" }, svg);
      el("text", { x: L - 6, y: py(v) + 3, "text-anchor": "end" }, svg).textContent = fmt(v);
    }
    for (const v of ticks(x0, x1, opts.time ? 5 : 6)) {
      el("line", { x1: px(v), x2: px(v), y1: H - B, y2: H - B + 4, stroke: "#9ca3af" }, svg);
      el("text", { x: px(v), y: H - B + 15, "text-anchor": "middle" }, svg).textContent =
        opts.time ? fmtTime(v, x1 - x0 < 3600) : fmt(v);
    }
    el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#9ca3af" }, svg);
    el("line", { x1: L, x2: L, y1: T, y2: H - B, stroke: "#9ca3af" }, svg);
    if (opts.xLabel) el("text", { x: W - R, y: H - 3, "text-anchor": "end" }, svg).textContent = opts.xLabel;
    const atStep = {};
    for (const m of markers) {
      const row = atStep[m.step] = (atStep[m.step] || 0) + 1;  // labels of markers at one step stack
      const color = MARKER_COLORS[m.kind] || "#6b7280";
      const g = el("g", { class: `marker marker-${m.kind}`, "data-step": m.step, "data-kind": m.kind }, svg);
      el("line", { x1: px(m.step), x2: px(m.step), y1: T, y2: H - B, stroke: color, "stroke-width": 1.5,
        "stroke-dasharray": "4 3" }, g);
      el("title", {}, g).textContent = m.label || `${m.kind} at ${m.step}`;
      el("text", { x: px(m.step) + 3, y: T + 8 + 11 * (row - 1), fill: color }, g).textContent = m.kind;
    }
    for (const s of series) {
      let d = "", n = 0, pen = false;
      for (const [x, y] of s.points) {
        if (y === null || !isFinite(y)) { pen = false; continue; }
        d += (pen ? "L" : "M") + px(x).toFixed(1) + "," + py(y).toFixed(1) + " ";
        pen = true; n += 1;
      }
      el("path", { d: d.trim(), fill: "none", stroke: s.color, "stroke-width": 1.8, class: "series",
        "data-metric": s.name, "data-points": n }, svg);
      if (n === 1 || s.dots) {
        for (const [x, y] of s.points) if (y !== null && isFinite(y)) el("circle", { cx: px(x), cy: py(y), r: 2.5, fill: s.color }, svg);
      }
      const item = document.createElement("span");
      const sw = document.createElement("span");
      sw.className = "sw";
      sw.setAttribute("data-color", s.color);
      item.appendChild(sw);
      item.appendChild(document.createTextNode(s.label || `${s.name} (${n})`));  // (n): points drawn
      legend.appendChild(item);
    }
    box.appendChild(svg);
    // CSP allows no inline style attributes set from markup; set the swatch colours through the DOM.
    for (const sw of legend.querySelectorAll(".sw")) sw.style.background = sw.getAttribute("data-color");
    return box;
  }

  window.OrchChart = { line, fmtTime };
})();
