// The selected trial: its intermediate-metric curve (live), final metric, attempts, log
// tail, platform link, and cancel and retry buttons.
//
// The curve comes from its own event stream (/api/trials/<id>/metrics/stream?points=<n>, n
// about twice the canvas's width): the trial's metric history first, then each new record;
// the server batches them, and once an attempt reported more than n results it sends the
// whole curve cut down to n points, lowest and highest of each run kept (a "curve" event,
// which replaces what was drawn). The canvas is redrawn at most once per animation frame. Each attempt of a retried trial
// numbers its intermediate results from 0 again, so records are kept per attempt and drawn
// as one line each: the current attempt's in colour (its final as a dot), the earlier ones
// grey behind it. The log is fetched when the panel opens, on "Refresh", and every few
// seconds while the trial runs.
//
// Hooks for tests: #trial-curve[data-points] (the current attempt's intermediate points),
// #trial-curve[data-attempt] (the attempt drawn in colour), #trial-curve[data-lines],
// #detail-status, #detail-final, #detail-attempt, #detail-log, #detail-log[data-attempt] (the
// attempt whose log is shown: "" for the current one), #detail-retry,
// #detail-attempts tbody[data-attempt] td[data-field], and its button.log (that attempt's log).

import { drawChart } from "./chart.js";
import {
  ACTIVE, api, defaultMetric, formatDuration, formatMetric, formatNumber, formatTime, h, oncePerFrame, secondsBetween,
  toast,
} from "./util.js";

const LOG_EVERY_MS = 5000;
const CURRENT_COLOR = "#2563eb";
const EARLIER_COLORS = ["#9ca3af", "#cbd5e1"];

export class TrialDetail {
  /** onCancel(id), onRetry(id) (a promise): what the panel's buttons do; onClose(). */
  constructor(panel, { onCancel, onRetry, onClose }) {
    this.logAttempt = null; // the attempt whose log is shown; null: the current one
    this.panel = panel;
    this.onCancel = onCancel;
    this.onRetry = onRetry;
    this.onClose = onClose;
    this.trial = null;
    this.curves = new Map(); // attempt → { points: [[sequence, value], …], final }
    this.experimentRunning = true;
    this.attemptsKey = null;
    this.source = null;
    this.scheduleDraw = oncePerFrame(() => this.draw());
    this.logTimer = 0;
    this.canvas = panel.querySelector("#trial-curve");
    this.retryButton = panel.querySelector("#detail-retry");
    panel.querySelector("#detail-close").addEventListener("click", () => this.close());
    panel.querySelector("#detail-cancel").addEventListener("click", () => this.trial && this.onCancel(this.trial.id));
    this.retryButton.addEventListener("click", () => this.retry());
    panel.querySelector("#log-refresh").addEventListener("click", () => this.loadLog());
    panel.querySelector("#log-current").addEventListener("click", () => this.showLog(null));
  }

  get id() {
    return this.trial?.id ?? null;
  }

  open(trial) {
    if (this.trial?.id === trial.id) return;
    this.close(false);
    this.trial = trial;
    this.curves = new Map();
    this.attemptsKey = null;
    this.panel.hidden = false;
    this.panel.dataset.trialId = trial.id;
    this.update(trial);
    this.draw();
    const points = Math.min(10000, Math.max(16, 2 * Math.round(this.canvas.clientWidth || 500)));
    this.source = new EventSource(`/api/trials/${encodeURIComponent(trial.id)}/metrics/stream?points=${points}`);
    this.source.addEventListener("metrics", (event) => this.received(JSON.parse(event.data)));
    this.source.addEventListener("curve", (event) => {
      this.curves = new Map();
      this.received(JSON.parse(event.data));
    });
    this.source.addEventListener("problem", (event) => toast(JSON.parse(event.data).error, true));
    this.panel.querySelector("#detail-log").textContent = "";
    this.showLog(null);
    this.logTimer = setInterval(() => {
      if (this.trial?.status === "RUNNING" && this.logAttempt === null) this.loadLog();
    }, LOG_EVERY_MS);
  }

  close(notify = true) {
    this.source?.close();
    this.source = null;
    clearInterval(this.logTimer);
    this.trial = null;
    this.panel.hidden = true;
    delete this.panel.dataset.trialId;
    if (notify) this.onClose();
  }

  /** Whether the person logged in may change the trial's experiment (its team's, or an admin). */
  setMayChange(may) {
    if (this.mayChange === may) return;
    this.mayChange = may;
    if (this.trial) this.update(this.trial);
  }

  /** Whether the trial's experiment is RUNNING (a retry of its trials can start only then). */
  setExperimentRunning(running) {
    if (this.experimentRunning === running) return;
    this.experimentRunning = running;
    if (this.trial) this.update(this.trial);
  }

  /** The trial's row changed (status, final, times, attempt…); also called every second. */
  update(trial) {
    if (!this.trial || trial.id !== this.trial.id) return;
    const statusChanged = this.trial.status !== trial.status;
    const attemptChanged = (this.trial.attempt ?? 0) !== (trial.attempt ?? 0);
    this.trial = trial;
    const set = (id, text) => {
      const element = this.panel.querySelector(id);
      if (element.textContent !== text) element.textContent = text;
    };
    const attempt = trial.attempt ?? 0;
    set("#detail-title", `Trial ${trial.sequenceId} · ${trial.id}`);
    set("#detail-status", trial.status);
    this.panel.querySelector("#detail-status").dataset.status = trial.status;
    set("#detail-final", trial.finalMetric === null || trial.finalMetric === undefined
      ? "—" : formatMetric(trial.finalMetric));
    set("#detail-duration", formatDuration(secondsBetween(trial.startTime, trial.endTime)));
    // The attempt, why it failed and when a retry starts: shown only where there is something to say.
    set("#detail-attempt", String(attempt));
    this.panel.querySelector("#detail-attempt-fact").hidden = attempt === 0;
    set("#detail-failure", trial.failure ?? "");
    this.panel.querySelector("#detail-failure-fact").hidden = !trial.failure;
    const waiting = trial.status === "WAITING" && trial.retryAt;
    set("#detail-retry-at", waiting ? retryIn(trial.retryAt) : "");
    this.panel.querySelector("#detail-retry-at-fact").hidden = !waiting;
    set("#detail-message", trial.message ?? "");
    set("#detail-parameters", JSON.stringify(trial.parameters ?? {}, null, 2));
    const where = trial.replica ? `${trial.platform} @ ${trial.replica}` : trial.platform;
    const link = trial.link ? h("a", { href: trial.link, target: "_blank", rel: "noopener" }, `${where} (open job)`)
      : where;
    this.panel.querySelector("#detail-platform").replaceChildren(link);
    this.panel.querySelector("#detail-cancel").hidden = !ACTIVE.has(trial.status) || this.mayChange === false;
    this.retryButton.hidden = ACTIVE.has(trial.status) || this.mayChange === false;
    if (!this.retryButton.dataset.busy) this.retryButton.disabled = !this.experimentRunning;
    this.retryButton.title = this.experimentRunning
      ? "run the trial again, with the same parameters, as its next attempt"
      : "the experiment is not running: resume it to retry its trials";
    this.renderAttempts(trial.attempts ?? []);
    if (statusChanged) this.loadLog();
    if (attemptChanged) this.scheduleDraw();
  }

  /** The attempts that are over, oldest first; rebuilt only when they changed (they rarely do). */
  renderAttempts(attempts) {
    const key = JSON.stringify(attempts);
    if (key === this.attemptsKey) return;
    this.attemptsKey = key;
    const section = this.panel.querySelector("#detail-attempts");
    section.hidden = attempts.length === 0;
    const cell = (field, text, attributes = {}) => h("td", { dataset: { field }, ...attributes }, text);
    const bodies = attempts.map((a) => {
      const where = a.replica ? `${a.platform} @ ${a.replica}` : a.platform;
      return h("tbody", { dataset: { attempt: String(a.attempt), status: a.status } },
        h("tr", {},
          cell("attempt", String(a.attempt)),
          cell("status", a.status, { class: "status", dataset: { field: "status", status: a.status } }),
          cell("failure", a.failure ?? ""),
          cell("exitCode", a.exitCode === null || a.exitCode === undefined ? "" : String(a.exitCode)),
          cell("started", a.startTime ? new Date(a.startTime).toLocaleTimeString() : "never started",
            { title: a.startTime ? `${formatTime(a.startTime)} – ${formatTime(a.endTime)}` : null }),
          cell("duration", a.startTime ? formatDuration(secondsBetween(a.startTime, a.endTime)) : ""),
          cell("platform", where || ""),
          h("td", {}, h("button", { type: "button", class: "log", title: `show attempt ${a.attempt}'s log`,
            onclick: () => this.showLog(a.attempt) }, "log"))),
        a.message ? h("tr", { class: "attempt-message" }, cell("message", a.message, { colspan: 8 })) : null);
    });
    section.querySelector("table").replaceChildren(section.querySelector("thead"), ...bodies);
  }

  async retry() {
    const trial = this.trial;
    if (!trial || this.retryButton.dataset.busy) return;
    this.retryButton.dataset.busy = "1";
    this.retryButton.disabled = true; // one click, one attempt
    try {
      await this.onRetry(trial.id);
    } finally {
      delete this.retryButton.dataset.busy;
      this.retryButton.disabled = !this.experimentRunning;
    }
  }

  /** The attempt whose curve is the trial's now: its row's, or a newer one records already came from. */
  currentAttempt() {
    let current = this.trial?.attempt ?? 0;
    for (const attempt of this.curves.keys()) current = Math.max(current, attempt);
    return current;
  }

  received(records) {
    const touched = new Set();
    for (const record of records) {
      const attempt = record.attempt ?? 0;
      let curve = this.curves.get(attempt);
      if (!curve) {
        curve = { points: [], final: null };
        this.curves.set(attempt, curve);
      }
      if (record.type === "FINAL") curve.final = record.default ?? defaultMetric(record.value);
      else if (record.default !== null && record.default !== undefined) {
        curve.points.push([record.sequence, record.default]);
        touched.add(curve);
      }
    }
    for (const curve of touched) curve.points.sort((a, b) => a[0] - b[0]);
    this.scheduleDraw();
  }

  draw() {
    const current = this.currentAttempt();
    const mine = this.curves.get(current) ?? { points: [], final: null };
    const earlier = [...this.curves.entries()]
      .filter(([attempt, curve]) => attempt !== current && curve.points.length)
      .sort(([a], [b]) => a - b);
    // Earlier attempts first (drawn behind), one legend entry for all of them; they are not the
    // trial's curve, so data-points leaves them out.
    const series = earlier.map(([, curve], i) => ({
      points: curve.points, kind: "line", color: EARLIER_COLORS[i % EARLIER_COLORS.length],
      label: i === 0 ? (earlier.length === 1 ? `attempt ${earlier[0][0]}` : "earlier attempts") : null, counted: false,
    }));
    const name = current === 0 && !earlier.length ? "intermediate (default)" : `attempt ${current}`;
    series.push({ points: mine.points, kind: "line", color: CURRENT_COLOR, label: name });
    if (mine.final !== null && mine.final !== undefined && mine.points.length) {
      const x = mine.points.at(-1)[0];
      const label = `final ${formatNumber(mine.final)}`;
      series.push({ points: [[x, mine.final]], kind: "dots", color: "#dc2626", label, counted: false });
    }
    drawChart(this.canvas, { series, integerX: true, empty: "no intermediate results yet" });
    this.canvas.dataset.attempt = String(current);
    this.canvas.dataset.lines = String(earlier.length + (mine.points.length ? 1 : 0));
  }

  /** Show the log of an earlier attempt (its number), or of the current one (null). */
  showLog(attempt) {
    this.logAttempt = attempt;
    const element = this.panel.querySelector("#detail-log");
    element.dataset.attempt = attempt === null ? "" : String(attempt);
    this.panel.querySelector("#detail-log-of").textContent = attempt === null ? "" : `of attempt ${attempt}`;
    this.panel.querySelector("#log-current").hidden = attempt === null;
    element.textContent = "";
    this.loadLog();
  }

  async loadLog() {
    const trial = this.trial;
    if (!trial) return;
    const element = this.panel.querySelector("#detail-log");
    const attempt = this.logAttempt ?? null;
    if (attempt !== null) {
      const url = `/api/trials/${encodeURIComponent(trial.id)}/log?maxBytes=16384&attempt=${attempt}`;
      try {
        const { text } = await api("GET", url);
        if (this.trial?.id === trial.id && this.logAttempt === attempt) element.textContent = text || "(empty)";
      } catch (error) {
        if (this.trial?.id === trial.id && this.logAttempt === attempt) element.textContent = `(no log: ${error.message})`;
      }
      return;
    }
    if (trial.status === "WAITING") {
      element.textContent = trial.attempt ? "(the next attempt has not started: no log of it yet)"
        : "(the trial has not started: no log yet)";
      return;
    }
    try {
      const { text } = await api("GET", `/api/trials/${encodeURIComponent(trial.id)}/log?maxBytes=16384`);
      if (this.trial?.id === trial.id && this.logAttempt === null) element.textContent = text || "(empty)";
    } catch (error) {
      if (this.trial?.id === trial.id && this.logAttempt === null) element.textContent = `(no log: ${error.message})`;
    }
    element.scrollTop = element.scrollHeight;
  }
}

/** When a retry waiting for its back-off starts: "12:03:04 (in 4s)". */
function retryIn(iso) {
  const seconds = (Date.parse(iso) - Date.now()) / 1000;
  const time = new Date(iso).toLocaleTimeString();
  return seconds > 0 ? `${time} (in ${Math.ceil(seconds)}s)` : `${time} (due)`;
}
