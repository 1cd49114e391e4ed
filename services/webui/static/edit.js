// Edit a running experiment (nnictl update, from its page): trialConcurrency, maxTrialNumber,
// maxExperimentDuration and the search space, in a small dialog. Only the fields changed are sent,
// as PATCH /api/experiments/{id}, which the web UI forwards to the dispatcher as the person logged
// in: the dispatcher checks who may (the button is hidden for those who may not, as Stop is) and
// validates; its message is shown in the dialog, which stays open until the change is taken.
// The dialog's being open is in the URL (?edit=1), so a reload or a shared link opens it again.

import { h, toast } from "./util.js";

const FIELDS = [
  { key: "trialConcurrency", label: "Concurrency", hint: "trials at once", type: "number" },
  { key: "maxTrialNumber", label: "Max trials", hint: "at least the trials submitted", type: "number" },
  { key: "maxExperimentDuration", label: "Max duration", hint: "e.g. 30m, 2h, 1d, or seconds", type: "text" },
];

/** "7200" seconds as the form shows it: "2h" when whole hours, "30m" when whole minutes. */
function shownDuration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds % 3600 === 0) return `${seconds / 3600}h`;
  if (seconds % 60 === 0) return `${seconds / 60}m`;
  return `${seconds}s`;
}

/** What the form shows for a config's field. */
function shown(config, key) {
  if (key === "maxExperimentDuration") return shownDuration(config.maxExperimentDuration);
  const value = config[key];
  return value === null || value === undefined ? "" : String(value);
}

/** The Edit button's dialog; `current()` is the experiment the page shows (null until loaded). */
export function setUpEdit(button, current) {
  const error = h("p", { id: "edit-error", class: "error", role: "alert" });
  const inputs = Object.fromEntries(FIELDS.map((f) => [
    f.key,
    h("input", { id: `edit-${f.key}`, name: f.key, type: f.type, min: f.type === "number" ? 1 : null, step: f.type === "number" ? 1 : null, "aria-describedby": `edit-${f.key}-hint` }),
  ]));
  const space = h("textarea", { id: "edit-searchSpace", name: "searchSpace", rows: 8, spellcheck: "false", "aria-describedby": "edit-searchSpace-hint" });
  const save = h("button", { id: "edit-save", type: "submit" }, "Save");
  const cancel = h("button", { id: "edit-cancel", type: "button" }, "Cancel");
  const form = h("form", { id: "edit-form" },
    h("h2", { id: "edit-title" }, "Edit experiment"),
    ...FIELDS.map((f) => h("p", {},
      h("label", { for: `edit-${f.key}` }, f.label), " ", inputs[f.key], " ",
      h("small", { id: `edit-${f.key}-hint`, class: "muted" }, f.hint))),
    h("p", {}, h("label", { for: "edit-searchSpace" }, "Search space (JSON)"), h("br"), space,
      h("small", { id: "edit-searchSpace-hint", class: "muted" }, " NNI's format; the tuner proposes from it next")),
    error,
    h("menu", {}, cancel, save));
  const dialog = h("dialog", { id: "edit-experiment-dialog", "aria-labelledby": "edit-title" }, form);
  document.body.append(dialog);

  const setOpen = (open) => {
    const url = new URL(location.href);
    if (open) url.searchParams.set("edit", "1");
    else url.searchParams.delete("edit");
    history.replaceState(history.state, "", url);
  };
  const open = () => {
    const experiment = current();
    if (!experiment || button.hidden || button.disabled) return;
    const config = experiment.config ?? {};
    for (const f of FIELDS) inputs[f.key].value = shown(config, f.key);
    space.value = config.searchSpace ? JSON.stringify(config.searchSpace, null, 2) : "";
    error.textContent = "";
    dialog.showModal();
    setOpen(true);
  };
  button.addEventListener("click", open);
  cancel.addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", () => setOpen(false));

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const experiment = current();
    const config = experiment.config ?? {};
    const changes = {};
    for (const f of FIELDS) {
      const text = inputs[f.key].value.trim();
      if (text === shown(config, f.key)) continue;
      changes[f.key] = f.type === "number" ? Number(text) : (/^\d+(\.\d+)?$/.test(text) ? Number(text) : text);
    }
    const was = config.searchSpace ? JSON.stringify(config.searchSpace, null, 2) : "";
    if (space.value.trim() !== was.trim()) {
      try {
        changes.searchSpace = JSON.parse(space.value);
      } catch (problem) {
        error.textContent = `the search space is not valid JSON: ${problem.message}`;
        space.focus();
        return;
      }
    }
    if (Object.keys(changes).length === 0) {
      dialog.close();
      return;
    }
    save.disabled = true;
    try {
      const answer = await fetch(`/api/experiments/${encodeURIComponent(experiment.id)}`, {
        method: "PATCH",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        credentials: "same-origin",
        body: JSON.stringify(changes),
      });
      const body = await answer.json().catch(() => null);
      if (!answer.ok) {
        error.textContent = body?.error ?? `the change was refused (${answer.status})`;
        return;
      }
      const said = Object.entries(body.changes ?? {}).map(([key, c]) =>
        key === "searchSpace" ? "searchSpace changed" : `${key} ${c.from ?? "none"} → ${c.to}`);
      toast(`experiment ${experiment.id}: ${said.join(", ") || "nothing changed"}`);
      dialog.close();
    } catch (problem) {
      error.textContent = `the web UI is unreachable (${problem.message})`;
    } finally {
      save.disabled = false;
    }
  });

  return {
    /** Once the experiment is shown: open the dialog if the URL says so (a reload, a shared link). */
    restore() {
      if (new URL(location.href).searchParams.get("edit") === "1" && !dialog.open) open();
    },
  };
}
