// The selected trial: its intermediate-metric curve (live), final metric, log tail,
// platform link and a cancel button.
//
// The curve comes from its own event stream (/api/trials/<id>/metrics/stream): the
// trial's metric history first, then each new record; the server batches them, and the
// canvas is redrawn at most once per animation frame. The log is fetched when the panel
// opens, on "Refresh", and every few seconds while the trial runs.
//
// Hooks for tests: #trial-curve[data-points], #detail-status, #detail-final, #detail-log.

import { drawChart } from "./chart.js";
import {
  ACTIVE, api, defaultMetric, formatDuration, formatMetric, formatNumber, h, secondsBetween, toast,
} from "./util.js";

const LOG_EVERY_MS = 5000;

export class TrialDetail {
  constructor(panel, { onCancel, onClose }) {
    this.panel = panel;
    this.onCancel = onCancel;
    this.onClose = onClose;
    this.trial = null;
    this.points = [];
    this.source = null;
    this.drawPending = false;
    this.logTimer = 0;
    this.canvas = panel.querySelector("#trial-curve");
    panel.querySelector("#detail-close").addEventListener("click", () => this.close());
    panel.querySelector("#detail-cancel").addEventListener("click", () => this.trial && this.onCancel(this.trial.id));
    panel.querySelector("#log-refresh").addEventListener("click", () => this.loadLog());
  }

  get id() {
    return this.trial?.id ?? null;
  }

  open(trial) {
    if (this.trial?.id === trial.id) return;
    this.close(false);
    this.trial = trial;
    this.points = [];
    this.final = null;
    this.panel.hidden = false;
    this.panel.dataset.trialId = trial.id;
    this.update(trial);
    this.draw();
    this.source = new EventSource(`/api/trials/${encodeURIComponent(trial.id)}/metrics/stream`);
    this.source.addEventListener("metrics", (event) => this.received(JSON.parse(event.data)));
    this.source.addEventListener("problem", (event) => toast(JSON.parse(event.data).error, true));
    this.panel.querySelector("#detail-log").textContent = "";
    this.loadLog();
    this.logTimer = setInterval(() => {
      if (this.trial?.status === "RUNNING") this.loadLog();
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

  /** The trial's row changed (status, final, times…). */
  update(trial) {
    if (!this.trial || trial.id !== this.trial.id) return;
    const statusChanged = this.trial.status !== trial.status;
    this.trial = trial;
    const set = (id, text) => {
      const element = this.panel.querySelector(id);
      if (element.textContent !== text) element.textContent = text;
    };
    set("#detail-title", `Trial ${trial.sequenceId} · ${trial.id}`);
    set("#detail-status", trial.status);
    this.panel.querySelector("#detail-status").dataset.status = trial.status;
    set("#detail-final", trial.finalMetric === null || trial.finalMetric === undefined
      ? "—" : formatMetric(trial.finalMetric));
    set("#detail-duration", formatDuration(secondsBetween(trial.startTime, trial.endTime)));
    set("#detail-attempt", String(trial.attempt ?? 0));
    set("#detail-message", trial.message ?? "");
    set("#detail-parameters", JSON.stringify(trial.parameters ?? {}, null, 2));
    const where = trial.replica ? `${trial.platform} @ ${trial.replica}` : trial.platform;
    const link = trial.link ? h("a", { href: trial.link, target: "_blank", rel: "noopener" }, `${where} (open job)`)
      : where;
    this.panel.querySelector("#detail-platform").replaceChildren(link);
    this.panel.querySelector("#detail-cancel").hidden = !ACTIVE.has(trial.status);
    if (statusChanged) this.loadLog();
  }

  received(records) {
    for (const record of records) {
      if (record.type === "FINAL") this.final = record.default ?? defaultMetric(record.value);
      else if (record.default !== null && record.default !== undefined) this.points.push([record.sequence, record.default]);
    }
    this.points.sort((a, b) => a[0] - b[0]);
    if (!this.drawPending) {
      this.drawPending = true;
      requestAnimationFrame(() => {
        this.drawPending = false;
        this.draw();
      });
    }
  }

  draw() {
    const series = [{ points: this.points, kind: "line", color: "#2563eb", label: "intermediate (default)" }];
    if (this.final !== null && this.final !== undefined && this.points.length) {
      const x = this.points.at(-1)[0];
      series.push({ points: [[x, this.final]], kind: "dots", color: "#dc2626", label: `final ${formatNumber(this.final)}` });
    }
    drawChart(this.canvas, { series, integerX: true, empty: "no intermediate results yet" });
    // data-points counts the intermediate points only: what the curve is made of.
    this.canvas.dataset.points = String(this.points.length);
  }

  async loadLog() {
    const trial = this.trial;
    if (!trial) return;
    const element = this.panel.querySelector("#detail-log");
    if (trial.status === "WAITING") {
      element.textContent = "(the trial has not started: no log yet)";
      return;
    }
    try {
      const { text } = await api("GET", `/api/trials/${encodeURIComponent(trial.id)}/log?maxBytes=16384`);
      if (this.trial?.id === trial.id) element.textContent = text || "(empty)";
    } catch (error) {
      if (this.trial?.id === trial.id) element.textContent = `(no log: ${error.message})`;
    }
    element.scrollTop = element.scrollHeight;
  }
}
