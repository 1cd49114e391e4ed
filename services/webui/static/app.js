// The page: one experiment (or the newest, at /), live from /api/events; at /queue, the
// shared platforms' queue instead (queue.js); at /experiments, every experiment (experiments.js).
//
// Events are not applied as they arrive: they wait in an inbox that is applied at most
// every APPLY_EVERY_MS, inside requestAnimationFrame, so a burst of changes costs one
// redraw. The page never holds every trial: the table is virtualised and reads the rows it
// shows from the server (table.js, virtual.js); an update brings the overview and at most a
// few changed rows (or "stale": the rows on screen are refetched); the overview chart is read
// from /api/experiments/<id>/chart, cut down to its width, at most once per CHART_EVERY_MS.
//
// Hooks for tests: #exp-id, #exp-status, #exp-best, #exp-trial-count, #exp-counts li[data-status],
// #exp-failures li[data-trial] .last-error,
// #exp-config, #overview-chart[data-points], #empty, #connection[data-state], body[data-experiment];
// the performance mark "trialbus:rows" (the first rows of the table drawn: time to interactive).

import { Analysis } from "./analysis.js";
import { AddTrial } from "./addtrial.js";
import { drawChart } from "./chart.js";
import { Compare } from "./compare.js";
import { AllCurves } from "./curves.js";
import { TrialDetail } from "./detail.js";
import { showExperiments } from "./experiments.js";
import { setUpEdit } from "./edit.js";
import { ExperimentLogs } from "./logs.js";
import { showQueue } from "./queue.js";
import { TrialTable } from "./table.js";
import { STATUSES, api, formatDuration, formatNumber, h, secondsBetween, toast } from "./util.js";
import { TrialRows } from "./virtual.js";

const APPLY_EVERY_MS = 200;
const CHART_EVERY_MS = 1000;
const DETAIL_EVERY_MS = 1000;
const ACTIVITY_EVERY_MS = 3000;
let lastActivity = -Infinity;
const $ = (selector) => document.querySelector(selector);

const match = location.pathname.match(/^\/experiments\/([^/]+)$/);
const requested = match ? decodeURIComponent(match[1]) : null;

const state = { experiment: null, platforms: [], experiments: [], me: null };
const inbox = [];
let lastApply = 0, applyScheduled = false;

const rows = new TrialRows(() => {
  table.schedule();
  renderShown();
});
const table = new TrialTable($("#trials"), rows, { onSelect: select, onCancel: cancel, onCheck: () => compare.changed() });
const curves = new AllCurves();
const compare = new Compare(table);
const editor = setUpEdit($("#edit-experiment"), () => state.experiment); // edit.js: the Edit dialog
const analysis = new Analysis({ onOpen: select });
const detail = new TrialDetail($("#trial-detail"), {
  onCancel: cancel, onRetry: retry, onClose: () => table.select(null),
});
const addTrial = new AddTrial({ currentTrial: () => detail.trial });
const experimentLogs = new ExperimentLogs();

function connect() {
  loadWhoami();
  const url = requested ? `/api/events?experiment=${encodeURIComponent(requested)}` : "/api/events";
  const source = new EventSource(url);
  const connection = $("#connection");
  source.onopen = () => { connection.dataset.state = "live"; connection.textContent = "live"; };
  source.onerror = () => {
    const closed = source.readyState === EventSource.CLOSED;
    connection.dataset.state = closed ? "closed" : "reconnecting";
    connection.textContent = closed ? "disconnected: reload the page" : "reconnecting…";
  };
  for (const type of ["snapshot", "update", "experiments", "platforms"]) {
    source.addEventListener(type, (event) => receive(type, JSON.parse(event.data)));
  }
}

function receive(type, data) {
  if (type === "snapshot") inbox.length = 0; // everything before it is superseded
  inbox.push([type, data]);
  if (applyScheduled) return;
  applyScheduled = true;
  const wait = Math.max(0, APPLY_EVERY_MS - (performance.now() - lastApply));
  // A hidden tab gets no animation frames: apply there on the (throttled) timer instead, so
  // the inbox does not grow for as long as the tab stays in the background.
  setTimeout(() => (document.hidden ? apply() : requestAnimationFrame(apply)), wait);
}

/** Apply every waiting event, then redraw what they touched, once. */
function apply() {
  applyScheduled = false;
  lastApply = performance.now();
  try {
    applyInbox();
  } finally {
    // How long the latest apply took, for anyone profiling the page (the 1,000-trial test
    // prints it). Only the latest is kept: a page open for days must not collect entries.
    performance.clearMeasures("trialbus:apply");
    performance.measure("trialbus:apply", { start: lastApply, end: performance.now() });
  }
}

function applyInbox() {
  const events = inbox.splice(0);
  const dirty = { overview: false, chart: false, picker: false, platforms: false, snapshot: null, refresh: false };
  const changed = new Map();
  for (const [type, data] of events) {
    if (type === "snapshot") {
      state.experiment = data.experiment;
      state.platforms = data.platforms;
      state.experiments = data.experiments;
      changed.clear();
      Object.assign(dirty, { overview: true, chart: true, picker: true, platforms: true, snapshot: data });
    } else if (type === "update") {
      if (data.experiment) state.experiment = data.experiment;
      for (const trial of data.trials) changed.set(trial.id, trial);
      const moved = data.stale || data.removed.length > 0;
      dirty.refresh ||= moved;
      dirty.overview = true;
      dirty.chart ||= data.changed > 0;
      dirty.platforms ||= data.stale || data.trials.some((t) => t.status === "WAITING");
    } else if (type === "experiments") {
      state.experiments = data;
      dirty.picker = true;
    } else if (type === "platforms") {
      state.platforms = data;
      dirty.platforms = true;
    }
  }
  if (dirty.snapshot) {
    const id = state.experiment?.id ?? null;
    if (id !== rows.experimentId) table.clear();
    rows.reset(id, dirty.snapshot.trials, rows.isDefaultView() ? dirty.snapshot.total : filteredTotal());
    if (detail.id && id === null) detail.close();
  }
  if (changed.size) {
    const unknown = rows.patch([...changed.values()]);
    // Rows held moved or came under the filter, or new rows: what is on screen is read again.
    dirty.refresh ||= unknown.length > 0 || !(rows.view.sort === "sequence" && rows.view.order === "asc"
      && !rows.view.status);
    if (detail.id && changed.has(detail.id)) detail.update(changed.get(detail.id));
  }
  if (state.experiment && !dirty.snapshot) rows.total = filteredTotal();
  if (dirty.refresh) {
    rows.refresh();
    if (detail.id && !changed.has(detail.id)) refreshDetail();
  }
  table.draw();
  if (dirty.overview) renderOverview();
  if (dirty.chart) scheduleChart();
  if (dirty.chart && !dirty.snapshot) curves.schedule();
  if (dirty.snapshot && state.experiment) [curves, compare].forEach((view) => view.show(state.experiment.id));
  if (dirty.chart) analysis.changed(state.experiment);
  if (dirty.picker) renderPicker();
  if (dirty.platforms) renderPlatforms();
  renderShown();
  if (dirty.snapshot) openFromHash();
}

/** Rows under the status filter, from the overview's counts (as the server counts them). */
function filteredTotal() {
  const counts = state.experiment?.trialCounts ?? {};
  if (!rows.view.status) return state.experiment?.trialCount ?? 0;
  return counts[rows.view.status] ?? 0;
}

let detailTimer = 0, lastDetail = 0;

/** The open trial changed without its row in an update: read it, at most once per DETAIL_EVERY_MS. */
function refreshDetail() {
  if (detailTimer) return;
  detailTimer = setTimeout(async () => {
    detailTimer = 0;
    lastDetail = performance.now();
    const id = detail.id;
    if (!id) return;
    try {
      const trial = await api("GET", `/api/trials/${encodeURIComponent(id)}`);
      if (detail.id === id) detail.update(trial);
    } catch {
      // the next change asks again
    }
  }, Math.max(0, DETAIL_EVERY_MS - (performance.now() - lastDetail)));
}

function renderOverview() {
  const experiment = state.experiment;
  $("#empty").hidden = Boolean(experiment);
  $("#experiment").hidden = !experiment;
  document.body.dataset.experiment = experiment?.id ?? "";
  if (!experiment) {
    document.title = "Trialbus — no experiments yet";
    return;
  }
  const set = (selector, text) => {
    const element = $(selector);
    if (element.textContent !== text) element.textContent = text;
  };
  document.title = `Trialbus — ${experiment.name || experiment.id}`;
  set("#exp-name", experiment.name || "(unnamed experiment)");
  set("#exp-id", experiment.id);
  set("#exp-status", experiment.status);
  $("#exp-status").dataset.status = experiment.status;
  const best = experiment.best;
  set("#exp-best", best ? `${formatNumber(best.value)} (trial ${best.sequenceId}, ${experiment.optimizeMode})` : "—");
  $("#exp-best").dataset.value = best ? String(best.value) : "";
  set("#exp-trial-count", `${experiment.trialCount}${experiment.maxTrialNumber ? ` of ${experiment.maxTrialNumber}` : ""}`);
  set("#exp-platform", experiment.platform);
  set("#exp-concurrency", String(experiment.trialConcurrency));
  const ending = experiment.noMoreTrials && experiment.status === "RUNNING"
    ? "The tuner has no more trials to propose: the experiment is done when the running ones end." : "";
  set("#exp-message", experiment.message ?? ending);
  renderFailures(experiment.failures ?? []);
  set("#exp-started", new Date(experiment.startTime).toLocaleString());
  renderDuration();
  const counts = $("#exp-counts");
  if (counts.children.length !== STATUSES.length) {
    counts.replaceChildren(...STATUSES.map((s) => h("li", { dataset: { status: s } }, h("span", {}, s), h("b"))));
  }
  for (const li of counts.children) {
    const n = String(experiment.trialCounts[li.dataset.status] ?? 0);
    if (li.lastChild.textContent !== n) li.lastChild.textContent = n;
    li.classList.toggle("zero", n === "0");
  }
  const config = JSON.stringify(experiment.config, null, 2);
  set("#exp-config", config);
  $("#stop-experiment").disabled = experiment.status !== "RUNNING";
  const may = mayChange(experiment);
  $("#stop-experiment").hidden = !may;
  Object.assign($("#edit-experiment"), { hidden: !may, disabled: !["RUNNING", "STOPPED"].includes(experiment.status) });
  editor.restore();
  if (table.mayChange !== may) {
    table.mayChange = may;
    table.draw();
  }
  detail.setMayChange(may);
  detail.setExperimentRunning(experiment.status === "RUNNING");
  addTrial.update(experiment, may && state.me !== null);
  experimentLogs.update(experiment);
}

/** Whether the person logged in may change ``experiment``: an admin any, a member their team's,
 * a viewer none (the dispatcher decides; this only hides what it would refuse). */
function mayChange(experiment) {
  const me = state.me;
  if (!me) return true; // not known yet: the dispatcher still refuses what is not theirs
  return me.role === "admin" || (me.role === "member" && experiment.team === me.team);
}

async function loadWhoami() {
  try {
    state.me = await api("GET", "/api/whoami");
    $("#whoami").textContent = `${state.me.name} (${state.me.team}, ${state.me.role})`;
    if (state.experiment) renderOverview();
  } catch (error) {
    $("#whoami").textContent = "";
  }
}

/** The first failures: why each trial failed (its last stderr line, as text) and the command for its log. */
function renderFailures(failures) {
  const list = $("#exp-failures");
  const key = JSON.stringify(failures);
  if (list.dataset.key === key) return;
  list.dataset.key = key;
  list.replaceChildren(...failures.map((f) => h("li", { dataset: { trial: f.trialId } },
    `trial ${f.trialId} (#${f.sequenceId}) failed${f.exitCode === null ? "" : ` (exit ${f.exitCode})`}: `,
    h("span", { class: "last-error" }, f.lastError), "; whole log: ", h("code", {}, f.log))));
}

/** The experiment's activity (its audit trail), read when the panel is open, at most every ACTIVITY_EVERY_MS. */
async function loadActivity() {
  const panel = $("#activity");
  const experiment = state.experiment;
  if (!panel.open || !experiment || performance.now() - lastActivity < ACTIVITY_EVERY_MS) return;
  lastActivity = performance.now();
  let records;
  try {
    records = await api("GET", `/api/experiments/${encodeURIComponent(experiment.id)}/activity`);
  } catch (error) {
    $("#activity-rows").replaceChildren(h("tr", {}, h("td", {}, error.message)));
    return;
  }
  $("#activity-rows").replaceChildren(...records.slice().reverse().map((r) => h("tr",
    { dataset: { user: r.user, action: r.action, status: String(r.status), ...(r.status >= 300 ? { refused: "" } : {}) } },
    h("td", {}, new Date(r.time).toLocaleString()), h("td", {}, r.user), h("td", {}, r.action),
    h("td", {}, r.target ?? ""),
    h("td", { class: "answer" }, r.status < 300 ? "done" : `${r.status}: ${r.message ?? ""}`))));
}

function renderDuration() {
  const experiment = state.experiment;
  if (!experiment) return;
  const seconds = secondsBetween(experiment.startTime, experiment.endTime);
  $("#exp-duration").textContent = formatDuration(seconds);
}

let chartTimer = 0, lastChart = 0;

/** Read the overview chart again, at most once per CHART_EVERY_MS (it changes with every final). */
function scheduleChart() {
  if (chartTimer) return;
  chartTimer = setTimeout(() => {
    chartTimer = 0;
    lastChart = performance.now();
    renderChart();
  }, Math.max(0, CHART_EVERY_MS - (performance.now() - lastChart)));
}

/** Every trial's final default metric by trial number (cut down to the chart's width by the
 *  server, the lowest and highest of each run kept), and the best so far. */
async function renderChart() {
  const experiment = state.experiment;
  if (!experiment) return;
  const canvas = $("#overview-chart");
  const points = Math.min(10000, Math.max(16, 2 * Math.round(canvas.clientWidth || 600)));
  let chart;
  try {
    chart = await api("GET", `/api/experiments/${encodeURIComponent(experiment.id)}/chart?points=${points}`);
  } catch (error) {
    return; // the next change asks again
  }
  if (state.experiment?.id !== experiment.id) return;
  const mode = experiment.optimizeMode ?? "maximize";
  drawChart(canvas, {
    series: [
      { points: chart.points, kind: "dots", color: "#2563eb", label: "final metric" },
      { points: chart.best, kind: "step", color: "#16a34a", label: `best so far (${mode})` },
    ],
    integerX: true,
    empty: "no final metrics yet",
  });
  canvas.dataset.finals = String(chart.count);
}

function renderPicker() {
  const picker = $("#experiment-picker");
  const options = [h("option", { value: "" }, "Newest experiment (follows new ones)")];
  for (const e of state.experiments) {
    options.push(h("option", { value: e.id }, `${e.name || "(unnamed)"} · ${e.id} · ${e.status}`));
  }
  picker.replaceChildren(...options);
  picker.value = requested ?? "";
}

function renderPlatforms() {
  const waitingWhy = (key) => {
    const trial = rows.find(key.split(":")[0])?.row;
    return trial ? `${trial.id}${trial.message ? `: ${trial.message}` : ""}` : key;
  };
  const cards = state.platforms.map((p) => h("article", { class: "replica", dataset: { adapter: p.adapter, replica: p.replica } },
    h("h3", {}, `${p.adapter} · ${p.replica}`, h("small", {}, ` on ${p.host}`)),
    h("p", {}, `running ${p.running}${p.maxTrials ? ` of ${p.maxTrials}` : ""} · waiting ${p.waiting.length}`),
    p.waiting.length ? h("ul", { class: "waiting" }, p.waiting.slice(0, 20).map((key) => h("li", {}, waitingWhy(key)))) : null,
    p.gpuError ? h("p", { class: "error" }, `GPUs: ${p.gpuError}`) : null,
    p.gpus.length ? h("table", { class: "gpus" },
      h("tr", {}, ["GPU", "name", "memory", "util", "trials"].map((t) => h("th", {}, t))),
      p.gpus.map((g) => h("tr", {}, h("td", {}, g.index), h("td", {}, g.name),
        h("td", {}, `${g.memoryUsedMib} / ${g.memoryTotalMib} MiB`), h("td", {}, g.gpuUtil === null ? "" : `${g.gpuUtil}%`),
        h("td", {}, [...g.trials, g.foreignProcesses ? `${g.foreignProcesses} other` : ""].filter(Boolean).join(", "))))) : null,
    p.machines.length ? h("ul", { class: "machines" }, p.machines.map((m) => h("li", { dataset: { up: String(m.up) } },
      `${m.name}: ${m.up ? `up, ${m.running} running, ${m.gpus.length} GPUs` : `down (${m.error ?? "unreachable"})`}`))) : null,
    p.clusters.length ? h("ul", { class: "clusters" }, p.clusters.map((c) => h("li", {},
      `${c.name}: ${c.jobs} jobs, ${c.busyEnvironments}/${c.environments} environments busy`
      + (c.pausedFor ? `, paused ${Math.ceil(c.pausedFor)}s (rate limit)` : "") + (c.error ? ` — ${c.error}` : "")))) : null,
  ));
  $("#platforms").replaceChildren(...(cards.length ? cards : [h("p", { class: "muted" }, "No adapter is running.")]));
}

let interactive = false;

function renderShown() {
  const all = state.experiment?.trialCount ?? 0, shown = rows.view.status ? rows.total : all;
  $("#shown-count").textContent = shown === all ? `${all} trials` : `${shown} of ${all} trials`;
  if (!interactive && document.querySelector("#trials tbody tr")) {
    interactive = true;
    performance.mark("trialbus:rows");
  }
}

async function select(id) {
  let trial = rows.find(id)?.row;
  if (!trial) {
    try {
      trial = await api("GET", `/api/trials/${encodeURIComponent(id)}`);
    } catch (error) {
      toast(error.message, true);
      return;
    }
  }
  table.select(id);
  detail.open(trial);
  history.replaceState(null, "", `#trial=${encodeURIComponent(id)}`);
}

function openFromHash() {
  const id = decodeURIComponent(location.hash.match(/^#trial=(.+)$/)?.[1] ?? "");
  if (id && detail.id !== id) select(id);
}

async function cancel(id) {
  try {
    const answer = await api("POST", `/api/trials/${encodeURIComponent(id)}/cancel`);
    toast(`cancel of trial ${id} requested (${answer.status})`);
  } catch (error) {
    toast(error.message, true);
  }
}

async function retry(id) {
  try {
    const answer = await api("POST", `/api/trials/${encodeURIComponent(id)}/retry`);
    toast(`trial ${id} runs again as attempt ${answer.attempt} (${answer.status})`);
  } catch (error) {
    toast(error.message, true);
  }
}

function setUp() {
  $("#status-filter").replaceChildren(h("option", { value: "" }, "all"), ...STATUSES.map((s) => h("option", { value: s }, s)));
  $("#status-filter").addEventListener("change", (event) => {
    table.setFilter(event.target.value);
    rows.total = filteredTotal();
    table.draw();
    renderShown();
  });
  $("#experiment-picker").addEventListener("change", (event) => {
    location.href = event.target.value ? `/experiments/${encodeURIComponent(event.target.value)}` : "/";
  });
  const dialog = $("#confirm-stop");
  $("#stop-experiment").addEventListener("click", () => {
    $("#confirm-stop-id").textContent = state.experiment?.id ?? "";
    dialog.returnValue = ""; // Escape closes without setting it: never a stale "stop"
    dialog.showModal();
  });
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "stop" || !state.experiment) return;
    try {
      const answer = await api("POST", `/api/experiments/${encodeURIComponent(state.experiment.id)}/stop`);
      toast(`experiment ${answer.id} ${answer.status}`);
    } catch (error) {
      toast(error.message, true);
    }
  });
  $("#activity").addEventListener("toggle", () => { lastActivity = -Infinity; loadActivity(); });
  setInterval(() => {
    loadActivity();
    renderDuration();
    table.tick();
    if (detail.trial) detail.update(detail.trial);
  }, 1000);
  connect();
}

/** The queue page: the picker (to go to an experiment) and who is logged in; no experiment's events. */
async function setUpQueue(show = showQueue) {
  $("#experiment-picker").addEventListener("change", (event) => {
    location.href = event.target.value ? `/experiments/${encodeURIComponent(event.target.value)}` : "/";
  });
  loadWhoami();
  show();
  try {
    state.experiments = await api("GET", "/api/experiments");
  } catch {
    state.experiments = []; // the picker offers the newest experiment only
  }
  renderPicker();
}

if (location.pathname === "/queue") setUpQueue();
else if (location.pathname === "/experiments") setUpQueue(showExperiments);
else setUp();
