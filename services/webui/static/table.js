// The trial table: sortable by any column, filterable by status, a column per parameter.
//
// Built for 1,000 trials changing all the time: each row is created once and updated in
// place (a cell's text is written only when it changed); rows are re-ordered only when
// the order changed; a status filter hides rows instead of removing them. A new
// parameter name (rare) is the only thing that rebuilds the rows.
//
// A retried trial's status reads "FAILED ×2": its current attempt is its second run (attempt 1);
// the detail panel lists the attempts.
//
// Hooks for tests: <tr data-trial-id data-status>, <td data-column>, button.cancel.

import { ACTIVE, formatDuration, formatNumber, formatParameter, h, secondsBetween } from "./util.js";

// Widths are fixed, and each row is a CSS grid with `content-visibility: auto` (style.css):
// the browser lays out and paints only the rows on screen. As a plain table, laying out
// 1,000 rows of a dozen cells after a re-sort took 0.3–0.4 s in a headless Chromium.
const BASE_COLUMNS = [
  { key: "sequence", title: "#", width: 56, value: (t) => t.sequenceId, numeric: true },
  { key: "id", title: "Trial", width: 100, value: (t) => t.id },
  { key: "status", title: "Status", width: 130, value: (t) => t.status,
    text: (t) => (t.attempt ? `${t.status} ×${t.attempt + 1}` : t.status) },
];
const PARAMETER_WIDTH = 130;
const TAIL_COLUMNS = [
  { key: "default", title: "Default metric", width: 130, value: (t) => t.default,
    text: (t) => formatNumber(t.default), numeric: true },
  { key: "intermediate", title: "Intermediate", width: 110, value: (t) => t.intermediateCount, numeric: true },
  { key: "duration", title: "Duration", width: 90, value: (t) => secondsBetween(t.startTime, t.endTime),
    text: (t) => formatDuration(secondsBetween(t.startTime, t.endTime)), numeric: true },
  { key: "platform", title: "Platform", width: 170, value: (t) => `${t.platform}@${t.replica ?? ""}` },
  { key: "actions", title: "", width: 80 },
];

/** Sort order: numbers before text; missing values last whichever the direction. */
function compare(a, b) {
  const missingA = a === null || a === undefined || a === "", missingB = b === null || b === undefined || b === "";
  if (missingA || missingB) return missingA === missingB ? 0 : missingA ? 1 : -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (typeof a === "number") return -1;
  if (typeof b === "number") return 1;
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

export class TrialTable {
  /** table: the <table>; onSelect(id), onCancel(id): what a click on a row or on Cancel does. */
  constructor(table, { onSelect, onCancel }) {
    this.table = table;
    this.head = table.tHead.rows[0];
    table.setAttribute("role", "table"); // rows are CSS grids: say what the markup means
    this.head.setAttribute("role", "row");
    this.body = table.tBodies[0];
    this.onSelect = onSelect;
    this.onCancel = onCancel;
    this.rows = new Map(); // id → { trial, tr, cells, texts }
    this.parameterKeys = [];
    this.sort = { key: "sequence", descending: false };
    this.filter = "";
    this.selected = null;
    this.columns = [];
    this.buildColumns();
    this.body.addEventListener("click", (event) => this.clicked(event));
  }

  buildColumns() {
    const parameters = this.parameterKeys.map((name) => ({
      key: `parameter:${name}`, title: name, parameter: true, width: PARAMETER_WIDTH,
      value: (t) => this.sortable(t.parameters?.[name]), text: (t) => formatParameter(t.parameters?.[name]),
    }));
    this.columns = [...BASE_COLUMNS, ...parameters, ...TAIL_COLUMNS];
    this.table.style.width = `${this.columns.reduce((sum, column) => sum + column.width, 0)}px`;
    // The platform column takes the room left over.
    const tracks = this.columns.map((c) => (c.key === "platform" ? `minmax(${c.width}px, 1fr)` : `${c.width}px`));
    this.table.style.setProperty("--columns", tracks.join(" "));
    this.head.replaceChildren(...this.columns.map((column) => h("th", {
      scope: "col", role: "columnheader", class: column.parameter ? "parameter" : null, dataset: { column: column.key },
      title: column.key === "actions" ? null : `sort by ${column.title}`,
      onclick: column.key === "actions" ? null : () => this.sortBy(column.key),
    }, column.title)));
    this.markSort();
  }

  sortable(value) {
    return typeof value === "number" ? value : formatParameter(value);
  }

  /** Drop every row (a snapshot follows). */
  clear() {
    this.rows.clear();
    this.body.replaceChildren();
    this.parameterKeys = [];
    this.buildColumns();
  }

  /** Add or update rows; remove the ids in `removed`. Returns nothing; the DOM is current. */
  apply(trials, removed = []) {
    for (const id of removed) {
      this.rows.get(id)?.tr.remove();
      this.rows.delete(id);
    }
    const newKeys = [];
    for (const trial of trials) {
      for (const name of Object.keys(trial.parameters ?? {})) {
        if (!this.parameterKeys.includes(name) && !newKeys.includes(name)) newKeys.push(name);
      }
    }
    if (newKeys.length) {
      this.parameterKeys.push(...newKeys);
      this.buildColumns();
      for (const row of this.rows.values()) this.build(row);
    }
    const sortColumn = this.column(this.sort.key);
    let reorder = removed.length > 0 || newKeys.length > 0; // rebuilt rows replace the old ones
    for (const trial of trials) {
      let row = this.rows.get(trial.id);
      if (!row) {
        row = { trial, tr: null, cells: [], texts: [] };
        this.rows.set(trial.id, row);
        this.build(row);
        reorder = true;
      } else {
        if (!reorder && compare(sortColumn.value(row.trial), sortColumn.value(trial)) !== 0) reorder = true;
        row.trial = trial;
        this.fill(row);
      }
    }
    if (reorder) this.order();
  }

  column(key) {
    return this.columns.find((c) => c.key === key) ?? this.columns[0];
  }

  build(row) {
    row.cells = this.columns.map((column) => h("td", {
      role: "cell", dataset: { column: column.key }, class: column.numeric ? "num" : column.parameter ? "parameter" : null,
    }));
    row.texts = this.columns.map(() => null);
    row.tr = h("tr", { role: "row", dataset: { trialId: row.trial.id } }, row.cells);
    if (row.trial.id === this.selected) row.tr.classList.add("selected");
    this.fill(row);
  }

  /** Write the row's cells from its trial, touching only what changed. */
  fill(row) {
    const trial = row.trial;
    if (row.tr.dataset.status !== trial.status) {
      row.tr.dataset.status = trial.status;
      row.tr.hidden = Boolean(this.filter) && trial.status !== this.filter;
    }
    this.columns.forEach((column, i) => {
      const cell = row.cells[i];
      if (column.key === "actions") {
        const active = ACTIVE.has(trial.status);
        if (row.texts[i] !== active) {
          row.texts[i] = active;
          cell.replaceChildren(active ? h("button", { class: "cancel", type: "button" }, "Cancel") : "");
        }
        return;
      }
      if (column.key === "platform") {
        const key = `${trial.platform}|${trial.replica}|${trial.link}`;
        if (row.texts[i] !== key) {
          row.texts[i] = key;
          const where = trial.replica ? `${trial.platform}@${trial.replica}` : trial.platform;
          const link = trial.link && h("a", { href: trial.link, target: "_blank", rel: "noopener" }, where);
          cell.replaceChildren(link || where);
        }
        return;
      }
      const text = column.text ? column.text(trial) : String(column.value(trial) ?? "");
      if (row.texts[i] !== text) {
        row.texts[i] = text;
        cell.textContent = text;
        if (column.key === "status") {
          cell.dataset.status = trial.status;
          cell.title = trial.attempt ? `attempt ${trial.attempt}: run ${trial.attempt + 1} of this trial` : "";
        }
        if (column.parameter) cell.title = text; // the whole value, where the cell cuts it
      }
    });
  }

  /** Put the rows in the sort order, moving DOM nodes only if the order changed. */
  order() {
    const column = this.column(this.sort.key), sign = this.sort.descending ? -1 : 1;
    const isMissing = (v) => v === null || v === undefined || v === "";
    // Each row's key is computed once, not once per comparison (formatting a parameter is not free).
    const keyed = [...this.rows.values()].map((row) => [column.value(row.trial), row]);
    keyed.sort(([va, a], [vb, b]) => {
      const byColumn = isMissing(va) !== isMissing(vb) ? compare(va, vb) : sign * compare(va, vb);
      return byColumn || a.trial.sequenceId - b.trial.sequenceId;
    });
    const current = this.body.children;
    if (current.length === keyed.length && keyed.every(([, row], i) => current[i] === row.tr)) return;
    this.body.replaceChildren(...keyed.map(([, row]) => row.tr));
  }

  sortBy(key) {
    this.sort = { key, descending: this.sort.key === key ? !this.sort.descending : false };
    this.markSort();
    this.order();
  }

  markSort() {
    for (const th of this.head.cells) {
      const sorted = th.dataset.column === this.sort.key;
      if (sorted) th.setAttribute("aria-sort", this.sort.descending ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    }
  }

  setFilter(status) {
    this.filter = status;
    for (const row of this.rows.values()) row.tr.hidden = Boolean(status) && row.trial.status !== status;
  }

  /** Rows shown under the filter. */
  shown() {
    if (!this.filter) return this.rows.size;
    let n = 0;
    for (const row of this.rows.values()) if (row.trial.status === this.filter) n += 1;
    return n;
  }

  select(id) {
    this.rows.get(this.selected)?.tr.classList.remove("selected");
    this.selected = id;
    this.rows.get(id)?.tr.classList.add("selected");
  }

  /** Refresh the duration of running trials (their clock moves without events). */
  tick() {
    const i = this.columns.findIndex((c) => c.key === "duration");
    for (const row of this.rows.values()) {
      if (row.trial.status !== "RUNNING") continue;
      const text = this.columns[i].text(row.trial);
      if (row.texts[i] !== text) {
        row.texts[i] = text;
        row.cells[i].textContent = text;
      }
    }
  }

  clicked(event) {
    const tr = event.target.closest("tr[data-trial-id]");
    if (!tr) return;
    if (event.target.closest("button.cancel")) {
      event.stopPropagation();
      this.onCancel(tr.dataset.trialId);
    } else if (!event.target.closest("a")) {
      this.onSelect(tr.dataset.trialId);
    }
  }
}
