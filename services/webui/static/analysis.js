// The experiment page's analysis: the "Top trials" table of the overview, and two views under
// tabs, "Hyper-parameters" (parallel coordinates, hparams.js) and "Durations" (durations.js).
// Each is read from the server, aggregated there (never a row per trial of the experiment),
// again at most every REFRESH_MS while trials change (app.js calls `changed`).
//
// The view's state is in the URL's query string, so a link shows a colleague the same thing:
// analysis=hparams|durations (the tab), top=<1–100> (the top N % shown), axes=<a,b,…> (the
// axis order, changed with ← → on an axis' name), best=<K> (the rows of "Top trials").
//
// Hooks for tests: #top-trials tbody tr[data-top-trial][data-rank]; #hp-top, #hp-rule, #hp-chart,
// #hp-table; #dur-chart, #dur-table; the performance mark "trialbus:hparams" (the parallel
// coordinates' first draw).

import { drawDurations } from "./durations.js";
import { drawParallel, parallelTable } from "./hparams.js";
import { api, defaultMetric, formatMetric, formatParameter, h } from "./util.js";

const REFRESH_MS = 3000;
const VIEWS = ["hparams", "durations"];
const TOPS = [100, 50, 20, 10, 5, 1];
const BESTS = [5, 10, 20, 50];
const $ = (selector) => document.querySelector(selector);

function whole(raw, low, high, fallback) {
  const n = Number(raw);
  return raw !== null && Number.isInteger(n) && n >= low && n <= high ? n : fallback;
}

export class Analysis {
  constructor({ onOpen }) {
    this.onOpen = onOpen;
    this.experiment = null;
    this.timer = 0;
    this.last = -Infinity;
    this.hparams = null;
    this.marked = false;
    const params = new URLSearchParams(location.search);
    this.view = VIEWS.includes(params.get("analysis")) ? params.get("analysis") : "hparams";
    this.top = whole(params.get("top"), 1, 100, 100);
    this.best = whole(params.get("best"), 1, 100, 10);
    this.order = params.get("axes") ? params.get("axes").split(",").map(decodeURIComponent) : null;
    const options = (values, chosen, text) => [...new Set([...values, chosen])].sort((a, b) => b - a)
      .map((v) => h("option", { value: v, selected: v === chosen }, text(v)));
    $("#hp-top").replaceChildren(...options(TOPS, this.top, (v) => (v === 100 ? "all trials" : `top ${v} %`)));
    $("#hp-top").addEventListener("change", (event) => { this.top = Number(event.target.value); this.save(); this.now(); });
    $("#top-trials-count").replaceChildren(...options(BESTS, this.best, String).reverse());
    $("#top-trials-count").addEventListener("change", (event) => {
      this.best = Number(event.target.value);
      this.save();
      this.now();
    });
    const tabs = [...document.querySelectorAll("#analysis [role='tab']")];
    for (const tab of tabs) {
      tab.addEventListener("click", () => this.show(tab.dataset.view, true));
      tab.addEventListener("keydown", (event) => {
        const by = { ArrowLeft: -1, ArrowRight: 1 }[event.key];
        if (!by) return;
        const next = tabs[(tabs.indexOf(tab) + by + tabs.length) % tabs.length];
        next.focus();
        this.show(next.dataset.view, true);
      });
    }
    $("#hp-table-details").addEventListener("toggle", () => this.drawTable());
    // Drawn at the chart's size: again when it changes, and first when the experiment is shown.
    new ResizeObserver(() => this.hparams && this.drawHparams()).observe($("#hp-chart"));
    this.show(this.view, false);
    // An experiment's own page knows its id before the event stream's snapshot: read at once.
    const match = location.pathname.match(/^\/experiments\/([^/]+)$/);
    if (match) this.changed({ id: decodeURIComponent(match[1]) });
  }

  /** The experiment's trials changed (or another experiment is shown): read again, throttled. */
  changed(experiment) {
    const other = experiment?.id !== this.experiment?.id;
    this.experiment = experiment;
    if (other) this.now();
    else this.schedule();
  }

  schedule() {
    if (this.timer) return;
    this.timer = setTimeout(() => this.now(), Math.max(0, REFRESH_MS - (performance.now() - this.last)));
  }

  now() {
    clearTimeout(this.timer);
    this.timer = 0;
    this.last = performance.now();
    if (!this.experiment) return;
    this.loadTopTrials();
    if (this.view === "hparams") this.loadHparams();
    else this.loadDurations();
  }

  show(view, user) {
    this.view = view;
    for (const tab of document.querySelectorAll("#analysis [role='tab']")) {
      const chosen = tab.dataset.view === view;
      tab.setAttribute("aria-selected", String(chosen));
      tab.tabIndex = chosen ? 0 : -1;
      $(`#${tab.getAttribute("aria-controls")}`).hidden = !chosen;
    }
    if (user) {
      this.save();
      this.now();
    }
  }

  /** The state in the query string (the hash, which opens a trial, is kept). */
  save() {
    const url = new URL(location.href);
    const set = (name, value, fallback) => (value === fallback || value === null
      ? url.searchParams.delete(name) : url.searchParams.set(name, value));
    set("analysis", this.view, "hparams");
    set("top", this.top, 100);
    set("best", this.best, 10);
    set("axes", this.order ? this.order.map(encodeURIComponent).join(",") : null, null);
    history.replaceState(history.state, "", url);
  }

  url(path, query) {
    return `/api/experiments/${encodeURIComponent(this.experiment.id)}/${path}?${new URLSearchParams(query)}`;
  }

  async loadHparams() {
    const id = this.experiment.id;
    let view;
    try {
      view = await api("GET", this.url("hyper-parameters", { top: this.top }));
    } catch (error) {
      $("#hp-rule").textContent = error.message;
      return;
    }
    if (this.experiment?.id !== id || this.view !== "hparams") return;
    this.hparams = view;
    this.drawHparams();
  }

  drawHparams() {
    const view = this.hparams;
    $("#hp-rule").textContent = view.rule;
    if (!$("#hp-chart").clientWidth) return; // hidden: drawn when shown (the ResizeObserver)
    this.order = drawParallel($("#hp-chart"), view, {
      order: this.order,
      onOpen: this.onOpen,
      onMove: (name, by) => {
        const at = this.order.indexOf(name), to = at + by;
        if (to < 0 || to >= this.order.length) return;
        [this.order[at], this.order[to]] = [this.order[to], this.order[at]];
        this.save();
        this.drawHparams();
        $(`#hp-chart g.axis[data-axis="${CSS.escape(name)}"] text.name`)?.focus();
      },
    });
    this.drawTable();
    if (!this.marked) {
      this.marked = true;
      performance.mark("trialbus:hparams");
    }
  }

  drawTable() {
    if ($("#hp-table-details").open && this.hparams) parallelTable($("#hp-table"), this.hparams, this.onOpen);
  }

  async loadDurations() {
    const id = this.experiment.id;
    let histogram;
    try {
      histogram = await api("GET", this.url("durations", { bins: 20 }));
    } catch (error) {
      $("#dur-summary").textContent = error.message;
      return;
    }
    if (this.experiment?.id !== id || this.view !== "durations") return;
    drawDurations($("#dur-chart"), $("#dur-table"), $("#dur-summary"), histogram);
  }

  /** The best K trials by final metric: the trial table's window sorted by metric (best first). */
  async loadTopTrials() {
    const id = this.experiment.id;
    let window;
    try {
      window = await api("GET", this.url("trials", { sort: "metric", limit: this.best }));
    } catch {
      return; // the next change asks again
    }
    if (this.experiment?.id !== id) return;
    const trials = window.trials.filter((t) => defaultMetric(t.finalMetric) !== null);
    const names = [...new Set(trials.flatMap((t) => Object.keys(t.parameters ?? {})))];
    const open = (trialId) => (event) => { event.preventDefault(); this.onOpen(trialId); };
    $("#top-trials").replaceChildren(
      h("thead", {}, h("tr", {}, ["#", "Trial", "Final metric", "Status", ...names]
        .map((text) => h("th", { scope: "col" }, text)))),
      h("tbody", {}, trials.map((t, rank) => h("tr", { dataset: { topTrial: t.id, rank: rank + 1 } },
        h("td", { class: "num" }, rank + 1),
        h("td", {}, h("a", { href: `#trial=${encodeURIComponent(t.id)}`, onclick: open(t.id) },
          `${t.sequenceId} (${t.id})`)),
        h("td", { class: "num" }, formatMetric(t.finalMetric)),
        h("td", { dataset: { status: t.status }, class: "status" }, t.status),
        ...names.map((n) => h("td", {}, formatParameter(t.parameters?.[n])))))),
    );
    $("#top-trials-empty").hidden = trials.length > 0;
  }
}
