// The experiment's own logs: the dispatcher's and the tuner's lines about it (the last 1,000, then new
// ones as they are logged, from /api/experiments/<id>/logs/stream), with its search space and its config
// (secrets masked, as every API answer masks them).
//
// Opened by the overview's "Logs" button; the URL holds it (?logs=1, and ?logs=dispatcher or ?logs=tuner
// for one service's lines), so a link opens the same view. At most MAX_LINES lines are in the page.
//
// Hooks for tests: #logs-toggle, #logs-panel, #logs-lines li[data-service][data-level], #logs-service,
// #logs-search-space, #logs-config, #logs-problem; the performance mark "trialbus:logs" (first lines drawn).

import { h } from "./util.js";

const PARAM = "logs";
const MAX_LINES = 1000;

export class ExperimentLogs {
  constructor() {
    this.experiment = null;
    this.source = null;
    this.drawn = false;
    this.toggle = h("button", {
      id: "logs-toggle", type: "button", "aria-controls": "logs-panel", "aria-expanded": "false",
      onclick: () => this.show(this.panel.hidden ? "1" : null),
    }, "Logs");
    document.querySelector("#overview .title")?.append(this.toggle);
    this.service = h("select", { id: "logs-service", onchange: () => this.filter() },
      h("option", { value: "" }, "all"), h("option", { value: "dispatcher" }, "dispatcher"),
      h("option", { value: "tuner" }, "tuner"));
    this.count = h("span", { id: "logs-count", class: "muted" });
    this.problem = h("p", { id: "logs-problem", class: "error", role: "alert", hidden: true });
    this.lines = h("ol", { id: "logs-lines", class: "log lines", role: "log", "aria-label": "Log lines, oldest first",
      tabindex: "0" });
    this.space = h("pre", { id: "logs-search-space" });
    this.config = h("pre", { id: "logs-config" });
    this.panel = h("section", { id: "logs-panel", class: "panel", hidden: true, "aria-labelledby": "logs-title" },
      h("div", { class: "toolbar" }, h("h2", { id: "logs-title" }, "Logs"),
        h("label", {}, "Service ", this.service), this.count,
        h("span", { class: "muted" }, "the dispatcher's and the tuner's lines about this experiment (the last 1,000)")),
      this.problem, this.lines,
      h("details", { open: true }, h("summary", {}, "Search space"), this.space),
      h("details", {}, h("summary", {}, "Config (secrets masked)"), this.config));
    document.querySelector("#overview")?.after(this.panel);
  }

  /** The experiment's overview changed: its search space and config; the view opens as the URL says. */
  update(experiment) {
    const first = !this.experiment;
    this.experiment = experiment;
    const space = JSON.stringify(experiment.config?.searchSpace ?? null, null, 2);
    if (this.space.textContent !== space) this.space.textContent = space;
    const config = JSON.stringify(experiment.config, null, 2);
    if (this.config.textContent !== config) this.config.textContent = config;
    if (first) this.show(new URLSearchParams(location.search).get(PARAM));
  }

  /** ``which``: null hides the view; "1" shows every service's lines, a service's name only its lines. */
  show(which) {
    const open = which !== null && which !== undefined;
    this.panel.hidden = !open;
    this.toggle.setAttribute("aria-expanded", String(open));
    this.service.value = open && which !== "1" ? which : "";
    const url = new URL(location.href);
    if (open) url.searchParams.set(PARAM, this.service.value || "1");
    else url.searchParams.delete(PARAM);
    history.replaceState(history.state, "", url);
    if (open) this.follow();
    else this.stop();
    this.filter();
  }

  follow() {
    if (this.source || !this.experiment) return;
    const id = encodeURIComponent(this.experiment.id);
    this.source = new EventSource(`/api/experiments/${id}/logs/stream?lines=${MAX_LINES}`);
    this.source.addEventListener("lines", (event) => this.receive(JSON.parse(event.data)));
    this.source.addEventListener("problem", (event) => this.say(JSON.parse(event.data).error));
    this.source.onerror = () => this.say("the log stream was interrupted; reconnecting…");
  }

  stop() {
    this.source?.close();
    this.source = null;
  }

  say(message) {
    this.problem.textContent = message;
    this.problem.hidden = !message;
  }

  receive({ lines, history }) {
    this.say("");
    const atBottom = this.lines.scrollTop + this.lines.clientHeight >= this.lines.scrollHeight - 4;
    if (history) this.lines.replaceChildren();
    const wanted = this.service.value;
    for (const line of lines) {
      const item = h("li", { dataset: { service: line.service, level: line.level, seq: line.seq },
        hidden: Boolean(wanted && wanted !== line.service) },
      h("time", { datetime: line.time }, line.time.replace("T", " ").replace(/\+00:00$|Z$/, "")), " ",
      h("b", {}, line.service), " ", h("span", { class: "level" }, line.level), " ",
      line.trial ? h("code", {}, `trial ${line.trial} `) : null, line.message);
      this.lines.append(item);
    }
    while (this.lines.childElementCount > MAX_LINES) this.lines.firstElementChild.remove();
    if (atBottom || history) this.lines.scrollTop = this.lines.scrollHeight;
    const count = this.lines.childElementCount;
    this.count.textContent = `${count} line${count === 1 ? "" : "s"}`;
    if (!this.drawn) {
      this.drawn = true;
      performance.mark("trialbus:logs");
    }
  }

  /** Show only the lines of the service chosen (all: every line). O(lines in the page) = O(1,000). */
  filter() {
    const wanted = this.service.value;
    for (const item of this.lines.children) item.hidden = Boolean(wanted && wanted !== item.dataset.service);
    if (!this.panel.hidden) {
      const url = new URL(location.href);
      url.searchParams.set(PARAM, wanted || "1");
      history.replaceState(history.state, "", url);
    }
  }
}
