// Building DOM and SVG from data, never from HTML strings (nothing a service says is parsed as markup).
const SVG = "http://www.w3.org/2000/svg";

function build(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const h = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);
export const s = (tag, attrs, ...children) => build(document.createElementNS(SVG, tag), attrs, children);

export function table(columns, rows) {
  return h("table", {}, h("tr", {}, columns.map((c) => h("th", {}, c))), rows);
}

export const pill = (text) => h("span", { class: `pill ${text}` }, text);

export function ago(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const t = Math.max(0, Math.round(seconds));
  if (t < 60) return `${t}s`;
  if (t < 3600) return `${Math.floor(t / 60)}m${String(t % 60).padStart(2, "0")}s`;
  return `${Math.floor(t / 3600)}h${String(Math.floor((t % 3600) / 60)).padStart(2, "0")}m`;
}

export const time = (iso) => (iso ? new Date(iso).toLocaleTimeString([], { hour12: false }) : "-");

// A line chart of `series` ([{name, color, values}]) over `xs` (seconds), with its own y scale each
// when `ymax` is not given.
export function lineChart(xs, series, { width = 560, height = 160, ymax } = {}) {
  const pad = { l: 36, r: 10, t: 10, b: 20 };
  const w = width - pad.l - pad.r;
  const hgt = height - pad.t - pad.b;
  const x0 = xs.length ? xs[0] : 0;
  const x1 = xs.length ? xs[xs.length - 1] : 1;
  const top = ymax ?? Math.max(1, ...series.flatMap((sr) => sr.values));
  const X = (x) => pad.l + (x1 > x0 ? ((x - x0) / (x1 - x0)) * w : w);
  const Y = (y) => pad.t + hgt - (y / top) * hgt;
  return s("svg", { width, height, class: "chart", viewBox: `0 0 ${width} ${height}` },
    s("line", { x1: pad.l, y1: Y(0), x2: pad.l + w, y2: Y(0), stroke: "#bbb" }),
    s("text", { x: 4, y: Y(top) + 4 }, String(Math.round(top))),
    s("text", { x: 4, y: Y(0) }, "0"),
    s("text", { x: pad.l + w - 60, y: height - 4 }, xs.length ? `${Math.round(x1 - x0)} s` : "no data yet"),
    series.map((sr) => s("polyline", {
      fill: "none", stroke: sr.color, "stroke-width": 2,
      points: sr.values.map((v, i) => `${X(xs[i]).toFixed(1)},${Y(v).toFixed(1)}`).join(" "),
    })));
}

// One horizontal bar split into parts ([{name, value, color}]).
export function stackedBar(parts, { width = 560, height = 22 } = {}) {
  const total = parts.reduce((a, p) => a + p.value, 0) || 1;
  let x = 0;
  return s("svg", { width, height, viewBox: `0 0 ${width} ${height}` }, parts.map((p) => {
    const w = (p.value / total) * width;
    const r = s("rect", { x, y: 0, width: w, height, fill: p.color }, s("title", {}, `${p.name}: ${p.value}`));
    x += w;
    return r;
  }));
}
