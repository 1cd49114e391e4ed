// The trial table's rows, as the server sorts and filters them, fetched by position.
//
// The browser never holds every trial: it asks /api/experiments/<id>/trials?offset=… for blocks
// of BLOCK rows around what is on screen, keeps at most KEPT_BLOCKS of them (the least recently
// shown go first), and knows the number of rows under the filter from the server (`total`).
// A change of sort or filter drops every block. Live changes (app.js) update rows held in
// place; when rows may have moved (a trial ended under a sort by metric, rows were added or
// removed under the filter, or the server said "stale") `refresh()` refetches the blocks on
// screen, at most once per REFRESH_MS, keeping the old rows on screen until the new ones come.
//
// Memory: at most KEPT_BLOCKS × BLOCK rows (2,000 by default) whatever the experiment's size.

import { api } from "./util.js";

export const BLOCK = 100;
const KEPT_BLOCKS = 20;
const IN_FLIGHT = 3;
const REFRESH_MS = 500;

export class TrialRows {
  /** onLoaded(): rows arrived (draw again). */
  constructor(onLoaded) {
    this.onLoaded = onLoaded;
    this.experimentId = null;
    this.view = { sort: "sequence", order: "asc", status: "" };
    this.total = 0;
    this.blocks = new Map(); // block index → { rows, generation, used }
    this.generation = 0; // bumped by refresh(): blocks of older generations are refetched when shown
    this.inFlight = new Set(); // block indexes being fetched
    this.wanted = [0, 0]; // the positions on screen (first, last), from the table
    this.lastRefresh = 0;
    this.refreshTimer = 0;
    this.uses = 0;
  }

  /** A new experiment (or a new snapshot of it): `rows` are its first rows in submission order. */
  reset(experimentId, rows, total) {
    this.experimentId = experimentId;
    this.blocks.clear();
    this.inFlight.clear();
    this.generation += 1;
    this.total = total;
    if (this.isDefaultView() && rows.length) this.store(0, rows, this.generation);
  }

  isDefaultView() {
    return this.view.sort === "sequence" && this.view.order === "asc" && !this.view.status;
  }

  key() {
    return `${this.experimentId}|${this.view.sort}|${this.view.order}|${this.view.status}`;
  }

  setView(view) {
    this.view = { ...this.view, ...view };
    this.blocks.clear();
    this.inFlight.clear();
    this.generation += 1;
    this.fetchWanted();
  }

  /** The row at a position, if held (possibly from before the latest refresh). */
  at(position) {
    const block = this.blocks.get(Math.floor(position / BLOCK));
    if (!block) return undefined;
    block.used = ++this.uses;
    return block.rows[position % BLOCK];
  }

  /** The held row of a trial, and where it is; undefined if none holds it. */
  find(id) {
    for (const [index, block] of this.blocks) {
      const i = block.rows.findIndex((row) => row.id === id);
      if (i >= 0) return { row: block.rows[i], position: index * BLOCK + i };
    }
    return undefined;
  }

  /** Replace held rows by newer ones (from a live update); the ids none holds are returned. */
  patch(rows) {
    const byId = new Map(rows.map((row) => [row.id, row]));
    for (const block of this.blocks.values()) {
      block.rows.forEach((row, i) => {
        const newer = byId.get(row.id);
        if (newer) {
          block.rows[i] = newer;
          byId.delete(row.id);
        }
      });
    }
    return [...byId.values()];
  }

  /** The table shows positions first..last: fetch what is missing or old. */
  show(first, last) {
    this.wanted = [first, last];
    this.fetchWanted();
  }

  fetchWanted() {
    if (!this.experimentId) return;
    const [first, last] = this.wanted;
    const lastBlock = Math.min(Math.floor(Math.max(0, this.total - 1) / BLOCK), Math.floor(last / BLOCK));
    for (let index = Math.floor(first / BLOCK); index <= lastBlock; index += 1) {
      const block = this.blocks.get(index);
      if (block && block.generation === this.generation) continue;
      if (this.inFlight.has(index) || this.inFlight.size >= IN_FLIGHT) continue;
      this.fetch(index);
    }
    if (this.total === 0 && !this.blocks.size && !this.inFlight.has(0)) this.fetch(0); // learn the total
  }

  async fetch(index) {
    const key = this.key(), generation = this.generation;
    this.inFlight.add(index);
    const query = new URLSearchParams({ offset: String(index * BLOCK), limit: String(BLOCK), sort: this.view.sort,
      order: this.view.order });
    if (this.view.status) query.set("status", this.view.status);
    let answer = null;
    try {
      answer = await api("GET", `/api/experiments/${encodeURIComponent(this.experimentId)}/trials?${query}`);
    } catch {
      // the next refresh or scroll asks again
    }
    if (key !== this.key()) return; // another view now: its own fetches are under way
    this.inFlight.delete(index);
    if (answer) {
      this.total = answer.total;
      this.store(index, answer.trials, generation);
      this.onLoaded();
    }
    this.fetchWanted();
  }

  store(index, rows, generation) {
    this.blocks.set(index, { rows, generation, used: ++this.uses });
    if (this.blocks.size <= KEPT_BLOCKS) return;
    const oldest = [...this.blocks.entries()].sort((a, b) => a[1].used - b[1].used)[0][0];
    this.blocks.delete(oldest);
  }

  /** Rows may have moved: refetch those on screen, at most once per REFRESH_MS. */
  refresh() {
    if (this.refreshTimer) return;
    const wait = Math.max(0, REFRESH_MS - (performance.now() - this.lastRefresh));
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = 0;
      this.lastRefresh = performance.now();
      this.generation += 1;
      this.fetchWanted();
    }, wait);
  }

  /** Rows held: for a test or a profile (bounded by KEPT_BLOCKS × BLOCK). */
  held() {
    let n = 0;
    for (const block of this.blocks.values()) n += block.rows.length;
    return n;
  }
}
