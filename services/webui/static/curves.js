// "Intermediate results of all trials": every trial's curve on one chart (a bounded set, chosen
// and cut down by the server: /api/experiments/<id>/intermediate), and a step filter that ranks
// the trials by their value at step k (which trials were ahead then), shown as a ranked table
// and highlighted on the chart. The step is in the URL (?step=k), so a link shows the same.
//
// Hooks for tests: #all-curves[data-series] (the trial ids drawn, comma-separated),
// [data-highlighted] (those highlighted, best first), [data-step]; #step-ranking tbody
// tr[data-ranked=<trial id>][data-rank]; the performance mark "trialbus:curves" (the first draw).
// No row here has data-trial-id: that names the trial table's rows.

import { drawChart } from "./chart.js";
import { api, formatNumber, h } from "./util.js";

export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#db2777", "#65a30d",
  "#4f46e5", "#b45309"];
const FAINT = "rgba(100, 116, 139, 0.35)";
const REFRESH_MS = 2000;
/** Trials highlighted on the chart: the best at the step asked for, else the best by latest result. */
const HIGHLIGHTED = PALETTE.length;
const $ = (selector) => document.querySelector(selector);

/** Set or remove one query parameter of the page's URL, keeping the rest (and the #hash). */
export function setParam(name, value) {
  const url = new URL(location.href);
  if (value === null || value === undefined || value === "") url.searchParams.delete(name);
  else url.searchParams.set(name, value);
  history.replaceState(null, "", url);
}

export class AllCurves {
  constructor() {
    this.canvas = $("#all-curves");
    this.experimentId = null;
    const step = new URLSearchParams(location.search).get("step");
    this.step = step !== null && /^\d+$/.test(step) ? Number(step) : null;
    this.timer = 0;
    this.last = 0;
    this.drawn = false;
    $("#step-input").value = this.step ?? "";
    $("#step-filter").addEventListener("submit", (event) => {
      event.preventDefault();
      const raw = $("#step-input").value.trim();
      this.setStep(raw === "" ? null : Number(raw));
    });
    $("#step-clear").addEventListener("click", () => {
      $("#step-input").value = "";
      this.setStep(null);
    });
  }

  /** Show this experiment's curves (a snapshot came). */
  show(experimentId) {
    if (experimentId === this.experimentId) return;
    this.experimentId = experimentId;
    this.load();
  }

  setStep(step) {
    this.step = Number.isInteger(step) && step >= 0 ? step : null;
    setParam("step", this.step);
    this.load();
  }

  /** Read the chart again, at most once per REFRESH_MS (trials changed). */
  schedule() {
    if (this.timer || !this.experimentId) return;
    this.timer = setTimeout(() => {
      this.timer = 0;
      this.load();
    }, Math.max(0, REFRESH_MS - (performance.now() - this.last)));
  }

  async load() {
    const id = this.experimentId;
    if (!id) return;
    this.last = performance.now();
    const points = Math.min(1000, Math.max(16, Math.round((this.canvas.clientWidth || 600) / 6)));
    const query = new URLSearchParams({ points: String(points) });
    if (this.step !== null) query.set("step", String(this.step));
    let body;
    try {
      body = await api("GET", `/api/experiments/${encodeURIComponent(id)}/intermediate?${query}`);
    } catch (error) {
      $("#curves-rule").textContent = error.message;
      return;
    }
    if (id !== this.experimentId) return;
    this.render(body);
  }

  render(body) {
    const name = (c) => (c.sequenceId === null || c.sequenceId === undefined ? c.trialId : `#${c.sequenceId} ${c.trialId}`);
    const highlighted = (body.step !== null ? body.ranking : body.curves).slice(0, HIGHLIGHTED).map((r) => r.trialId);
    const colour = new Map(highlighted.map((id, i) => [id, PALETTE[i]]));
    // The faint curves first, the highlighted on top of them, in rank order.
    const order = [...body.curves].sort((a, b) => (colour.has(a.trialId) ? 1 : 0) - (colour.has(b.trialId) ? 1 : 0)
      || highlighted.indexOf(a.trialId) - highlighted.indexOf(b.trialId));
    drawChart(this.canvas, {
      series: order.map((c) => ({
        points: c.points, kind: "line", dots: colour.has(c.trialId) && c.points.length < 60,
        color: colour.get(c.trialId) ?? FAINT, width: colour.has(c.trialId) ? 2.5 : 1,
        label: colour.has(c.trialId) ? name(c) : null,
      })),
      integerX: true,
      xLabel: "step",
      empty: "no intermediate results yet",
    });
    this.canvas.dataset.series = body.curves.map((c) => c.trialId).join(",");
    this.canvas.dataset.highlighted = highlighted.join(",");
    this.canvas.dataset.step = body.step === null ? "" : String(body.step);
    const what = body.step === null ? "the best by latest result highlighted"
      : `the best at step ${body.step} highlighted`;
    this.canvas.setAttribute("aria-label", `Intermediate results of ${body.curves.length} trials, ${what}; `
      + "the tables below hold the same");
    $("#curves-rule").textContent = body.reported
      ? `Showing ${body.rule}; ${what}.` : "No trial has reported an intermediate result yet.";
    this.renderRanking(body, name, colour);
    $("#curves-rows").replaceChildren(...body.curves.map((c) => h("tr", { dataset: { curve: c.trialId } },
      h("td", {}, name(c)), h("td", { class: "num" }, String(c.steps)), h("td", { class: "num" }, formatNumber(c.latest)))));
    if (!this.drawn) {
      this.drawn = true;
      performance.mark("trialbus:curves");
    }
  }

  renderRanking(body, name, colour) {
    const wrap = $("#step-ranking-wrap");
    wrap.hidden = body.step === null;
    if (body.step === null) return;
    $("#step-ranking-title").textContent = body.ranking.length
      ? `Ahead at step ${body.step} (${body.optimizeMode}): the best ${body.ranking.length} of ${body.rankedOf} trials `
        + "that reported that step"
      : `No trial reported step ${body.step}.`;
    $("#step-ranking tbody").replaceChildren(...body.ranking.map((r) => h("tr", {
      dataset: { ranked: r.trialId, rank: String(r.rank) },
    },
    h("td", { class: "num" }, String(r.rank)),
    h("td", {}, swatch(colour.get(r.trialId) ?? FAINT), name(r)),
    h("td", { class: "num" }, formatNumber(r.value)),
    h("td", { class: "num" }, formatNumber(r.latest)))));
  }
}

/** A small square of a series' colour (set through CSSOM: the page's CSP allows no style attribute). */
export function swatch(colour) {
  const element = h("span", { class: "swatch", "aria-hidden": "true" });
  element.style.background = colour;
  return element;
}
