// The "Hyper-parameters" view: a parallel-coordinates chart in SVG, drawn here from what
// GET /api/experiments/<id>/hyper-parameters answers (services/webui/hparams.py): one vertical
// axis per parameter (a nested choice's `opt/_name`, `opt/lr`, …) and the final metric last,
// one line per trial shown, coloured by its metric (light: worse, dark: better). A numeric axis
// is linear or log, a categorical axis spaces its categories evenly; a trial without a value on
// an axis (a branch of a nested choice it did not take) passes through the axis' "absent" place
// below it. The server sends at most 2,000 lines, so the SVG holds at most that many paths.
//
// Hooks for tests: svg[data-lines], path.line[data-trial-id][data-metric], g.axis[data-axis];
// the table equivalent's rows tr[data-line-trial] (data-trial-id is the trial table's rows').

import { formatNumber, formatParameter, h } from "./util.js";

const SVG = "http://www.w3.org/2000/svg";
const MARGIN = { left: 50, right: 70, top: 34, bottom: 40 };
const ABSENT_GAP = 22;
const WORSE = [198, 219, 239], BETTER = [8, 48, 107];

function s(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null) continue;
    if (name === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(name, String(value));
  }
  for (const child of children) element.append(child instanceof Node ? child : String(child));
  return element;
}

/** A function from an axis value to a y (pixels), and the axis' ticks [value, label]. */
function scaleOf(axis, top, bottom) {
  const absent = bottom + ABSENT_GAP;
  if (axis.kind === "categorical") {
    const n = axis.categories.length;
    const at = (i) => (n <= 1 ? (top + bottom) / 2 : bottom - (i / (n - 1)) * (bottom - top));
    const every = Math.max(1, Math.ceil(n / Math.max(2, (bottom - top) / 14)));
    const ticks = axis.categories.map((c, i) => [i, formatParameter(c)]).filter(([i]) => i % every === 0);
    return { y: (v) => (v === null ? absent : at(v)), ticks };
  }
  const log = axis.scale === "log" && axis.low > 0;
  const f = log ? Math.log10 : (v) => v;
  let low = axis.low ?? 0, high = axis.high ?? 1;
  if (low === high) { low = log ? low / 2 : low - 1; high = log ? high * 2 : high + 1; }
  const a = f(low), b = f(high);
  const y = (v) => (v === null || (log && v <= 0) ? absent : bottom - ((f(v) - a) / (b - a)) * (bottom - top));
  const ticks = (log ? [low, Math.sqrt(low * high), high] : [low, (low + high) / 2, high])
    .map((v) => [v, formatNumber(Number(v.toPrecision(3)))]);
  return { y, ticks };
}

/** The metric's colour: t = 0 the worst shown, 1 the best. */
function colour(t) {
  const c = WORSE.map((w, i) => Math.round(w + (BETTER[i] - w) * t));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

/**
 * Draw `view` into `svg`, axes in `order` (names; the server's order without it). `onOpen(id)`
 * is called when a line is clicked, `onMove(name, by)` when an axis' name has the focus and
 * ← or → is pressed (by = -1, 1). Returns the axis names in the order drawn.
 */
export function drawParallel(svg, view, { order, onOpen, onMove }) {
  const byName = new Map(view.axes.map((axis, i) => [axis.name, { axis, i }]));
  const names = [...(order ?? []).filter((n) => byName.has(n)), ...view.axes.map((a) => a.name)
    .filter((n) => !(order ?? []).includes(n))];
  const axes = names.map((n) => byName.get(n));
  const width = Math.max(320, svg.clientWidth || 900), height = Math.max(220, svg.clientHeight || 360);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const top = MARGIN.top, bottom = height - MARGIN.bottom - ABSENT_GAP;
  const step = axes.length > 1 ? (width - MARGIN.left - MARGIN.right) / (axes.length - 1) : 0;
  const xs = axes.map((_, k) => MARGIN.left + k * step);
  const scales = axes.map(({ axis }) => scaleOf(axis, top, bottom));
  const metric = view.axes.length - 1; // the metric is the server's last axis
  const low = view.axes[metric].low, high = view.axes[metric].high;
  const better = (m) => (high === low ? 1 : (view.optimizeMode === "minimize" ? high - m : m - low) / (high - low));

  const lines = s("g", { class: "lines", "aria-hidden": "true" }); // the table below is their equivalent
  for (const line of [...view.lines].reverse()) { // the best drawn last, on top
    const ys = axes.map(({ i }, k) => scales[k].y(i === metric ? line.metric : line.values[i]));
    const d = ys.map((y, k) => `${k ? "L" : "M"}${xs[k].toFixed(1)},${y.toFixed(1)}`).join("");
    const path = s("path", { class: "line", d, stroke: colour(better(line.metric)),
      dataset: { trialId: line.id, sequence: line.sequence, metric: line.metric } },
    s("title", {}, `trial ${line.sequence} (${line.id}): ${formatNumber(line.metric)}`));
    lines.append(path);
  }
  lines.addEventListener("click", (event) => {
    const id = event.target.closest?.("path.line")?.dataset.trialId;
    if (id) onOpen(id);
  });
  const drawn = axes.map(({ axis }, k) => s("g", { class: "axis", dataset: { axis: axis.name } },
    s("line", { x1: xs[k], x2: xs[k], y1: top, y2: bottom }),
    s("text", { class: "name", x: xs[k], y: top - 14, "text-anchor": "middle", tabindex: 0, role: "button",
      "aria-label": `axis ${axis.name}: press the left or right arrow to move it` }, axis.name),
    ...scales[k].ticks.map(([v, text]) => s("text", { class: "tick", x: xs[k] - 5, y: scales[k].y(v) + 4,
      "text-anchor": "end" }, text)),
    axis.absent ? s("text", { class: "tick absent", x: xs[k] - 5, y: bottom + ABSENT_GAP + 4, "text-anchor": "end" },
      "absent") : ""));
  svg.onkeydown = (event) => {
    const name = event.target.closest?.("g.axis")?.dataset.axis;
    const by = { ArrowLeft: -1, ArrowRight: 1 }[event.key];
    if (name && by) {
      event.preventDefault();
      onMove(name, by);
    }
  };
  svg.replaceChildren(lines, ...drawn);
  svg.dataset.lines = String(view.lines.length);
  svg.dataset.axes = names.join("|");
  return names;
}

/** The chart's table equivalent: one row per line shown, best first, each trial a link. */
export function parallelTable(table, view, onOpen) {
  const metric = view.axes.length - 1;
  const head = h("tr", {}, h("th", {}, "Rank"), h("th", {}, "Trial"), h("th", {}, "Final metric"),
    ...view.axes.slice(0, metric).map((a) => h("th", { scope: "col" }, a.name)));
  const value = (axis, v) => (v === null ? "absent" : axis.kind === "categorical" ? formatParameter(axis.categories[v])
    : formatNumber(v));
  const rows = view.lines.map((line, rank) => h("tr", { dataset: { lineTrial: line.id } },
    h("td", { class: "num" }, rank + 1),
    h("td", {}, h("a", { href: `#trial=${encodeURIComponent(line.id)}`,
      onclick: (event) => { event.preventDefault(); onOpen(line.id); } }, `${line.sequence} (${line.id})`)),
    h("td", { class: "num" }, formatNumber(line.metric)),
    ...view.axes.slice(0, metric).map((a, i) => h("td", {}, value(a, line.values[i])))));
  table.replaceChildren(h("thead", {}, head), h("tbody", {}, rows));
}
