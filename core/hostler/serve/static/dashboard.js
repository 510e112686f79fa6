// hostler's dashboard: reads the daemon's own routes and tails its event stream.
// No framework, no build step. Every value from the daemon is written with textContent.
"use strict";

const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#8c564b", "#9467bd", "#aec7e8"];
const TAIL_KEPT = 200;
const $ = (id) => document.getElementById(id);

// The token, when reads need one: from the URL fragment (#token=...), which never reaches the
// server; kept for this tab only, and taken out of the address bar.
const TOKEN_KEY = "hostler-token";
function takeToken() {
  const found = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (found) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}
takeToken();

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}

class Refused extends Error {}

async function get(path) {
  const answer = await fetch(path, { headers: headers(), cache: "no-store" });
  if (answer.status === 401) {
    throw new Refused("this daemon needs its token for reads: open this page as /#token=TOKEN (the token is in the data directory's 'token' file)");
  }
  if (!answer.ok) throw new Error(path + ": HTTP " + answer.status);
  return answer;
}

function size(bytes) {
  if (bytes === null || bytes === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return value.toFixed(unit === 0 ? 0 : 1) + " " + units[unit];
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.max(0, seconds);
  if (s < 60) return s.toFixed(0) + "s";
  if (s < 3600) return (s / 60).toFixed(0) + "m";
  return (s / 3600).toFixed(1) + "h";
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "—" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function pill(text) {
  const span = document.createElement("span");
  span.className = "pill " + String(text).replace(/[^a-z-]/g, "");
  span.textContent = text;
  return span;
}

function problem(text) {
  const box = $("problem");
  box.hidden = !text;
  box.textContent = text || "";
}

const colours = new Map();
function colourOf(key) {
  if (!colours.has(key)) colours.set(key, PALETTE[colours.size % PALETTE.length]);
  return colours.get(key);
}

function held(engine) {
  return engine.measured_bytes ?? engine.reserved_bytes ?? (engine.bytes || 0);
}

function renderEngines(view, budget) {
  const body = $("engines").tBodies[0];
  body.replaceChildren();
  const engines = [...view.engines].sort((a, b) => a.key.localeCompare(b.key));
  $("engines-empty").hidden = engines.length > 0;
  for (const engine of engines) {
    const row = body.insertRow();
    row.dataset.key = engine.key;
    row.dataset.state = engine.state;
    const name = cell(row, engine.key);
    name.style.borderLeft = "4px solid " + colourOf(engine.key);
    row.insertCell().appendChild(pill(engine.state));
    cell(row, engine.state_since ? ago(view.now - engine.state_since) : null);
    cell(row, size(engine.reserved_bytes), "num");
    cell(row, size(engine.measured_bytes), "num");
    const bar = document.createElement("div");
    bar.className = "mini";
    const part = document.createElement("span");
    const share = budget ? Math.min(1, held(engine) / budget) : 0;
    part.style.width = (100 * share).toFixed(1) + "%";
    part.style.background = colourOf(engine.key);
    bar.appendChild(part);
    bar.title = budget ? (100 * share).toFixed(1) + "% of " + size(budget) : "no budget known";
    row.insertCell().appendChild(bar);
    cell(row, engine.busy ? "busy" : (engine.draining ? "draining" : ""));
    cell(row, engine.pid, "num");
    cell(row, engine.port, "num");
    cell(row, engine.last_reason, "why");
  }
}

function renderMemory(view, budget) {
  const bar = $("budget-bar");
  bar.replaceChildren();
  let total = 0;
  for (const engine of view.engines) {
    const bytes = engine.state === "stopped" ? 0 : held(engine);
    if (!bytes) continue;
    total += bytes;
    const part = document.createElement("span");
    part.style.width = (budget ? (100 * bytes) / budget : 0).toFixed(2) + "%";
    part.style.background = colourOf(engine.key);
    part.title = engine.key + ": " + size(bytes);
    bar.appendChild(part);
  }
  const committed = view.ledger ? view.ledger.committed : total;
  $("budget-text").textContent = budget
    ? size(committed) + " committed of a " + size(budget) + " budget (" + ((100 * committed) / budget).toFixed(1) + "%), " + size(Math.max(0, budget - committed)) + " free"
    : size(committed) + " committed; the budget is not known to this daemon";
}

function renderQueues(queues) {
  const body = $("queues").tBodies[0];
  body.replaceChildren();
  const keys = Object.keys(queues).sort();
  $("queues-empty").hidden = keys.length > 0;
  for (const key of keys) {
    const q = queues[key];
    const row = body.insertRow();
    row.dataset.key = key;
    cell(row, key);
    cell(row, q.running, "num");
    cell(row, q.width, "num");
    cell(row, (q.queued_interactive || 0) + (q.queued_background || 0), "num");
  }
}

function renderLeases(leases) {
  const body = $("leases").tBodies[0];
  body.replaceChildren();
  $("leases-empty").hidden = leases.length > 0;
  for (const lease of leases) {
    const row = body.insertRow();
    row.dataset.id = lease.id;
    cell(row, lease.holder);
    cell(row, lease.slot);
    row.insertCell().appendChild(pill(lease.state));
    cell(row, lease.held_for === null ? null : ago(lease.held_for), "num");
  }
}

let lastSeq = null;
let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    const [view, queues, leases] = await Promise.all([
      get("/api/engines").then((r) => r.json()),
      get("/api/queues").then((r) => r.json()),
      get("/api/leases").then((r) => r.json()),
    ]);
    let budget = null;
    try {
      budget = (await get("/api/budget").then((r) => r.json())).budget;
    } catch (error) {
      if (error instanceof Refused) throw error;
    }
    if (lastSeq === null) lastSeq = view.last_seq;
    renderMemory(view, budget);
    renderEngines(view, budget);
    renderQueues(queues);
    renderLeases(leases);
    const status = $("status");
    status.className = "pill " + (view.closed ? "down" : "live");
    status.textContent = view.closed ? "shutting down" : "live";
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    problem("");
  } catch (error) {
    $("status").className = "pill down";
    $("status").textContent = "unreachable";
    problem(error.message);
  } finally {
    refreshing = false;
  }
}

let timelineUrl = null;
async function refreshTimeline() {
  try {
    const answer = await get("/api/timeline.svg?minutes=" + encodeURIComponent($("minutes").value));
    const url = URL.createObjectURL(await answer.blob());
    $("timeline").src = url;
    if (timelineUrl) URL.revokeObjectURL(timelineUrl);
    timelineUrl = url;
  } catch (error) {
    $("timeline").alt = "the timeline could not be drawn: " + error.message;
  }
}

function debounce(fn, wait) {
  let timer = null;
  return () => { clearTimeout(timer); timer = setTimeout(fn, wait); };
}
const soonRefresh = debounce(refresh, 250);
const soonTimeline = debounce(refreshTimeline, 2000);

const SHOWN = ["key", "for_key", "engine", "reason", "cause", "outcome", "slot", "holder", "bytes", "shortfall", "budget", "pid", "signal"];
function summary(payload) {
  const parts = [];
  for (const name of SHOWN) {
    if (payload[name] === undefined || payload[name] === null) continue;
    let value = payload[name];
    if (["bytes", "shortfall", "budget"].includes(name) && typeof value === "number") value = size(value);
    parts.push(name + "=" + value);
  }
  return parts.join(" ");
}

function addEvent(event) {
  const list = $("events");
  const item = document.createElement("li");
  item.dataset.seq = event.seq;
  item.dataset.type = event.type;
  item.className = "fresh";
  const seq = document.createElement("span");
  seq.className = "seq";
  seq.textContent = "#" + event.seq;
  const type = document.createElement("span");
  type.className = "type";
  type.textContent = event.type;
  const rest = document.createElement("span");
  rest.textContent = " " + event.stream + "  " + summary(event.payload || {});
  item.append(seq, type, rest);
  item.title = JSON.stringify(event.payload);
  list.prepend(item);
  while (list.children.length > TAIL_KEPT) list.lastChild.remove();
}

let shown = null;
// Server-Sent Events read with fetch (EventSource cannot send a bearer header).
async function tail() {
  for (;;) {
    try {
      // first the last 30 events before the page opened, then from the last one shown
      let seen = shown ?? Math.max(0, (lastSeq ?? 0) - 30);
      const answer = await get("/api/events?after=" + seen);
      const reader = answer.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
          if (!data) continue;
          const event = JSON.parse(data);
          if (event.seq <= seen) continue;
          seen = event.seq;
          shown = seen;
          lastSeq = Math.max(lastSeq || 0, seen);
          addEvent(event);
          soonRefresh();
          soonTimeline();
        }
      }
    } catch (error) {
      problem("the event stream broke (" + error.message + "); reconnecting");
    }
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

async function start() {
  $("minutes").addEventListener("change", refreshTimeline);
  // a token given after the page opened (/#token=... typed into the address bar)
  window.addEventListener("hashchange", () => { takeToken(); refresh(); refreshTimeline(); });
  await refresh();
  refreshTimeline();
  tail();
  setInterval(refresh, 5000);
  setInterval(refreshTimeline, 60000);
}

start();
