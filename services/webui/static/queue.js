// The queue page (/queue): who waits for capacity on each shared platform, in the order the
// dispatcher gives it (/api/queue), and each team's share (/api/teams). Both are the
// dispatcher's answers, relayed; the page reads them again every REFRESH_MS while it is shown.
//
// Hooks for tests: #queue-platforms article[data-platform], its rows tr[data-experiment][data-team]
// [data-position] with td.why, #queue-empty, #queue-error, #teams-rows tr[data-team][data-platform].

import { api, formatNumber, h } from "./util.js";

const REFRESH_MS = 3000;
const $ = (selector) => document.querySelector(selector);

/** "1 GPU", "2.5 GPUs". */
function count(n, word) {
  return `${formatNumber(n)} ${word}${n === 1 ? "" : "s"}`;
}

/** "2 GPUs, 4 trials", as `trialbus team list` says a quota; "none" when it sets neither. */
function quotaText(quota) {
  const parts = [];
  if (quota?.gpus !== null && quota?.gpus !== undefined) parts.push(count(quota.gpus, "GPU"));
  if (quota?.trials !== null && quota?.trials !== undefined) parts.push(count(quota.trials, "trial"));
  return parts.join(", ") || "none";
}

/** What is in use of what a platform holds: "2 of 4 GPUs, 2 of 64 trials in use" (a bound it lacks unsaid). */
function useText(used, capacity) {
  const of = (n, total, word) => (total === null || total === undefined
    ? count(n, word) : `${formatNumber(n)} of ${count(total, word)}`);
  return `${of(used.gpus, capacity?.gpus, "GPU")}, ${of(used.trials, capacity?.trials, "trial")} in use`;
}

function platformCard(platform) {
  const link = (id) => h("a", { href: `/experiments/${encodeURIComponent(id)}` }, id);
  const rows = platform.waiting.map((w) => h("tr", {
    dataset: { experiment: w.experiment, team: w.team, position: String(w.position) },
  },
  h("td", { class: "num" }, w.position), h("td", {}, link(w.experiment)), h("td", {}, w.team),
  h("td", { class: "num" }, w.priority), h("td", { class: "num" }, formatNumber(w.gpusPerTrial)),
  h("td", { class: "num" }, w.ready), h("td", { class: "why" }, w.why)));
  return h("article", { class: "platform", dataset: { platform: platform.platform } },
    h("h3", {}, platform.platform, h("small", { class: "muted" }, ` · ${useText(platform.used, platform.capacity)}`)),
    rows.length
      ? h("table", { class: "queue" },
        h("thead", {}, h("tr", {}, ["#", "Experiment", "Team", "Priority", "GPUs per trial", "Ready trials", "Why it waits"]
          .map((t) => h("th", {}, t)))),
        h("tbody", {}, rows))
      : h("p", { class: "muted" }, "nothing waits for capacity"));
}

/** One row per team and platform it uses or waits for (one row without a platform when it uses none). */
function teamRows(teams) {
  const rows = [];
  for (const team of teams) {
    const uses = Object.entries(team.use ?? {});
    const first = (platform) => [
      h("td", {}, team.name, team.configured ? null : h("small", { class: "muted" }, " (no share set)")),
      h("td", { class: "num" }, formatNumber(team.weight)),
      h("td", {}, platform ?? "—"),
    ];
    if (!uses.length) {
      rows.push(h("tr", { dataset: { team: team.name, platform: "" } }, first(null),
        h("td", {}, quotaText(team.quota)), h("td", {}, "—"), h("td", {}, "—"), h("td", { class: "num" }, 0)));
      continue;
    }
    for (const [platform, use] of uses) {
      const borrowed = [use.borrowedGpus ? count(use.borrowedGpus, "GPU") : null,
        use.borrowedTrials ? count(use.borrowedTrials, "trial") : null].filter(Boolean).join(", ") || "—";
      rows.push(h("tr", { dataset: { team: team.name, platform } }, first(platform),
        h("td", {}, quotaText(use.quota)),
        h("td", {}, useText(use, use.capacity)), h("td", { class: "borrowed" }, borrowed),
        h("td", { class: "num" }, use.waitingExperiments)));
    }
  }
  return rows;
}

async function refresh() {
  const [queue, teams] = await Promise.allSettled([api("GET", "/api/queue"), api("GET", "/api/teams")]);
  const problem = [queue, teams].find((r) => r.status === "rejected");
  const error = $("#queue-error");
  error.hidden = !problem;
  error.textContent = problem ? problem.reason.message : "";
  const connection = $("#connection");
  connection.dataset.state = problem ? "reconnecting" : "live";
  connection.textContent = problem ? "the dispatcher does not answer" : "live";
  if (queue.status === "fulfilled") {
    const platforms = queue.value;
    const waiting = platforms.reduce((n, p) => n + p.waiting.length, 0);
    $("#queue-empty").hidden = waiting > 0;
    $("#queue-platforms").replaceChildren(...platforms.map(platformCard));
    document.title = waiting ? `Trialbus — ${waiting} waiting` : "Trialbus — queue";
  }
  if (teams.status === "fulfilled") {
    const rows = teamRows(teams.value);
    $("#teams-rows").replaceChildren(...(rows.length ? rows
      : [h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No team has a share set or uses a shared platform."))]));
  }
}

/** Show the queue instead of an experiment, and read it again every REFRESH_MS while the tab is shown. */
export async function showQueue() {
  $("#queue").hidden = false;
  $("#queue-link").setAttribute("aria-current", "page");
  document.title = "Trialbus — queue";
  let busy = false;
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
  setInterval(tick, REFRESH_MS);
  await tick();
}
