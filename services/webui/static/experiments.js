// The "All experiments" page (/experiments): every experiment in a row, filtered and sorted by
// the server (/api/experiments takes this page's own query string: q, status, platform, team,
// sort, order), so that a link shows a colleague the same view. Each row's counts and best
// metric are kept by the server as trials change; the page reads the list again every POLL_MS
// while it is shown (a few hundred rows of aggregates: cheaper than following every
// experiment's event stream, and the list only needs statuses and counts, not each trial).
//
// Actions (stop, resume, delete: relayed to the dispatcher as the person logged in) show only
// on the rows the server says the person may change (row.mayChange); export is a read, a
// download of the experiment's trials as JSON or CSV (trialbus experiment export's format).
//
// Hooks for tests: #experiments-rows tr[data-experiment][data-status] with td[data-column],
// its counts li[data-status][data-count], buttons .stop/.resume/.delete, input.select, links
// a.export[data-format]; #experiments-rows[data-drawn] (the query string the rows show);
// #experiments-bulk .bulk-stop/.bulk-resume/.bulk-delete; #experiments-count; #confirm-delete;
// the performance mark "trialbus:experiments" (the first rows drawn).

import { api, formatDuration, formatNumber, h, toast } from "./util.js";

const POLL_MS = 2000;
const EXPERIMENT_STATUSES = ["RUNNING", "DONE", "STOPPED"];
const TRIAL_STATUSES = ["WAITING", "RUNNING", "SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED"];
/** Column key → [heading, sort key (null: not sortable)]. */
const COLUMNS = [
  ["select", "Select", null], ["name", "Name", "name"], ["id", "Id", "id"], ["status", "Status", "status"], ["platform", "Platform", "platform"],
  ["owner", "Owner / team", "owner"], ["start", "Started", "start"], ["duration", "Duration", "duration"],
  ["best", "Best metric", "best"], ["trials", "Trials by status", "trials"], ["actions", "Actions", null],
];
const FILTERS = ["q", "status", "platform", "team"];
/** What each action does to a selection (its buttons act on the selected rows where it applies). */
const APPLIES = { stop: (r) => r.status === "RUNNING", resume: (r) => r.status === "STOPPED", delete: (r) => r.status !== "RUNNING" };
let shown = [];
const $ = (selector) => document.querySelector(selector);

let drawn = false, busy = false;
const seen = { platform: new Set(), team: new Set() };

/** The view as the URL holds it: filters, sort (default: started, newest first). */
function view() {
  const params = new URLSearchParams(location.search);
  return {
    ...Object.fromEntries(FILTERS.map((name) => [name, params.get(name) ?? ""])),
    sort: params.get("sort") ?? "start",
    order: params.get("order") ?? (params.get("sort") ? "asc" : "desc"),
    selected: params.get("selected") ?? "",
  };
}

/** Put ``changes`` into the URL (replacing, so Back leaves the page rather than undoing keystrokes). */
function setView(changes) {
  const next = { ...view(), ...changes };
  const params = new URLSearchParams();
  for (const name of FILTERS) if (next[name]) params.set(name, next[name]);
  if (next.selected) params.set("selected", next.selected);
  if (next.sort !== "start" || next.order !== "desc") {
    params.set("sort", next.sort);
    params.set("order", next.order);
  }
  const query = params.toString();
  history.replaceState(null, "", query ? `/experiments?${query}` : "/experiments");
  refresh();
}

function build() {
  // Labels name their control by "for" (a label around a select would add the option shown to its name).
  const filter = (name, label, control) => h("span", { class: "field" },
    h("label", { for: `experiments-${name}` }, label), " ", control);
  const datalist = (name) => h("datalist", { id: `experiments-${name}-options` });
  const form = h("form", { id: "experiments-filter", role: "search", "aria-label": "Filter experiments",
    onsubmit: (event) => event.preventDefault() },
  filter("q", "Name or id", h("input", { type: "search", name: "q", id: "experiments-q", autocomplete: "off" })),
  filter("status", "Status", h("select", { name: "status", id: "experiments-status" },
    h("option", { value: "" }, "all"), EXPERIMENT_STATUSES.map((s) => h("option", { value: s }, s)))),
  filter("platform", "Platform", h("input", { name: "platform", id: "experiments-platform",
    list: "experiments-platform-options", autocomplete: "off", size: 12 })),
  filter("team", "Team", h("input", { name: "team", id: "experiments-team", list: "experiments-team-options",
    autocomplete: "off", size: 10 })),
  datalist("platform"), datalist("team"));
  let typing = 0;
  form.addEventListener("input", (event) => {
    clearTimeout(typing);
    const { name, value } = event.target;
    typing = setTimeout(() => setView({ [name]: value.trim() }), event.target.tagName === "SELECT" ? 0 : 250);
  });
  const head = h("tr", {}, COLUMNS.map(([key, label, sort]) => h("th", { scope: "col", dataset: { column: key } },
    sort ? h("button", { type: "button", class: "sort", dataset: { sort }, onclick: () => sortBy(sort) }, label,
      h("span", { class: "arrow", "aria-hidden": "true" })) : label)));
  const table = h("table", { id: "experiments-table", class: "experiments" },
    h("caption", { class: "visually-hidden" }, "Every experiment: sort by a column's button"),
    h("thead", {}, head), h("tbody", { id: "experiments-rows" }));
  $("#all-experiments").replaceChildren(h("section", { class: "panel" },
    h("div", { class: "title" }, h("h1", {}, "All experiments"),
      h("span", { id: "experiments-count", class: "muted", role: "status" })),
    form, h("div", { id: "experiments-bulk", class: "row-actions", role: "group", "aria-label": "Selected experiments",
      hidden: true },
    h("span", { id: "experiments-selected", class: "muted" }),
    ["stop", "resume", "delete"].map((action) => h("button", { type: "button", class: `bulk-${action}`,
      onclick: () => (action === "delete" ? confirmDelete(selection()) : actOn(selection(), action)) },
    `${action[0].toUpperCase()}${action.slice(1)} selected`))),
    h("p", { id: "experiments-error", class: "error", hidden: true }),
    h("div", { class: "table-wrap" }, table)),
  h("dialog", { id: "confirm-delete", "aria-labelledby": "confirm-delete-title" },
    h("form", { method: "dialog" },
      h("h2", { id: "confirm-delete-title" }, "Delete the experiment?"),
      h("p", {}, "Experiment ", h("code", { id: "confirm-delete-id" }), " is removed with its trials, their events "
        + "and metrics. This cannot be undone."),
      h("menu", {}, h("button", { id: "confirm-delete-no", value: "keep", type: "submit" }, "Keep it"),
        h("button", { id: "confirm-delete-yes", value: "delete", type: "submit", class: "danger" },
          "Delete experiment")))));
}

/** The selected experiments' ids (the URL's "selected"). */
function selected() {
  return new Set(view().selected.split(",").filter(Boolean));
}

/** The rows shown that are selected and that the person may change. */
function selection() {
  const ids = selected();
  return shown.filter((r) => ids.has(r.id) && r.mayChange);
}

function select(id, on) {
  const ids = selected();
  if (on) ids.add(id);
  else ids.delete(id);
  setView({ selected: [...ids].join(",") });
}

/** The toolbar for the selected rows: shown where the person may change some row; each button
 *  enabled where it applies to one of the selected rows. */
function showSelection() {
  const chosen = selection();
  $("#experiments-bulk").hidden = !shown.some((r) => r.mayChange);
  $("#experiments-selected").textContent = `${chosen.length} selected:`;
  for (const [action, applies] of Object.entries(APPLIES)) {
    $(`#experiments-bulk .bulk-${action}`).disabled = !chosen.some(applies);
  }
  const ids = selected();
  for (const box of document.querySelectorAll("#experiments-rows input.select")) {
    box.checked = ids.has(box.closest("tr").dataset.experiment);
  }
}

function sortBy(sort) {
  const current = view();
  const order = current.sort === sort ? (current.order === "asc" ? "desc" : "asc") : "asc";
  setView({ sort, order });
}

/** The filter's controls and the headings' aria-sort, as the URL says. */
function showView(current) {
  for (const name of FILTERS) {
    const control = $(`#experiments-${name}`);
    if (document.activeElement !== control && control.value !== current[name]) control.value = current[name];
  }
  for (const th of document.querySelectorAll("#experiments-table th")) {
    const sort = th.querySelector("button.sort")?.dataset.sort;
    // The arrow is for the eye; a screen reader hears aria-sort (a CSS ::after would join the button's name).
    const arrow = th.querySelector(".arrow");
    if (sort === current.sort) th.setAttribute("aria-sort", current.order === "asc" ? "ascending" : "descending");
    else th.removeAttribute("aria-sort");
    if (arrow) arrow.textContent = sort !== current.sort ? "" : current.order === "asc" ? " ▲" : " ▼";
  }
}

function counts(row) {
  return h("ul", { class: "counts", "aria-label": `${row.trialCount} trials` },
    TRIAL_STATUSES.filter((s) => row.trialCounts[s]).map((s) => h("li", { dataset: { status: s, count: String(row.trialCounts[s]) } },
      h("span", {}, s), String(row.trialCounts[s]))));
}

function actions(row) {
  const what = row.name ? `${row.name} (${row.id})` : row.id;
  const button = (kind, label, onclick, extra = {}) => h("button", { type: "button", class: kind, onclick,
    "aria-label": `${label} experiment ${what}`, ...extra }, label);
  const exported = (format) => h("a", { class: "export", dataset: { format },
    href: `/api/experiments/${encodeURIComponent(row.id)}/export?format=${format}`, download: `${row.id}-trials.${format}`,
    "aria-label": `Export the trials of experiment ${what} as ${format.toUpperCase()}` }, format.toUpperCase());
  return h("div", { class: "row-actions" },
    row.mayChange && row.status === "RUNNING" ? button("stop", "Stop", () => act(row, "stop")) : null,
    row.mayChange && row.status === "STOPPED" ? button("resume", "Resume", () => act(row, "resume")) : null,
    row.mayChange && row.status !== "RUNNING" ? button("delete danger", "Delete", () => confirmDelete(row)) : null,
    h("span", { class: "muted" }, "Export "), exported("json"), " ", exported("csv"));
}

/** A row's cells: [column, key (the cell is drawn again only when it changes), draw]. */
function cellsOf(row) {
  const best = row.best === null ? "—" : `${formatNumber(row.best)}${row.bestTrial ? ` (trial ${row.bestTrial.sequenceId})` : ""}`;
  const owner = row.owner ? `${row.owner} (${row.team ?? "no team"})` : (row.team ?? "—");
  const duration = formatDuration(row.duration);
  return [
    ["select", `${row.mayChange}`, () => (row.mayChange ? h("input", { type: "checkbox", class: "select",
      "aria-label": `Select experiment ${row.name ? `${row.name} (${row.id})` : row.id}`,
      onchange: (event) => select(row.id, event.target.checked) }) : "")],
    ["name", row.name, () => row.name || h("span", { class: "muted" }, "(unnamed)")],
    ["id", row.id, () => h("a", { href: `/experiments/${encodeURIComponent(row.id)}` }, row.id)],
    ["status", row.status, () => h("span", { class: "status", dataset: { status: row.status } }, row.status)],
    ["platform", row.platforms.join(", "), () => row.platforms.join(", ")],
    ["owner", owner, () => owner],
    ["start", row.startTime, () => new Date(row.startTime).toLocaleString()],
    ["duration", duration, () => duration],
    ["best", best, () => best],
    ["trials", JSON.stringify(row.trialCounts), () => counts(row)],
    ["actions", `${row.status} ${row.mayChange} ${row.name}`, () => actions(row)],
  ];
}

/** Draw ``row`` into ``tr`` (a new one when null), touching only the cells that changed: a button
 * that has the keyboard's focus keeps it while the list is read again every POLL_MS. */
function drawRow(tr, row) {
  if (!tr) {
    tr = h("tr", { dataset: { experiment: row.id } },
      COLUMNS.map(([column]) => h("td", { dataset: { column } })));
  }
  tr.dataset.status = row.status;
  cellsOf(row).forEach(([column, key, draw], i) => {
    const td = tr.children[i];
    if (td.dataset.key === key) return;
    td.dataset.key = key;
    td.replaceChildren(draw());
  });
  return tr;
}

function render(rows) {
  for (const row of rows) {
    row.platforms.forEach((p) => seen.platform.add(p));
    if (row.team) seen.team.add(row.team);
  }
  for (const name of ["platform", "team"]) {
    const list = $(`#experiments-${name}-options`);
    if (list.children.length !== seen[name].size) {
      list.replaceChildren(...[...seen[name]].sort().map((value) => h("option", { value })));
    }
  }
  const body = $("#experiments-rows");
  const held = new Map([...body.querySelectorAll("tr[data-experiment]")].map((tr) => [tr.dataset.experiment, tr]));
  const drawn = rows.map((row) => drawRow(held.get(row.id), row));
  const order = (trs) => trs.map((tr) => tr.dataset.experiment ?? "").join(" ");
  if (!rows.length) {
    body.replaceChildren(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "muted" }, "No experiment matches.")));
  } else if (order([...body.children]) !== order(drawn)) {
    body.replaceChildren(...drawn); // rows came, went or moved
  }
  $("#experiments-count").textContent = `${rows.length} experiment${rows.length === 1 ? "" : "s"}`;
  shown = rows;
  showSelection();
}

async function refresh() {
  const current = view();
  showView(current);
  const query = new URLSearchParams(Object.entries(current).filter(([, v]) => v)).toString();
  const error = $("#experiments-error");
  try {
    const rows = await api("GET", `/api/experiments?${query}`);
    if (JSON.stringify(view()) !== JSON.stringify(current)) return; // the view changed meanwhile: its own read draws
    error.hidden = true;
    live(true);
    render(rows);
    $("#experiments-rows").dataset.drawn = location.search; // the view these rows show (a hook for tests)
    if (!drawn) {
      drawn = true;
      performance.mark("trialbus:experiments");
    }
  } catch (problem) {
    error.hidden = false;
    error.textContent = problem.message;
    live(false);
  }
}

function live(ok) {
  const connection = $("#connection");
  connection.dataset.state = ok ? "live" : "reconnecting";
  connection.textContent = ok ? `live (read every ${POLL_MS / 1000}s)` : "the web UI does not answer";
}

const PAST = { stop: "stopped", resume: "resumed", delete: "deleted" };

async function act(row, action) {
  try {
    await api("POST", `/api/experiments/${encodeURIComponent(row.id)}/${action}`);
    toast(`experiment ${row.id} ${PAST[action]}`);
  } catch (problem) {
    toast(problem.message, true);
  }
  refresh();
}

/** ``action`` on each of ``rows`` where it applies, one after the other; one message for all. */
async function actOn(rows, action) {
  const targets = rows.filter(APPLIES[action]);
  const refused = [];
  for (const row of targets) {
    try {
      await api("POST", `/api/experiments/${encodeURIComponent(row.id)}/${action}`);
    } catch (problem) {
      refused.push(problem.message);
    }
  }
  const done = targets.length - refused.length;
  const said = `${done} of ${targets.length} experiment${targets.length === 1 ? "" : "s"} ${PAST[action]}`;
  toast(refused.length ? `${said}; ${refused[0]}` : said, refused.length > 0);
  if (action === "delete") {
    const ids = selected();
    targets.forEach((r) => ids.delete(r.id));
    setView({ selected: [...ids].join(",") });
  } else {
    refresh();
  }
}

/** Delete ``rows`` (one, or the selected ones) once the person confirms. */
function confirmDelete(rows) {
  rows = [rows].flat().filter(APPLIES.delete);
  if (!rows.length) return;
  const dialog = $("#confirm-delete");
  $("#confirm-delete-title").textContent = rows.length === 1 ? "Delete the experiment?" : `Delete ${rows.length} experiments?`;
  $("#confirm-delete-id").textContent = rows.map((r) => r.id).join(", ");
  dialog.dataset.experiments = rows.map((r) => r.id).join(",");
  dialog.returnValue = ""; // Escape closes without setting it: never a stale "delete"
  dialog.showModal();
  $("#confirm-delete-no").focus();
}

/** Show the list instead of an experiment, and read it again every POLL_MS while the tab is shown. */
export async function showExperiments() {
  build();
  $("#all-experiments").hidden = false;
  $("#experiments-link").setAttribute("aria-current", "page");
  document.title = "Trialbus — all experiments";
  const dialog = $("#confirm-delete");
  dialog.addEventListener("close", () => {
    if (dialog.returnValue !== "delete") return;
    const ids = dialog.dataset.experiments.split(",");
    if (ids.length === 1) act({ id: ids[0] }, "delete");
    else actOn(ids.map((id) => ({ id, status: "" })), "delete");
  });
  const tick = async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      await refresh();
    } finally {
      busy = false;
    }
  };
  document.addEventListener("visibilitychange", tick);
  setInterval(tick, POLL_MS);
  await tick();
}
