// The trial table: virtualised (only the rows on screen are in the DOM), sorted and filtered on
// the server (virtual.js fetches the rows by position), a column per parameter.
//
// Built for 100,000 trials: the body is as tall as every row would be (rows × ROW_HEIGHT) and
// holds a small pool of row elements, placed at the positions on screen (plus OVERSCAN above and
// below) and refilled as the user scrolls; a cell's text is written only when it changed. Sorts:
// "#" (submission order, either way) and "Default metric" (best first, then worst first; trials
// without one last), which the server keeps indexed; the status filter is the server's too. A
// new parameter name (rare) is the only thing that rebuilds the columns.
//
// A retried trial's status reads "FAILED ×2": its current attempt is its second run (attempt 1);
// the detail panel lists the attempts.
//
// A checkbox per row picks trials to compare (compare.js); Space toggles it, as any checkbox.
//
// Hooks for tests: <tr data-trial-id data-status data-position>, <td data-column>, button.cancel, input.pick,
// #trials[data-total] (rows under the filter), #trials[data-sort], #trials[data-order].

import { ACTIVE, formatDuration, formatNumber, formatParameter, h, oncePerFrame, secondsBetween } from "./util.js";

export const ROW_HEIGHT = 27; // px, as style.css sets
const OVERSCAN = 10;
// Widths are fixed; each row is a CSS grid (style.css).
const BASE_COLUMNS = [
  { key: "pick", title: "✓", width: 34, label: "Compare: check rows, then Compare selected" },
  { key: "sequence", title: "#", width: 56, value: (t) => t.sequenceId, numeric: true, sort: "sequence" },
  { key: "id", title: "Trial", width: 100, value: (t) => t.id },
  { key: "status", title: "Status", width: 130, value: (t) => t.status,
    text: (t) => (t.attempt ? `${t.status} ×${t.attempt + 1}` : t.status) },
];
const PARAMETER_WIDTH = 130;
const TAIL_COLUMNS = [
  { key: "default", title: "Default metric", width: 130, value: (t) => t.default,
    text: (t) => formatNumber(t.default), numeric: true, sort: "metric" },
  { key: "intermediate", title: "Intermediate", width: 110, value: (t) => t.intermediateCount, numeric: true },
  { key: "duration", title: "Duration", width: 90, value: (t) => secondsBetween(t.startTime, t.endTime),
    text: (t) => formatDuration(secondsBetween(t.startTime, t.endTime)), numeric: true },
  { key: "platform", title: "Platform", width: 170, value: (t) => `${t.platform}@${t.replica ?? ""}` },
  { key: "actions", title: "", width: 80 },
];

export class TrialTable {
  /**
   * table: the <table>, inside its scrolling .table-wrap; rows: a TrialRows (virtual.js);
   * onSelect(id), onCancel(id): what a click on a row or on Cancel does; onCheck(): a row's
   * checkbox changed (the ids checked are in this.checked).
   */
  constructor(table, rows, { onSelect, onCancel, onCheck = () => {} }) {
    this.table = table;
    this.rows = rows;
    this.scroller = table.closest(".table-wrap");
    this.head = table.tHead.rows[0];
    table.setAttribute("role", "table"); // rows are CSS grids: say what the markup means
    this.head.setAttribute("role", "row");
    this.body = table.tBodies[0];
    this.onSelect = onSelect;
    this.onCancel = onCancel;
    this.onCheck = onCheck;
    /** The ids of the rows checked (to compare), in the order checked. */
    this.checked = new Set();
    /** Whether the person logged in may change this experiment's trials (no Cancel buttons otherwise). */
    this.mayChange = true;
    this.pool = []; // { tr, cells, texts, trial }
    this.parameterKeys = [];
    this.selected = null;
    this.columns = [];
    /** Draw once per animation frame, however many times asked. */
    this.schedule = oncePerFrame(() => this.draw());
    this.buildColumns();
    this.body.addEventListener("click", (event) => this.clicked(event));
    this.scroller.addEventListener("scroll", () => this.schedule(), { passive: true });
    if (typeof ResizeObserver === "function") new ResizeObserver(() => this.schedule()).observe(this.scroller);
  }

  buildColumns() {
    const parameters = this.parameterKeys.map((name) => ({
      key: `parameter:${name}`, title: name, parameter: true, width: PARAMETER_WIDTH,
      value: (t) => t.parameters?.[name], text: (t) => formatParameter(t.parameters?.[name]),
    }));
    this.columns = [...BASE_COLUMNS, ...parameters, ...TAIL_COLUMNS];
    this.table.style.width = `${this.columns.reduce((sum, column) => sum + column.width, 0)}px`;
    // The platform column takes the room left over.
    const tracks = this.columns.map((c) => (c.key === "platform" ? `minmax(${c.width}px, 1fr)` : `${c.width}px`));
    this.table.style.setProperty("--columns", tracks.join(" "));
    this.head.replaceChildren(...this.columns.map((column) => h("th", {
      scope: "col", role: "columnheader", class: [column.parameter ? "parameter" : "", column.sort ? "sortable" : ""]
        .filter(Boolean).join(" ") || null, dataset: { column: column.key },
      title: column.sort ? `sort by ${column.title}` : column.label ?? null, "aria-label": column.label ?? null,
      onclick: column.sort ? () => this.sortBy(column.sort) : null,
    }, column.title)));
    for (const row of this.pool) row.tr.remove();
    this.pool = [];
    this.markSort();
  }

  /** Drop every row (a snapshot follows). */
  clear() {
    this.scroller.scrollTop = 0;
    this.parameterKeys = [];
    this.buildColumns();
    this.draw();
  }

  /** Place the pool's rows at the positions on screen and fill them from the rows held. */
  draw() {
    const total = this.rows.total;
    this.body.style.height = `${total * ROW_HEIGHT}px`;
    this.table.dataset.total = String(total);
    const top = Math.max(0, this.scroller.scrollTop - this.table.tHead.offsetHeight);
    const height = this.scroller.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(total - 1, Math.ceil((top + height) / ROW_HEIGHT) + OVERSCAN);
    this.rows.show(first, Math.max(first, last));
    const shown = [];
    for (let position = first; position <= last; position += 1) {
      const trial = this.rows.at(position);
      if (trial) shown.push([position, trial]);
    }
    const newKeys = [];
    for (const [, trial] of shown) {
      for (const name of Object.keys(trial.parameters ?? {})) {
        if (!this.parameterKeys.includes(name) && !newKeys.includes(name)) newKeys.push(name);
      }
    }
    if (newKeys.length) {
      this.parameterKeys.push(...newKeys);
      this.buildColumns();
    }
    while (this.pool.length < shown.length) this.pool.push(this.build());
    while (this.pool.length > shown.length) this.pool.pop().tr.remove();
    shown.forEach(([position, trial], i) => {
      const row = this.pool[i];
      row.trial = trial;
      if (row.position !== position) {
        row.position = position;
        row.tr.style.transform = `translateY(${position * ROW_HEIGHT}px)`;
        row.tr.dataset.position = String(position);
      }
      this.fill(row);
      if (!row.tr.isConnected) this.body.append(row.tr);
    });
  }

  build() {
    const cells = this.columns.map((column) => h("td", {
      role: "cell", dataset: { column: column.key }, class: column.numeric ? "num" : column.parameter ? "parameter" : null,
    }));
    return { cells, texts: this.columns.map(() => null), tr: h("tr", { role: "row" }, cells), trial: null, position: -1 };
  }

  /** Write the row's cells from its trial, touching only what changed. */
  fill(row) {
    const trial = row.trial;
    if (row.tr.dataset.trialId !== trial.id) {
      row.tr.dataset.trialId = trial.id;
      row.tr.classList.toggle("selected", trial.id === this.selected);
    }
    if (row.tr.dataset.status !== trial.status) row.tr.dataset.status = trial.status;
    this.columns.forEach((column, i) => {
      const cell = row.cells[i];
      if (column.key === "actions") {
        const active = ACTIVE.has(trial.status) && this.mayChange;
        if (row.texts[i] !== active) {
          row.texts[i] = active;
          cell.replaceChildren(active ? h("button", { class: "cancel", type: "button" }, "Cancel") : "");
        }
        return;
      }
      if (column.key === "pick") {
        if (!cell.firstChild) cell.append(h("input", { type: "checkbox", class: "pick" }));
        const box = cell.firstChild, label = `compare trial ${trial.sequenceId} (${trial.id})`;
        box.checked = this.checked.has(trial.id);
        if (box.getAttribute("aria-label") !== label) box.setAttribute("aria-label", label);
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

  /** "#": submission order, then newest first; "Default metric": best first, then worst first. */
  sortBy(sort) {
    const order = this.rows.view.sort === sort && this.rows.view.order === "asc" ? "desc" : "asc";
    this.scroller.scrollTop = 0;
    this.rows.setView({ sort, order });
    this.markSort();
    this.draw();
  }

  setFilter(status) {
    this.scroller.scrollTop = 0;
    this.rows.setView({ status });
    this.draw();
  }

  markSort() {
    const { sort, order } = this.rows.view;
    this.table.dataset.sort = sort;
    this.table.dataset.order = order;
    for (const th of this.head.cells) {
      const column = this.columns.find((c) => c.key === th.dataset.column);
      if (column?.sort === sort) th.setAttribute("aria-sort", order === "asc" ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
  }

  /** Scroll so that the row at this position is on screen. */
  scrollTo(position) {
    this.scroller.scrollTop = position * ROW_HEIGHT;
    this.draw();
  }

  select(id) {
    this.selected = id;
    for (const row of this.pool) row.tr.classList.toggle("selected", row.trial?.id === id);
  }

  /** Refresh the duration of running trials on screen (their clock moves without events). */
  tick() {
    const i = this.columns.findIndex((c) => c.key === "duration");
    for (const row of this.pool) {
      if (row.trial?.status !== "RUNNING") continue;
      const text = this.columns[i].text(row.trial);
      if (row.texts[i] !== text) {
        row.texts[i] = text;
        row.cells[i].textContent = text;
      }
    }
  }

  /** Check these rows (and only these). */
  setChecked(ids) {
    this.checked = new Set(ids);
    for (const row of this.pool) if (row.trial) this.fill(row);
  }

  clicked(event) {
    const tr = event.target.closest("tr[data-trial-id]");
    if (!tr) return;
    if (event.target.matches("input.pick")) {
      if (event.target.checked) this.checked.add(tr.dataset.trialId);
      else this.checked.delete(tr.dataset.trialId);
      this.onCheck();
    } else if (event.target.closest("td[data-column='pick']")) {
      return; // a click beside the checkbox: not a click on the row
    } else if (event.target.closest("button.cancel")) {
      event.stopPropagation();
      this.onCancel(tr.dataset.trialId);
    } else if (!event.target.closest("a")) {
      this.onSelect(tr.dataset.trialId);
    }
  }
}
