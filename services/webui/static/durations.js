// The "Durations" view: a histogram of the ended trials' durations in SVG, from
// GET /api/experiments/<id>/durations (services/webui/durations.py: the server bins them, so the
// page gets some twenty counts whatever the experiment's size), and its table equivalent.
//
// Hooks for tests: svg#dur-chart[data-count], rect.bar[data-count]; #dur-table tbody tr[data-count].

import { formatDuration, h } from "./util.js";

const SVG = "http://www.w3.org/2000/svg";
const MARGIN = { left: 44, right: 12, top: 12, bottom: 34 };

function s(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(name, String(value));
  }
  for (const child of children) element.append(child instanceof Node ? child : String(child));
  return element;
}

const range = (bin) => `${formatDuration(bin.from)} – ${formatDuration(bin.to)}`;

/** Draw the histogram into `svg`, its table into `table`, its summary into `summary`. */
export function drawDurations(svg, table, summary, histogram) {
  const width = Math.max(320, svg.clientWidth || 900), height = Math.max(160, svg.clientHeight || 240);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.dataset.count = String(histogram.count);
  const running = histogram.running ? `; ${histogram.running} running (shown once they end)` : "";
  summary.textContent = histogram.count
    ? `${histogram.count} ended trials: median ${formatDuration(histogram.median)}, 90 % under `
      + `${formatDuration(histogram.p90)}, longest ${formatDuration(histogram.max)}${running}`
    : `no trial has ended yet${running}`;
  const bins = histogram.bins;
  const most = Math.max(1, ...bins.map((b) => b.count));
  const plot = { x: MARGIN.left, y: MARGIN.top, w: width - MARGIN.left - MARGIN.right,
    h: height - MARGIN.top - MARGIN.bottom };
  const barWidth = bins.length ? plot.w / bins.length : 0;
  const bars = bins.map((bin, i) => {
    const tall = (bin.count / most) * plot.h;
    return s("rect", { class: "bar", x: plot.x + i * barWidth + 1, y: plot.y + plot.h - tall,
      width: Math.max(1, barWidth - 2), height: tall, dataset: { count: bin.count } },
    s("title", {}, `${range(bin)}: ${bin.count} trials`));
  });
  const labels = bins.length ? [
    s("text", { class: "tick", x: plot.x, y: height - 14 }, formatDuration(bins[0].from)),
    s("text", { class: "tick", x: plot.x + plot.w, y: height - 14, "text-anchor": "end" },
      formatDuration(bins.at(-1).to)),
    s("text", { class: "tick", x: plot.x - 6, y: plot.y + 8, "text-anchor": "end" }, most),
    s("text", { class: "tick", x: plot.x - 6, y: plot.y + plot.h, "text-anchor": "end" }, 0),
  ] : [];
  svg.replaceChildren(s("line", { class: "base", x1: plot.x, x2: plot.x + plot.w, y1: plot.y + plot.h,
    y2: plot.y + plot.h }), ...bars, ...labels);
  table.replaceChildren(h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Duration"),
    h("th", { scope: "col" }, "Trials"))),
  h("tbody", {}, bins.map((bin) => h("tr", { dataset: { count: bin.count } }, h("td", {}, range(bin)),
    h("td", { class: "num" }, bin.count)))));
}
