// A small line/scatter chart on <canvas>: axes with round ticks, dots, lines and steps.
// drawChart(canvas, options) draws and sets canvas.dataset.points to the number of data
// points drawn, canvas.dataset.max to the highest of them and canvas.dataset.lastX to the last
// x (hooks for tests; steps and series marked `counted: false` are left out); the canvas
// redraws itself when its size changes.

const MARGIN = { left: 58, right: 14, top: 22, bottom: 30 };
const last = new WeakMap();
const observer = typeof ResizeObserver === "function"
  ? new ResizeObserver((entries) => {
    for (const entry of entries) {
      const options = last.get(entry.target);
      if (options) draw(entry.target, options);
    }
  })
  : null;

/**
 * options: {
 *   series: [{ points: [[x, y], …], kind: "dots" | "line" | "step", color, label, counted,
 *              width (line width, px), dots (false: a line without its points) }],
 *   time: true when x is a time in ms, xLabel, yLabel, empty: text shown without data
 * }
 */
export function drawChart(canvas, options) {
  if (!last.has(canvas) && observer) observer.observe(canvas);
  last.set(canvas, options);
  draw(canvas, options);
}

function draw(canvas, options) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
  }
  const context = canvas.getContext("2d");
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  context.clearRect(0, 0, width, height);
  const style = getComputedStyle(canvas);
  const ink = style.color || "#222", faint = style.getPropertyValue("--grid").trim() || "#e4e7ec";
  context.font = "11px system-ui, sans-serif";

  const data = options.series.filter((s) => s.kind !== "step" && s.counted !== false);
  const points = data.reduce((n, s) => n + s.points.length, 0);
  canvas.dataset.points = String(points);
  canvas.dataset.lastX = String(data.reduce((m, s) => (s.points.length ? Math.max(m, s.points.at(-1)[0]) : m), -Infinity));
  canvas.dataset.max = points ? String(data.reduce((m, s) => s.points.reduce((n, p) => Math.max(n, p[1]), m), -Infinity))
    : "";
  const all = options.series.flatMap((s) => s.points);
  if (!all.length || width < MARGIN.left + MARGIN.right + 10) {
    context.fillStyle = ink;
    context.textAlign = "center";
    context.fillText(options.empty ?? "no data yet", width / 2, height / 2);
    return;
  }
  // A lone time is widened by a minute, not by a share of its value (years, for ms since 1970).
  const xs = range(all.map((p) => p[0]), options.time ? 60_000 : null), ys = range(all.map((p) => p[1]));
  const plot = { x: MARGIN.left, y: MARGIN.top, w: width - MARGIN.left - MARGIN.right,
    h: height - MARGIN.top - MARGIN.bottom };
  const sx = (x) => plot.x + ((x - xs.min) / (xs.max - xs.min)) * plot.w;
  const sy = (y) => plot.y + plot.h - ((y - ys.min) / (ys.max - ys.min)) * plot.h;

  axes(context, plot, xs, ys, sx, sy, options, ink, faint);
  for (const series of options.series) {
    context.strokeStyle = context.fillStyle = series.color;
    context.lineWidth = series.width ?? 1.5;
    if (series.kind === "line" || series.kind === "step") {
      context.beginPath();
      series.points.forEach(([x, y], i) => {
        if (i === 0) context.moveTo(sx(x), sy(y));
        else {
          if (series.kind === "step") context.lineTo(sx(x), sy(series.points[i - 1][1]));
          context.lineTo(sx(x), sy(y));
        }
      });
      if (series.kind === "step" && series.points.length) context.lineTo(plot.x + plot.w, sy(series.points.at(-1)[1]));
      context.stroke();
    }
    if (series.kind === "dots" || (series.kind === "line" && series.dots !== false && series.points.length < 200)) {
      for (const [x, y] of series.points) {
        context.beginPath();
        context.arc(sx(x), sy(y), series.kind === "dots" ? 3 : 2, 0, 2 * Math.PI);
        context.fill();
      }
    }
  }
  legend(context, options.series, plot, ink);
}

/** The span of the values, widened a little (and made non-empty, by `flat` if given) so that points sit inside. */
function range(values, flat = null) {
  let min = Infinity, max = -Infinity; // not Math.min(...values): a spread of 100,000 overflows the stack
  for (const value of values) {
    if (value < min) min = value;
    if (value > max) max = value;
  }
  if (min === max) {
    const pad = flat ?? (Math.abs(min) * 0.05 || 1);
    return { min: min - pad, max: max + pad };
  }
  const pad = (max - min) * 0.04;
  return { min: min - pad, max: max + pad };
}

/** About `count` round tick values between min and max (1, 2 or 5 times a power of ten). */
function ticks(min, max, count) {
  const raw = (max - min) / count, power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? 10 * power;
  const values = [];
  for (let v = Math.ceil(min / step) * step; v <= max; v += step) values.push(Number(v.toPrecision(12)));
  return values;
}

function timeTicks(min, max, count) {
  const steps = [0.1, 0.2, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 86400].map((s) => s * 1000);
  const step = steps.find((s) => (max - min) / s <= count) ?? (max - min) / count;
  const values = [];
  for (let v = Math.ceil(min / step) * step; v <= max; v += step) values.push(v);
  return { values, step };
}

function timeLabel(ms, step) {
  const options = { hour: "2-digit", minute: "2-digit", second: "2-digit" };
  if (step < 1000) options.fractionalSecondDigits = step < 100 ? 2 : 1;
  if (step >= 86400 * 1000) return new Date(ms).toLocaleDateString();
  return new Date(ms).toLocaleTimeString([], options);
}

function label(value) {
  const abs = Math.abs(value);
  if (abs !== 0 && (abs >= 1e5 || abs < 1e-3)) return value.toExponential(1);
  return String(Number(value.toPrecision(4)));
}

function axes(context, plot, xs, ys, sx, sy, options, ink, faint) {
  context.lineWidth = 1;
  context.fillStyle = ink;
  context.textAlign = "right";
  context.textBaseline = "middle";
  for (const y of ticks(ys.min, ys.max, Math.max(2, Math.floor(plot.h / 40)))) {
    context.strokeStyle = faint;
    context.beginPath();
    context.moveTo(plot.x, sy(y));
    context.lineTo(plot.x + plot.w, sy(y));
    context.stroke();
    context.fillText(label(y), plot.x - 6, sy(y));
  }
  context.textAlign = "center";
  context.textBaseline = "top";
  const count = Math.max(2, Math.floor(plot.w / 100));
  const time = options.time ? timeTicks(xs.min, xs.max, count) : null;
  for (const x of time ? time.values : ticks(xs.min, xs.max, count)) {
    if (!time && !Number.isInteger(x) && options.integerX) continue;
    context.fillText(time ? timeLabel(x, time.step) : label(x), sx(x), plot.y + plot.h + 6);
  }
  context.strokeStyle = ink;
  context.beginPath();
  context.moveTo(plot.x, plot.y);
  context.lineTo(plot.x, plot.y + plot.h);
  context.lineTo(plot.x + plot.w, plot.y + plot.h);
  context.stroke();
  if (options.yLabel) {
    context.textAlign = "left";
    context.fillText(options.yLabel, plot.x, 4);
  }
}

function legend(context, series, plot, ink) {
  let x = plot.x + plot.w;
  context.textBaseline = "top";
  context.textAlign = "right";
  for (const s of [...series].reverse()) {
    if (!s.label) continue;
    context.fillStyle = ink;
    context.fillText(s.label, x, 4);
    x -= context.measureText(s.label).width + 6;
    context.fillStyle = s.color;
    context.fillRect(x - 10, 7, 10, 4);
    x -= 22;
  }
}
