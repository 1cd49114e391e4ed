// Small helpers shared by the page's modules: building DOM safely, formatting values,
// and calling the web UI's JSON API. Text always goes in through textContent (never
// innerHTML), so nothing a trial reports can inject markup into the page.

export const STATUSES = ["WAITING", "RUNNING", "SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED"];
export const ACTIVE = new Set(["WAITING", "RUNNING"]);

/** Create an element: h("td", {class: "num", dataset: {x: 1}}, "text", childNode, …). */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "dataset") Object.assign(element.dataset, value);
    else if (name === "class") element.className = value;
    else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

/** A number shown with up to 6 significant digits; "" for none. */
export function formatNumber(value) {
  if (value === null || value === undefined) return "";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e9) return String(value);
  if (value !== 0 && (Math.abs(value) >= 1e6 || Math.abs(value) < 1e-4)) return value.toExponential(4);
  return String(Number(value.toPrecision(6)));
}

/**
 * A hyper-parameter as people read it. A nested choice is a dict with "_name"
 * ({"_name": "adam", "lr": 0.1} → "adam(lr=0.1)"); other dicts are "k=v, …".
 */
export function formatParameter(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") return formatNumber(value);
  if (Array.isArray(value)) return `[${value.map(formatParameter).join(", ")}]`;
  if (typeof value === "object") {
    const { _name: name, ...rest } = value;
    const inner = Object.entries(rest).map(([k, v]) => `${k}=${formatParameter(v)}`).join(", ");
    if (name !== undefined) return inner ? `${name}(${inner})` : String(name);
    return inner;
  }
  return String(value);
}

/** A reported metric: its default number first, the other keys after ("0.93 (loss=0.2)"). */
export function formatMetric(value) {
  if (value && typeof value === "object" && !Array.isArray(value) && "default" in value) {
    const { default: main, ...rest } = value;
    const others = formatParameter(rest);
    return others ? `${formatParameter(main)} (${others})` : formatParameter(main);
  }
  return formatParameter(value);
}

/** Seconds as "2d 03h", "1h 02m", "3m 05s" or "12.3s". */
export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "";
  if (seconds < 60) return `${seconds.toFixed(1)}s`;
  const s = Math.floor(seconds % 60), m = Math.floor(seconds / 60) % 60, hours = Math.floor(seconds / 3600) % 24;
  const days = Math.floor(seconds / 86400);
  const pad = (n) => String(n).padStart(2, "0");
  if (days) return `${days}d ${pad(hours)}h`;
  return hours ? `${hours}h ${pad(m)}m` : `${m}m ${pad(s)}s`;
}

/** Seconds between two ISO times (the end defaults to now); null without a start. */
export function secondsBetween(start, end) {
  if (!start) return null;
  return Math.max(0, ((end ? Date.parse(end) : Date.now()) - Date.parse(start)) / 1000);
}

export function formatTime(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

/** NNI's "default" metric of a value: the number, or a dict's "default"; null otherwise. */
export function defaultMetric(value) {
  if (value && typeof value === "object" && !Array.isArray(value)) value = value.default;
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

/** Call the web UI's API; resolves to the JSON answer, rejects with the server's message. */
export async function api(method, url) {
  let answer;
  try {
    answer = await fetch(url, { method, headers: { Accept: "application/json" }, credentials: "same-origin" });
  } catch (error) {
    throw new Error(`the web UI is unreachable (${error.message})`);
  }
  let body = null;
  try {
    body = await answer.json();
  } catch {
    // not JSON: keep the status as the message
  }
  if (!answer.ok) throw new Error(body?.error ?? `${method} ${url} answered ${answer.status}`);
  return body;
}

let toastTimer = 0;

/** A short message at the bottom of the page (errors stay longer). */
export function toast(message, isError = false) {
  const element = document.getElementById("toast");
  element.textContent = message;
  element.dataset.kind = isError ? "error" : "info";
  element.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { element.hidden = true; }, isError ? 8000 : 3000);
}

/** ``draw`` run at most once per animation frame, however many times the returned function is called. */
export function oncePerFrame(draw) {
  let pending = false;
  return () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      draw();
    });
  };
}
