// "Compare trials": rows checked in the trial table (table.js: a checkbox per row, Space toggles
// it) are compared side by side: their intermediate curves overlaid on one chart (a colour per
// trial, a legend) and a table with a column per trial and a row per fact and parameter, the
// rows whose values differ highlighted. The open comparison is in the URL (?compare=id1,id2),
// so a link (or a reload) shows the same; while it is open it follows the checkboxes.
//
// Hooks for tests: #compare-open, #compare[hidden], #compare-chart[data-series] (trial ids
// drawn), #compare-table th[data-compared=<trial id>], #compare-table tr[data-row][.differs] with one
// td[data-compared] per trial (no data-trial-id: that names the trial table's rows).

import { drawChart } from "./chart.js";
import { PALETTE, setParam, swatch } from "./curves.js";
import { api, formatDuration, formatMetric, formatNumber, formatParameter, h, secondsBetween, toast } from "./util.js";

/** The most trials compared at once (the server's limit too). */
export const MAX_COMPARED = 20;
const $ = (selector) => document.querySelector(selector);

export class Compare {
  /** table: the TrialTable, whose checked rows are the selection. */
  constructor(table) {
    this.table = table;
    this.experimentId = null;
    this.panel = $("#compare");
    const asked = (new URLSearchParams(location.search).get("compare") ?? "").split(",").filter(Boolean);
    this.pending = asked.length ? asked.slice(0, MAX_COMPARED) : null; // opened once the experiment is known
    table.setChecked(asked);
    this.button = $("#compare-open");
    this.button.addEventListener("click", () => this.open());
    $("#compare-close").addEventListener("click", () => this.close());
    $("#compare-clear").addEventListener("click", () => {
      this.table.setChecked([]);
      this.changed();
    });
    this.changed();
  }

  /** The experiment shown (a snapshot came): open the comparison the URL asked for. */
  show(experimentId) {
    if (experimentId === this.experimentId) return;
    if (this.experimentId !== null) { // the page moved to another experiment: its trials are not these
      this.table.setChecked([]);
      this.changed();
      this.close();
    }
    this.experimentId = experimentId;
    if (this.pending) {
      this.pending = null;
      this.open();
    }
  }

  /** The checked rows changed. */
  changed() {
    const count = this.table.checked.size;
    this.button.disabled = count < 2 || count > MAX_COMPARED;
    this.button.textContent = count ? `Compare ${count} selected` : "Compare selected";
    this.button.title = count > MAX_COMPARED ? `at most ${MAX_COMPARED} trials at once` : "check two or more rows";
    $("#compare-clear").hidden = count === 0;
    if (!this.panel.hidden) {
      if (count) this.open(false);
      else this.close();
    }
  }

  async open(focus = true) {
    const ids = [...this.table.checked].slice(0, MAX_COMPARED);
    const experimentId = this.experimentId;
    if (!ids.length || !experimentId) return;
    setParam("compare", ids.join(","));
    let body;
    try {
      const query = new URLSearchParams({ trials: ids.join(","), points: "200" });
      body = await api("GET", `/api/experiments/${encodeURIComponent(experimentId)}/compare?${query}`);
    } catch (error) {
      toast(error.message, true);
      return;
    }
    if (experimentId !== this.experimentId) return;
    this.panel.hidden = false;
    this.render(body);
    if (focus) {
      this.panel.scrollIntoView({ block: "nearest" });
      $("#compare-title").focus();
    }
  }

  close() {
    this.panel.hidden = true;
    setParam("compare", null);
  }

  render(body) {
    const trials = body.trials;
    const name = (t) => `#${t.sequenceId} ${t.id}`;
    const colour = (i) => PALETTE[i % PALETTE.length];
    const canvas = $("#compare-chart");
    drawChart(canvas, {
      series: trials.map((t, i) => ({
        points: t.curve?.points ?? [], kind: "line", color: colour(i), label: name(t), width: 2,
      })),
      integerX: true,
      empty: "none of these trials reported an intermediate result",
    });
    canvas.dataset.series = trials.map((t) => t.id).join(",");
    canvas.setAttribute("aria-label", `Intermediate results of trials ${trials.map(name).join(", ")}; `
      + "the table below compares them");
    $("#compare-missing").textContent = body.missing.length
      ? `Not in this experiment (removed, or mistyped in the link): ${body.missing.join(", ")}` : "";
    const facts = [
      ["status", "Status", (t) => t.status],
      ["final", "Final metric", (t) => formatMetric(t.finalMetric)],
      ["duration", "Duration", (t) => formatDuration(secondsBetween(t.startTime, t.endTime))],
      ["intermediate", "Intermediate results", (t) => String(t.intermediateCount)],
      ["latest", "Latest intermediate", (t) => formatNumber(t.curve?.latest ?? null)],
    ];
    const parameters = [...new Set(trials.flatMap((t) => Object.keys(t.parameters ?? {})))].sort();
    const rows = [
      ...facts.map(([key, title, text]) => [key, title, trials.map(text), false]),
      ...parameters.map((p) => [`parameter:${p}`, p, trials.map((t) => formatParameter(t.parameters?.[p])), true]),
    ];
    $("#compare-table thead").replaceChildren(h("tr", {}, h("th", { scope: "col" }, "Trial"),
      trials.map((t, i) => h("th", { scope: "col", dataset: { compared: t.id } }, swatch(colour(i)), name(t)))));
    $("#compare-table tbody").replaceChildren(...rows.map(([key, title, texts, parameter]) => {
      const differs = new Set(texts).size > 1;
      return h("tr", { dataset: { row: key }, class: [differs ? "differs" : "", parameter ? "parameter" : ""]
        .filter(Boolean).join(" ") || null },
      h("th", { scope: "row" }, title, differs ? h("span", { class: "visually-hidden" }, " (differs)") : null),
      texts.map((text, i) => h("td", { dataset: { compared: trials[i].id } }, text)));
    }));
  }
}
