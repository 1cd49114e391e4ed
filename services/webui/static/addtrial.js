// Add a trial (NNI's "customized trial"): one more trial of a running experiment, its parameters typed
// (as JSON, or field by field) or copied from another trial, sent as the person logged in
// (POST /api/experiments/<id>/trials; the dispatcher checks who may, and the experiment's limits).
//
// Reached from the overview's "Add trial" button, and from a trial's detail ("Copy to a new trial").
// The URL holds the open form: ?add= (blank: the search space's first values) or ?add=<trial id> (copied
// from that trial), so a link opens the same form. A viewer, or a member of another team, gets no button
// (the web UI and the dispatcher refuse them anyway: 403).
//
// Hooks for tests: #add-trial, #detail-copy, #add-trial-dialog, #add-trial-from (a trial's number) and
// #add-trial-copy, #add-trial-fields input[data-name], #add-trial-json, #add-trial-note, #add-trial-error,
// #add-trial-submit; the performance mark "trialbus:addtrial" (the form first drawn).

import { formatParameter, h, toast } from "./util.js";

const PARAM = "add";

/** A first value for each parameter of an NNI search space: a choice's first option, a range's low end. */
export function fromSearchSpace(space) {
  const parameters = {};
  if (!space || typeof space !== "object") return parameters;
  for (const [name, spec] of Object.entries(space)) {
    const values = spec?._value;
    if (!Array.isArray(values) || !values.length) continue;
    const first = values[0];
    if (spec._type === "choice" && first && typeof first === "object" && "_name" in first) {
      const { _name: chosen, ...nested } = first; // a nested choice: its name and its own parameters' first values
      parameters[name] = { _name: chosen, ...fromSearchSpace(nested) };
    } else {
      parameters[name] = first;
    }
  }
  return parameters;
}

/** A field's text as a value: JSON where it reads as JSON (5, true, [1, 2], {"a": 1}), else the text. */
function valueOf(text, wasString) {
  if (wasString) return text;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

async function post(url, body) {
  let answer;
  try {
    answer = await fetch(url, {
      method: "POST",
      headers: { Accept: "application/json", "Content-Type": "application/json" },
      credentials: "same-origin",
      body: JSON.stringify(body),
    });
  } catch (error) {
    throw new Error(`the web UI is unreachable (${error.message})`);
  }
  const reply = await answer.json().catch(() => null);
  if (!answer.ok) throw new Error(reply?.error ?? `POST ${url} answered ${answer.status}`);
  return reply;
}

export class AddTrial {
  /** ``currentTrial()``: the trial the detail drawer shows (to copy from it). */
  constructor({ currentTrial }) {
    this.currentTrial = currentTrial;
    this.experiment = null;
    this.may = false;
    this.drawn = false;
    this.urlRead = false; // ?add= is read once, when the person may add trials
    this.button = h("button", { id: "add-trial", type: "button", hidden: true, onclick: () => this.open(null) },
      "Add trial");
    document.querySelector("#overview .title")?.append(this.button);
    this.copyButton = h("button", {
      id: "detail-copy", type: "button", hidden: true,
      onclick: () => this.currentTrial() && this.open(this.currentTrial()),
    }, "Copy to a new trial");
    document.querySelector("#trial-detail .actions")?.append(this.copyButton);
    this.buildDialog();
  }

  buildDialog() {
    this.from = h("input", { id: "add-trial-from", type: "number", min: "0", step: "1", inputmode: "numeric",
      placeholder: "No.", "aria-label": "Copy the parameters of trial number" });
    this.fields = h("div", { id: "add-trial-fields", role: "group", "aria-label": "Parameters, one field each" });
    this.json = h("textarea", { id: "add-trial-json", rows: "6", spellcheck: "false",
      "aria-label": "Parameters as a JSON object", oninput: () => this.fromJson() });
    this.note = h("p", { id: "add-trial-note", class: "muted", role: "status" });
    this.error = h("p", { id: "add-trial-error", class: "error", role: "alert", hidden: true });
    this.submit = h("button", { id: "add-trial-submit", type: "submit", value: "add" }, "Add trial");
    const copy = h("button", { id: "add-trial-copy", type: "button", onclick: () => this.copyNumber() }, "Copy");
    this.from.addEventListener("keydown", (event) => {
      if (event.key === "Enter") { event.preventDefault(); this.copyNumber(); }
    });
    this.dialog = h("dialog", { id: "add-trial-dialog", "aria-labelledby": "add-trial-title" },
      h("form", { method: "dialog", onsubmit: (event) => this.send(event) },
        h("h2", { id: "add-trial-title" }, "Add a trial"),
        h("p", { class: "muted" }, "It runs once a slot is free, and its result reaches the tuner like its own trials' ",
          "(NNI's customized trial)."),
        h("p", {}, h("label", {}, "Copy from trial ", this.from), " ", copy),
        h("h3", {}, "Parameters"), this.fields,
        h("label", { class: "block" }, "As JSON", this.json),
        this.note, this.error,
        h("menu", {},
          h("button", { type: "button", onclick: () => this.dialog.close() }, "Cancel"), this.submit)));
    this.dialog.addEventListener("close", () => this.setUrl(null));
    document.body.append(this.dialog);
  }

  /** The experiment changed (or who may change it): the buttons, and the form's limits note. */
  update(experiment, may) {
    this.experiment = experiment;
    this.may = may;
    this.button.hidden = !may;
    this.copyButton.hidden = !may;
    this.renderNote();
    if (may && !this.urlRead) {
      this.urlRead = true;
      this.openFromUrl();
    }
  }

  /** Why no trial can be added now, or null. */
  refusal() {
    const e = this.experiment;
    if (!e) return "the experiment is not loaded yet";
    if (e.status !== "RUNNING") return `The experiment is ${e.status}: it takes no more trials.`;
    if (e.maxTrialNumber && e.trialCount >= e.maxTrialNumber) {
      return `The experiment has reached maxTrialNumber (${e.maxTrialNumber} trials): raise maxTrialNumber to add one.`;
    }
    if (e.noMoreTrials) return "The tuner has no more trials: the experiment takes no more.";
    return null;
  }

  renderNote() {
    const why = this.refusal();
    const e = this.experiment;
    const left = e?.maxTrialNumber ? ` (${e.trialCount} of maxTrialNumber ${e.maxTrialNumber} so far)` : "";
    this.note.textContent = why ?? `It counts toward maxTrialNumber like the tuner's trials${left}.`;
    this.note.dataset.refused = why ? "true" : "false";
    this.submit.disabled = Boolean(why);
  }

  openFromUrl() {
    const wanted = new URLSearchParams(location.search).get(PARAM);
    if (wanted === null) return;
    if (!wanted) this.open(null);
    else fetch(`/api/trials/${encodeURIComponent(wanted)}`, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`no trial ${wanted}`))))
      .then((trial) => this.open(trial), (error) => toast(error.message, true));
  }

  setUrl(trialId) {
    const url = new URL(location.href);
    if (trialId === null) url.searchParams.delete(PARAM);
    else url.searchParams.set(PARAM, trialId);
    history.replaceState(history.state, "", url);
  }

  /** Open the form, copied from ``trial`` (its parameters) or blank (the search space's first values). */
  open(trial) {
    if (!this.experiment) return;
    this.error.hidden = true;
    this.from.value = trial ? String(trial.sequenceId) : "";
    this.setParameters(trial ? trial.parameters : fromSearchSpace(this.experiment.config?.searchSpace));
    this.renderNote();
    this.setUrl(trial ? trial.id : "");
    if (!this.dialog.open) this.dialog.showModal();
    (this.fields.querySelector("input") ?? this.json).focus();
    if (!this.drawn) {
      this.drawn = true;
      performance.mark("trialbus:addtrial");
    }
  }

  /** Copy the parameters of the trial whose number is typed: one row read, at that position (O(log n)). */
  async copyNumber() {
    const number = Number(this.from.value);
    if (!Number.isInteger(number) || number < 0) {
      this.showError("Type a trial's number (0, 1, 2…) to copy its parameters.");
      return;
    }
    const id = encodeURIComponent(this.experiment.id);
    try {
      const answer = await fetch(`/api/experiments/${id}/trials?offset=${number}&limit=1`, { credentials: "same-origin" });
      const window = await answer.json();
      const trial = window.trials?.[0];
      if (!answer.ok || !trial || trial.sequenceId !== number) throw new Error(window.error ?? `there is no trial ${number}`);
      this.error.hidden = true;
      this.setParameters(trial.parameters);
      this.setUrl(trial.id);
    } catch (error) {
      this.showError(error.message);
    }
  }

  setParameters(parameters) {
    this.json.value = JSON.stringify(parameters ?? {}, null, 2);
    this.drawFields(parameters ?? {});
  }

  /** One labelled field per parameter; a field's change rewrites the JSON. */
  drawFields(parameters) {
    const inputs = Object.entries(parameters).map(([name, value]) => {
      const wasString = typeof value === "string";
      const input = h("input", {
        type: "text", dataset: { name, string: String(wasString) }, "aria-label": `Parameter ${name}`,
        title: wasString ? "text" : "a number, true/false, or JSON",
        oninput: () => this.fromFields(),
      });
      input.value = wasString ? value : JSON.stringify(value);
      return h("label", { class: "field" }, h("span", {}, name), input,
        value && typeof value === "object" ? h("small", { class: "muted" }, formatParameter(value)) : null);
    });
    this.fields.replaceChildren(...(inputs.length ? inputs : [h("p", { class: "muted" },
      "No parameters: type them as JSON below.")]));
  }

  fromFields() {
    const parameters = this.parsed() ?? {};
    for (const input of this.fields.querySelectorAll("input[data-name]")) {
      parameters[input.dataset.name] = valueOf(input.value, input.dataset.string === "true");
    }
    this.json.value = JSON.stringify(parameters, null, 2);
    this.error.hidden = true;
  }

  fromJson() {
    const parameters = this.parsed();
    if (!parameters) return; // mid-typing: the fields wait for valid JSON
    const names = [...this.fields.querySelectorAll("input[data-name]")].map((i) => i.dataset.name);
    if (names.join("\n") !== Object.keys(parameters).join("\n")) this.drawFields(parameters);
    else for (const input of this.fields.querySelectorAll("input[data-name]")) {
      const value = parameters[input.dataset.name];
      const text = typeof value === "string" ? value : JSON.stringify(value);
      if (document.activeElement !== input) input.value = text;
    }
    this.error.hidden = true;
  }

  /** The JSON text as an object, or null (not JSON, or not an object). */
  parsed() {
    try {
      const value = JSON.parse(this.json.value);
      return value && typeof value === "object" && !Array.isArray(value) ? value : null;
    } catch {
      return null;
    }
  }

  showError(message) {
    this.error.textContent = message;
    this.error.hidden = false;
  }

  async send(event) {
    event.preventDefault();
    const parameters = this.parsed();
    if (!parameters) {
      this.showError('Parameters must be a JSON object of names and values, e.g. {"lr": 0.01, "batch_size": 32}.');
      return;
    }
    this.submit.disabled = true;
    try {
      const added = await post(`/api/experiments/${encodeURIComponent(this.experiment.id)}/trials`, { parameters });
      this.dialog.close();
      toast(`trial ${added.sequenceId} added (${added.status}): ${JSON.stringify(parameters)}`);
    } catch (error) {
      this.showError(error.message);
    } finally {
      this.renderNote();
    }
  }
}
