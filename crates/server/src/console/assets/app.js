// The leaseq console: one page, no build step, no dependencies.
//
// Rules this file keeps:
// - Nothing from the broker is ever parsed as HTML: the DOM is built with
//   createElement and textContent (see `el`). No innerHTML anywhere.
// - State-changing requests are POSTs with a JSON body and the session's
//   CSRF token in X-CSRF-Token (see `post`).
// - Live counts come from /api/events (server-sent events from the
//   broker's one WatchQueues sampler, shared by every browser).
// - Rates and charts are the whole deployment's (every replica writes its
//   rates to the database), not this broker's alone.
"use strict";

const state = {
  session: null,   // {auth, name, admin, csrf, version}
  queues: [],      // last snapshot from /api/events or /api/queues
  events: null,    // EventSource
  lastEvent: 0,
  timer: null,     // the current page's refresh timer
};

// ---- DOM helpers -----------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

// el("td", {class: "num", "data-col": "dead"}, "text", child, ...):
// strings become text nodes, never markup.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  append(e, children);
  return e;
}

function append(e, children) {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function clear(e) {
  while (e.firstChild) e.removeChild(e.firstChild);
  return e;
}

const $ = (sel, root) => (root || document).querySelector(sel);
const main = () => $("#main");

function flash(text, kind) {
  const box = clear($("#flash"));
  box.appendChild(el("div", { class: "msg " + (kind || "ok"), id: "flash-msg" }, text));
}

function clearFlash() { clear($("#flash")); }

// ---- formatting ------------------------------------------------------

function num(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en"); }

function rate(r) {
  if (r === null || r === undefined) return "–";
  return r < 10 ? r.toFixed(2) + "/s" : Math.round(r).toLocaleString("en") + "/s";
}

function dur(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 120) return (Math.round(s * 10) / 10) + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  if (s < 172800) return (Math.round(s / 360) / 10) + " h";
  return (Math.round(s / 8640) / 10) + " d";
}

function when(ms) {
  if (ms === null || ms === undefined) return "–";
  const d = new Date(ms);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function limits(s) {
  const parts = [];
  if (s.concurrency_limit) parts.push("≤ " + s.concurrency_limit + " leased");
  if (s.rate_limit) parts.push(s.rate_limit + "/s (burst " + s.rate_burst + ")");
  return parts.length ? parts.join(", ") : "none";
}

// ---- HTTP --------------------------------------------------------------

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function request(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: {} };
  if (method !== "GET") {
    opts.headers["Content-Type"] = "application/json";
    if (state.session) opts.headers["X-CSRF-Token"] = state.session.csrf;
    opts.body = JSON.stringify(body || {});
  }
  const r = await fetch(path, opts);
  let data = null;
  try { data = await r.json(); } catch (_) { data = null; }
  if (r.status === 401 && path !== "/api/login") {
    // A first visit has had no session to end: just the form.
    const had = state.session !== null;
    state.session = null;
    showLogin(had ? "Your session ended: log in again." : null);
    throw new HttpError(401, (data && data.error) || "not logged in");
  }
  if (!r.ok) throw new HttpError(r.status, (data && data.error) || r.statusText);
  return data;
}

const get = (path) => request("GET", path);
const post = (path, body) => request("POST", path, body);

// Runs an action, reporting its outcome (server refusals included).
async function act(what, fn) {
  try {
    const msg = await fn();
    flash(msg || what + ": done", "ok");
    return true;
  } catch (e) {
    if (e.status !== 401) flash(what + " failed: " + e.message, "error");
    return false;
  }
}

// ---- session -------------------------------------------------------------

async function start() {
  $("#job-lookup").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const id = $("#job-lookup-id").value.trim();
    if (id) location.hash = "#/job/" + encodeURIComponent(id);
  });
  window.addEventListener("hashchange", () => route(false));
  try {
    state.session = await get("/api/session");
  } catch (e) {
    if (e.status === 401) return; // showLogin ran
    clear(main()).appendChild(el("p", { class: "error" }, "The console is unavailable: " + e.message));
    return;
  }
  loggedIn();
}

function loggedIn() {
  const s = state.session;
  const who = clear($("#who"));
  if (s.auth) {
    who.appendChild(el("span", { id: "who-name" }, s.name));
    who.appendChild(s.admin
      ? el("span", { class: "badge admin", id: "who-role" }, s.admin_everywhere ? "admin" : "admin (some queues)")
      : el("span", { class: "badge readonly", id: "who-role" }, "read-only"));
    who.appendChild(el("button", { id: "logout", onclick: logout }, "Log out"));
  } else {
    who.appendChild(el("span", { class: "badge readonly", title: "The broker runs without --auth-file" }, "no authentication"));
  }
  $("#nav").hidden = false;
  connectEvents();
  route();
}

function showLogin(message) {
  if (state.events) { state.events.close(); state.events = null; }
  stopTimer();
  $("#nav").hidden = true;
  clear($("#who"));
  const input = el("input", { type: "password", id: "token", autocomplete: "current-password",
    placeholder: "bearer token", "aria-label": "Bearer token", required: true });
  const form = el("form", { class: "login panel", id: "login-form" },
    el("h1", {}, "Log in to the leaseq console"),
    el("p", { class: "muted" }, "Use a bearer token from the broker's --auth-file. Tokens with the \"admin\" action may change queues; others see the queues they have a grant on, read-only."),
    message ? el("p", { class: "error", id: "login-error" }, message) : null,
    input,
    el("button", { type: "submit", class: "primary", id: "login-submit" }, "Log in"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      state.session = await post("/api/login", { token: input.value });
      input.value = "";
      clearFlash();
      loggedIn();
    } catch (e) {
      showLogin(e.status === 401 ? "That token is not valid." : "Login failed: " + e.message);
    }
  });
  clear(main()).appendChild(form);
  input.focus();
}

async function logout() {
  try { await post("/api/logout"); } catch (_) { /* the session is gone anyway */ }
  state.session = null;
  showLogin(null);
}

// ---- live updates ----------------------------------------------------

function connectEvents() {
  if (state.events) state.events.close();
  const es = new EventSource("/api/events");
  es.addEventListener("queues", (ev) => {
    const data = JSON.parse(ev.data);
    state.queues = data.queues;
    state.lastEvent = Date.now();
    liveBadge(true);
    partialNote(data.unavailable_clusters);
    if (page.onQueues) page.onQueues(data.queues);
  });
  es.addEventListener("error", () => {
    liveBadge(false);
  });
  state.events = es;
}

// A broker over several PostgreSQL clusters answers from those that answer
// and names the others: say so above the page, and nothing when complete.
function partialNote(missing) {
  let p = $("#partial");
  if (!missing || !missing.length) {
    if (p) p.remove();
    return;
  }
  const text = "PostgreSQL cluster " + missing.join(", ") + " did not answer: its queues and jobs are missing from these figures.";
  if (!p) {
    p = el("p", { class: "error", id: "partial" }, text);
    main().prepend(p);
  } else {
    p.textContent = text;
  }
}

function liveBadge(ok) {
  const b = $("#live");
  if (!b) return;
  b.className = "badge " + (ok ? "live" : "stale");
  b.textContent = ok ? "live" : "reconnecting…";
  b.title = ok ? "updated " + new Date(state.lastEvent).toLocaleTimeString() : "";
}

// ---- routing -------------------------------------------------------------

const page = { onQueues: null };

const refresh = () => route(true);

function stopTimer() {
  if (state.timer) { clearInterval(state.timer); state.timer = null; }
}

// Renders the page the address names; `keepFlash` when re-rendering after
// an action whose outcome is on show.
function route(keepFlash) {
  if (!state.session) return;
  stopTimer();
  page.onQueues = null;
  if (!keepFlash) clearFlash();
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/").map(decodeURIComponent);
  const params = new URLSearchParams(query || "");
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.nav === (parts[0] || "queues"));
  }
  switch (parts[0]) {
    case "queue": return queuePage(parts[1]);
    case "jobs": return jobsPage(params.get("queue") || "", params.get("state") || "live", params.get("search") || "", params.get("key") || "");
    case "dead": return deadPage(parts[1] || "");
    case "job": return jobPage(parts[1]);
    case "schedules": return schedulesPage();
    default: return queuesPage();
  }
}

// ---- queues --------------------------------------------------------------

const COLUMNS = [
  ["available", "Waiting", (q) => num(q.stats.available)],
  ["scheduled", "Delayed", (q) => num(q.stats.scheduled)],
  ["leased", "Leased", (q) => num(q.stats.leased)],
  ["dead", "Dead", (q) => num(q.stats.dead)],
  ["oldest", "Oldest waiting", (q) => dur(q.stats.oldest_available_age)],
  ["enqueue_rate", "Enqueued", (q) => rate(q.stats.enqueue_rate)],
  ["ack_rate", "Acked", (q) => rate(q.stats.ack_rate)],
  ["consumers", "Consumers", (q) => num(q.stats.consumers)],
  ["streams", "Streams here", (q) => num(q.stats.streams)],
  ["keys_waiting", "Keys waiting", (q) => (q.stats.keys_waiting_capped ? "≥ " : "") + num(q.stats.keys_waiting)],
  ["keys_leased", "Keys leased", (q) => num(q.stats.keys_leased)],
];

async function queuesPage() {
  const m = clear(main());
  m.appendChild(el("h1", {}, "Queues", el("span", { id: "live", class: "badge stale" }, "connecting…")));
  const body = el("tbody", { id: "queues-body" });
  m.appendChild(el("table", { id: "queues" },
    el("thead", {}, el("tr", {},
      el("th", {}, "Queue"),
      COLUMNS.map(([, title]) => el("th", { class: "num" }, title)),
      el("th", {}, "Paused"),
      el("th", {}, "Limits"))),
    body));
  m.appendChild(el("p", { class: "muted" },
    "Counts are the database's and rates the whole deployment's (every replica's, over its last metrics interval). Streams are this broker's."));
  const render = (queues) => {
    const old = new Map([...body.querySelectorAll("tr")].map((tr) => [tr.dataset.queue, tr.dataset.sig]));
    clear(body);
    if (!queues.length) {
      body.appendChild(el("tr", {}, el("td", { colspan: COLUMNS.length + 3, class: "muted" }, "No queues yet: enqueue a job to create one.")));
    }
    for (const q of queues) {
      const sig = JSON.stringify(q.stats) + q.settings.paused;
      const changed = old.has(q.name) && old.get(q.name) !== sig;
      body.appendChild(el("tr", { "data-queue": q.name, "data-sig": sig, class: changed ? "flash" : null },
        el("td", {}, el("a", { href: "#/queue/" + encodeURIComponent(q.name) }, q.name)),
        COLUMNS.map(([key, , f]) => {
          const td = el("td", { class: "num", "data-col": key }, f(q));
          if (key === "dead" && q.stats.dead > 0) {
            clear(td).appendChild(el("a", { href: "#/dead/" + encodeURIComponent(q.name) }, f(q)));
          }
          return td;
        }),
        el("td", { "data-col": "paused" }, q.settings.paused ? el("span", { class: "badge paused" }, "paused") : "no"),
        el("td", { "data-col": "limits" }, limits(q.settings))));
    }
  };
  page.onQueues = render;
  if (state.lastEvent) liveBadge(true);
  try {
    const r = await get("/api/queues");
    if (page.onQueues === render) render(state.lastEvent ? state.queues : r.queues);
  } catch (e) {
    if (e.status !== 401) flash("Loading queues failed: " + e.message, "error");
  }
}

// ---- one queue -------------------------------------------------------------

function chart(id, title, series, points) {
  // series: [{name, color, values: [v...]}], points: [t_ms...]
  const W = 600, H = 170, L = 44, B = 18, T = 8;
  const s = svg("svg", { viewBox: `0 0 ${W} ${H + B + T}`, class: "chart", id, role: "img", "aria-label": title });
  const max = Math.max(1, ...series.flatMap((x) => x.values));
  const t0 = points.length ? points[0] : 0, t1 = points.length ? points[points.length - 1] : 1;
  const x = (t) => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (W - L - 6);
  const y = (v) => T + H - (v / max) * H;
  for (const f of [0, 0.5, 1]) {
    s.appendChild(svg("line", { x1: L, x2: W - 6, y1: y(max * f), y2: y(max * f), stroke: "#d1d9e0" }));
    const label = svg("text", { x: L - 4, y: y(max * f) + 4, "text-anchor": "end", "font-size": 10, fill: "#59636e" });
    label.textContent = max * f >= 100 ? Math.round(max * f) : (Math.round(max * f * 10) / 10);
    s.appendChild(label);
  }
  const span = svg("text", { x: W - 6, y: H + T + B - 4, "text-anchor": "end", "font-size": 10, fill: "#59636e" });
  span.textContent = points.length > 1 ? "last " + dur((t1 - t0) / 1000) : "collecting samples…";
  s.appendChild(span);
  for (const sr of series) {
    if (points.length < 2) break;
    const d = sr.values.map((v, i) => (i ? "L" : "M") + x(points[i]).toFixed(1) + " " + y(v).toFixed(1)).join(" ");
    s.appendChild(svg("path", { d, fill: "none", stroke: sr.color, "stroke-width": 2 }));
  }
  const legend = el("div", { class: "legend" });
  for (const sr of series) {
    const item = el("span", {}, sr.name);
    item.style.setProperty("--c", sr.color);
    legend.appendChild(item);
  }
  return el("div", {}, el("h2", {}, title), s, legend);
}

function queueCharts(history) {
  const t = history.map((h) => h[0]);
  const depth = chart("chart-depth", "Depth", [
    { name: "waiting", color: "#0969da", values: history.map((h) => h[1]) },
    { name: "delayed", color: "#8250df", values: history.map((h) => h[2]) },
    { name: "leased", color: "#1a7f37", values: history.map((h) => h[3]) },
    { name: "dead", color: "#cf222e", values: history.map((h) => h[4]) },
  ], t);
  const rates = chart("chart-rates", "Rates (every replica, jobs/s)", [
    { name: "enqueued", color: "#0969da", values: history.map((h) => h[5]) },
    { name: "acked", color: "#1a7f37", values: history.map((h) => h[6]) },
  ], t);
  return el("div", { class: "grid" }, depth, rates);
}

const SETTINGS = [
  // [field, label, unit, read(settings) -> value shown in the form]
  ["concurrency_limit", "Concurrency limit", "jobs leased at once (0 = none)", (s) => s.concurrency_limit],
  ["rate_limit", "Rate limit", "jobs/s (0 = none)", (s) => s.rate_limit],
  ["rate_burst", "Rate burst", "jobs (0 = default)", (s) => s.rate_burst],
  ["completed_retention", "Completed retention", "seconds (0 = keep none)", (s) => s.completed_retention || 0],
  ["max_attempts", "Max attempts", "deliveries", (s) => s.max_attempts],
  ["default_lease", "Default lease", "seconds", (s) => s.default_lease],
  ["backoff_base", "Backoff base", "seconds", (s) => s.backoff_base],
  ["backoff_cap", "Backoff cap", "seconds", (s) => s.backoff_cap],
];

async function queuePage(name) {
  const m = clear(main());
  let data;
  try {
    data = await get("/api/queues/" + encodeURIComponent(name));
  } catch (e) {
    if (e.status !== 401) m.appendChild(el("p", { class: "error", id: "error" }, e.message));
    return;
  }
  const q = data.queue;
  const canAdmin = q.can_admin;
  const denied = canAdmin ? null : "needs the admin grant on this queue";
  const title = el("h1", {}, "Queue ", el("span", { class: "mono", id: "queue-name" }, q.name),
    el("span", { id: "queue-paused", class: "badge paused", hidden: !q.settings.paused }, "paused"));
  const pause = el("button", { id: "pause", disabled: !canAdmin, title: denied,
    onclick: () => act("Pause", async () => { await post(`/api/queues/${encodeURIComponent(name)}/pause`); await refresh(); return "Queue paused"; }) }, "Pause");
  const resume = el("button", { id: "resume", disabled: !canAdmin, title: denied,
    onclick: () => act("Resume", async () => { await post(`/api/queues/${encodeURIComponent(name)}/resume`); await refresh(); return "Queue resumed"; }) }, "Resume");
  pause.hidden = q.settings.paused;
  resume.hidden = !q.settings.paused;
  const stats = el("dl", { id: "queue-stats" });
  const fillStats = (q) => {
    clear(stats);
    for (const [key, label, f] of COLUMNS) {
      stats.appendChild(el("dt", {}, label));
      stats.appendChild(el("dd", { "data-col": key }, f(q)));
    }
  };
  fillStats(q);
  page.onQueues = (queues) => {
    const now = queues.find((x) => x.name === name);
    if (now) fillStats(now);
  };
  const charts = el("div", { id: "charts" }, queueCharts(data.history));
  const confirmBox = el("div", { id: "purge-queue-box" });
  const purge = el("button", { id: "purge-queue", class: "danger", disabled: !canAdmin, title: denied,
    onclick: () => purgeQueueConfirm(confirmBox, name) }, "Purge queue…");
  append(m, [title,
    el("div", { class: "toolbar" }, pause, resume, purge,
      el("a", { href: "#/jobs?queue=" + encodeURIComponent(name), id: "queue-jobs" }, "Jobs"),
      el("a", { href: "#/dead/" + encodeURIComponent(name) }, "Dead letters (" + num(q.stats.dead) + ")")),
    confirmBox,
    el("div", { class: "grid" },
      el("div", { class: "panel" }, el("h2", {}, "Now"), stats),
      settingsPanel(name, q, canAdmin)),
    charts,
    enqueuePanel(name, q.can_enqueue),
    el("h2", {}, "Consumers"),
    consumersTable(data.consumers),
    keysPanel(name, q.stats)]);
  partialNote(data.unavailable_clusters);
  // The charts and consumers refresh with each metrics interval.
  state.timer = setInterval(async () => {
    try {
      const d = await get("/api/queues/" + encodeURIComponent(name));
      clear(charts).appendChild(queueCharts(d.history));
      $("#consumers").replaceWith(consumersTable(d.consumers));
      partialNote(d.unavailable_clusters);
    } catch (_) { /* shown on the next navigation */ }
  }, 5000);
}

// The queue's keys (ListKeys), 20 at a time: by key, or the 20 with the
// most jobs waiting. Each links to its jobs. Shown when the queue has keyed
// jobs.
function keysPanel(name, stats) {
  const box = el("div", { id: "keys-box" });
  if (!stats.keys_waiting && !stats.keys_leased) {
    box.appendChild(el("h2", {}, "Keys"));
    box.appendChild(el("p", { class: "muted", id: "keys-none" }, "No live job of this queue has a key."));
    return box;
  }
  const order = el("select", { id: "keys-order", "aria-label": "Order" },
    el("option", { value: "key" }, "by key"),
    el("option", { value: "waiting" }, "most waiting first"));
  const body = el("tbody", { id: "keys-body" });
  const more = el("div", { id: "keys-more-box" });
  const load = async (after) => {
    const p = new URLSearchParams({ order: order.value });
    if (after) p.set("after", after);
    let r;
    try {
      r = await get(`/api/queues/${encodeURIComponent(name)}/keys?` + p.toString());
    } catch (e) {
      if (e.status !== 401) { clear(more); more.appendChild(el("p", { class: "error", id: "error" }, e.message)); }
      return;
    }
    if (!after) clear(body);
    for (const k of r.keys) {
      const jobs = "#/jobs?" + new URLSearchParams({ queue: name, key: k.key }).toString();
      body.appendChild(el("tr", { "data-key": k.key },
        el("td", { class: "mono" }, el("a", { href: jobs }, k.key)),
        el("td", { class: "num", "data-col": "waiting" }, num(k.waiting)),
        el("td", { class: "num", "data-col": "leased" }, num(k.leased)),
        el("td", { class: "num" }, dur(k.oldest_available_age))));
    }
    partialNote(r.unavailable_clusters);
    clear(more);
    if (r.next) more.appendChild(el("button", { id: "keys-more", onclick: () => load(r.next) }, "Load more"));
  };
  order.addEventListener("change", () => load(null));
  append(box, [el("h2", {}, "Keys"),
    el("div", { class: "toolbar" }, el("label", { for: "keys-order" }, "Order"), order),
    el("table", { id: "keys" },
      el("thead", {}, el("tr", {}, el("th", {}, "Key"), el("th", { class: "num" }, "Waiting"),
        el("th", { class: "num" }, "Leased"), el("th", { class: "num" }, "Oldest waiting"))),
      body),
    more]);
  load(null);
  return box;
}

// A purge deletes every waiting job of the queue: the name must be typed.
function purgeQueueConfirm(box, name) {
  const input = el("input", { type: "text", id: "purge-queue-name", "aria-label": "Queue name",
    placeholder: name, spellcheck: "false", autocomplete: "off" });
  const yes = el("button", { class: "danger", id: "confirm-purge-queue", disabled: true,
    onclick: () => act("Purge", async () => {
      const r = await post(`/api/queues/${encodeURIComponent(name)}/purge`, { confirm: input.value });
      await refresh();
      return `Purged ${r.purged} waiting job(s)` + (r.purged_completed ? ` and ${r.purged_completed} completed record(s)` : "");
    }) }, "Purge");
  input.addEventListener("input", () => { yes.disabled = input.value !== name; });
  clear(box).appendChild(el("div", { class: "confirm" },
    el("strong", {}, "Delete every waiting job of " + name + " for good?"),
    " Leased jobs stay with their consumers; dead letters are kept. Type the queue's name to confirm: ",
    input, " ", yes, " ",
    el("button", { id: "cancel-purge-queue", onclick: () => clear(box) }, "Cancel")));
  input.focus();
}

// A test job: text payload, optional content type, priority and delay.
function enqueuePanel(name, canEnqueue) {
  const denied = canEnqueue ? null : "needs the enqueue grant on this queue";
  const payload = el("textarea", { id: "enqueue-payload", rows: 3, "aria-label": "Payload", spellcheck: "false",
    disabled: !canEnqueue, placeholder: "payload (text)" });
  const ctype = el("input", { type: "text", id: "enqueue-content-type", "aria-label": "Content type",
    placeholder: "content-type (optional)", disabled: !canEnqueue });
  const priority = el("input", { type: "number", id: "enqueue-priority", step: 1, value: 0, "aria-label": "Priority", disabled: !canEnqueue });
  const delay = el("input", { type: "number", id: "enqueue-delay", step: "any", min: 0, value: 0, "aria-label": "Delay (s)", disabled: !canEnqueue });
  const form = el("form", { id: "enqueue-form", class: "settings" },
    el("label", { for: "enqueue-payload" }, "Payload"), payload, el("span"),
    el("label", { for: "enqueue-content-type" }, "Content type"), ctype, el("span", { class: "muted" }, "header"),
    el("label", { for: "enqueue-priority" }, "Priority"), priority, el("span", { class: "muted" }, "higher first"),
    el("label", { for: "enqueue-delay" }, "Delay"), delay, el("span", { class: "muted" }, "seconds"),
    el("span"),
    el("button", { type: "submit", class: "primary", id: "enqueue-submit", disabled: !canEnqueue, title: denied }, "Enqueue"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const body = { payload: payload.value, priority: Number(priority.value || 0), delay: Number(delay.value || 0) };
    if (ctype.value.trim()) body.headers = { "content-type": ctype.value.trim() };
    act("Enqueue", async () => {
      const r = await post(`/api/queues/${encodeURIComponent(name)}/enqueue`, body);
      return (r.duplicate ? "Duplicate of job " : "Enqueued job ") + r.job_id;
    });
  });
  return el("div", { class: "panel" }, el("h2", {}, "Enqueue a test job"), form);
}

function consumersTable(consumers) {
  if (!consumers.length) return el("p", { class: "muted", id: "consumers" }, "No consumer holds or waits for jobs of this queue.");
  return el("table", { id: "consumers" },
    el("thead", {}, el("tr", {},
      el("th", {}, "Consumer"), el("th", { class: "num" }, "Streams here"),
      el("th", { class: "num" }, "Credit here"), el("th", { class: "num" }, "In flight (all replicas)"),
      el("th", { class: "num" }, "Connected for"))),
    el("tbody", {}, consumers.map((c) => el("tr", { "data-consumer": c.consumer },
      el("td", { class: "mono" }, c.consumer || "(unnamed)"),
      el("td", { class: "num" }, num(c.streams)),
      el("td", { class: "num" }, num(c.credit)),
      el("td", { class: "num" }, num(c.in_flight)),
      el("td", { class: "num" }, c.connected_for === null ? "–" : dur(c.connected_for))))));
}

function settingsPanel(name, q, canAdmin) {
  const form = el("form", { class: "settings", id: "settings-form" });
  const inputs = {};
  for (const [field, label, unit, read] of SETTINGS) {
    const input = el("input", { type: "number", step: "any", min: 0, name: field, id: "set-" + field,
      value: read(q.settings), disabled: !canAdmin });
    inputs[field] = input;
    append(form, [el("label", { for: "set-" + field }, label), input, el("span", { class: "muted" }, unit)]);
  }
  form.appendChild(el("span"));
  form.appendChild(el("button", { type: "submit", class: "primary", id: "save-settings", disabled: !canAdmin,
    title: canAdmin ? null : "needs the admin grant on this queue" }, "Save"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const body = {};
    for (const [field, , , read] of SETTINGS) {
      const v = inputs[field].value.trim();
      if (v === "" || Number(v) === Number(read(q.settings))) continue;
      body[field] = Number(v);
    }
    if (!Object.keys(body).length) { flash("Nothing changed", "ok"); return; }
    act("Saving settings", async () => {
      await post(`/api/queues/${encodeURIComponent(name)}/settings`, body);
      await refresh();
      return "Settings saved: " + Object.keys(body).join(", ");
    });
  });
  return el("div", { class: "panel" }, el("h2", {}, "Settings"), form);
}

// ---- schedules -------------------------------------------------------------

// The schedules of the queues this session may read (ListSchedules): cron
// and zone, next and last tick, pause and policies, refreshed every 5 s. A
// session with the admin grant on a schedule's queue gets its actions
// (pause or resume, run now, delete); others see none.
async function schedulesPage() {
  const m = clear(main());
  const body = el("tbody", { id: "schedules-body" });
  const head = el("tr", {});
  const confirmBox = el("div", { id: "delete-schedule-box" });
  append(m, [el("h1", {}, "Schedules"), confirmBox,
    el("table", { id: "schedules" }, el("thead", {}, head), body),
    el("p", { class: "muted" },
      "Each tick enqueues the schedule's job; times are UTC. Create and edit schedules with ",
      el("code", {}, "leaseq schedules"), " or the AdminService.")]);
  const render = (schedules) => {
    const admin = schedules.some((s) => s.can_admin);
    clear(head);
    append(head, ["Schedule", "Cron", "Zone", "Queue", "Next tick", "Last tick", "Paused", "Overlap / catch-up"]
      .map((t) => el("th", {}, t)));
    if (admin) head.appendChild(el("th", { id: "schedule-actions" }, "Actions"));
    clear(body);
    if (!schedules.length) {
      body.appendChild(el("tr", {}, el("td", { colspan: 8, class: "muted", id: "schedules-none" },
        "No schedules.")));
    }
    for (const s of schedules) {
      const path = "/api/schedules/" + encodeURIComponent(s.name);
      const did = (what) => async () => { await post(path + "/" + what); await load(); return "Schedule " + s.name + ": " + what + "d"; };
      const last = s.last_job_id
        ? el("a", { href: "#/job/" + encodeURIComponent(s.last_job_id), title: "its job" }, when(s.last_tick_at))
        : when(s.last_tick_at);
      const policies = "overlap " + s.overlap + ", catch-up " + s.catch_up +
        (s.catch_up === "all" ? " (latest " + s.catch_up_limit + ")" : "");
      body.appendChild(el("tr", { "data-schedule": s.name },
        el("td", { class: "mono" }, s.name),
        el("td", { class: "mono", "data-col": "cron" }, s.cron),
        el("td", { "data-col": "zone" }, s.time_zone),
        el("td", { "data-col": "queue" }, el("a", { href: "#/queue/" + encodeURIComponent(s.queue) }, s.queue)),
        el("td", { "data-col": "next" }, s.paused ? "–" : when(s.next_run_at)),
        el("td", { "data-col": "last" }, last),
        el("td", { "data-col": "paused" }, s.paused ? el("span", { class: "badge paused" }, "paused") : "no"),
        el("td", { "data-col": "policies" }, policies),
        !admin ? null : el("td", { "data-col": "actions" }, !s.can_admin ? null : el("div", { class: "toolbar" },
          s.paused
            ? el("button", { class: "resume-schedule", onclick: () => act("Resume", did("resume")) }, "Resume")
            : el("button", { class: "pause-schedule", onclick: () => act("Pause", did("pause")) }, "Pause"),
          el("button", { class: "run-schedule", onclick: () => act("Run now", async () => {
            const r = await post(path + "/run");
            await load();
            return "Schedule " + s.name + ": job " + r.job_id + " enqueued";
          }) }, "Run now"),
          el("button", { class: "danger delete-schedule", onclick: () => deleteScheduleConfirm(confirmBox, s.name, load) }, "Delete…")))));
    }
  };
  const load = async () => {
    try {
      render((await get("/api/schedules")).schedules);
    } catch (e) {
      if (e.status !== 401) flash("Loading schedules failed: " + e.message, "error");
    }
  };
  await load();
  state.timer = setInterval(load, 5000);
}

// Deleting a schedule stops its ticks for good: the name must be typed.
function deleteScheduleConfirm(box, name, reload) {
  const input = el("input", { type: "text", id: "delete-schedule-name", "aria-label": "Schedule name",
    placeholder: name, spellcheck: "false", autocomplete: "off" });
  const yes = el("button", { class: "danger", id: "confirm-delete-schedule", disabled: true,
    onclick: () => act("Delete", async () => {
      await post("/api/schedules/" + encodeURIComponent(name) + "/delete", { confirm: input.value });
      clear(box);
      await reload();
      return "Schedule " + name + " deleted";
    }) }, "Delete");
  input.addEventListener("input", () => { yes.disabled = input.value !== name; });
  clear(box).appendChild(el("div", { class: "confirm" },
    el("strong", {}, "Delete the schedule " + name + " for good?"),
    " Its ticks stop; the jobs it enqueued stay. Type the schedule's name to confirm: ",
    input, " ", yes, " ",
    el("button", { id: "cancel-delete-schedule", onclick: () => clear(box) }, "Cancel")));
  input.focus();
}

// ---- jobs by state -----------------------------------------------------------

const STATES = [
  ["live", "Live (all)"], ["available", "Waiting"], ["scheduled", "Delayed"], ["leased", "Leased"],
  ["dead", "Dead"], ["completed", "Completed"],
];

async function jobsPage(queue, stateName, search, key) {
  const m = clear(main());
  const go = (q, st, se, k) => {
    const p = new URLSearchParams();
    if (q) p.set("queue", q);
    if (st && st !== "live") p.set("state", st);
    if (se) p.set("search", se);
    if (k) p.set("key", k);
    const h = "#/jobs" + (p.toString() ? "?" + p.toString() : "");
    if (location.hash === h) refresh(); else location.hash = h;
  };
  const select = el("select", { id: "jobs-queue", "aria-label": "Queue" }, el("option", { value: "" }, "every queue"));
  const names = (state.queues.length ? state.queues : (await get("/api/queues").catch(() => ({ queues: [] }))).queues)
    .map((q) => q.name);
  for (const n of names) select.appendChild(el("option", { value: n, selected: n === queue }, n));
  const states = el("select", { id: "jobs-state", "aria-label": "State" },
    STATES.map(([v, label]) => el("option", { value: v, selected: v === stateName }, label)));
  const input = el("input", { type: "search", id: "jobs-search", value: search, spellcheck: "false",
    placeholder: "job id, or text in dedup key, error or payload", "aria-label": "Search" });
  const keyInput = el("input", { type: "search", id: "jobs-key", value: key, spellcheck: "false",
    placeholder: "key (exact)", "aria-label": "Key", size: 14 });
  const form = el("form", { class: "toolbar", id: "jobs-filter" },
    el("label", { for: "jobs-queue" }, "Queue"), select,
    el("label", { for: "jobs-state" }, "State"), states,
    keyInput, input, el("button", { type: "submit", id: "jobs-search-submit" }, "Search"));
  // A key is matched whole, spaces included: it is not trimmed.
  const goNow = () => go(select.value, states.value, input.value.trim(), keyInput.value);
  form.addEventListener("submit", (ev) => { ev.preventDefault(); goNow(); });
  select.addEventListener("change", goNow);
  states.addEventListener("change", goNow);
  const body = el("tbody", { id: "jobs-body" });
  const more = el("div", { id: "jobs-more-box" });
  append(m, [el("h1", {}, "Jobs"), form,
    el("table", { id: "jobs" },
      el("thead", {}, el("tr", {}, el("th", {}, "Job"), el("th", {}, "Queue"), el("th", {}, "Key"), el("th", {}, "State"),
        el("th", { class: "num" }, "Attempts"), el("th", {}, "Last error"), el("th", {}, "Enqueued"),
        el("th", {}, "Run at"))),
      body),
    more]);
  const load = async (after) => {
    const p = new URLSearchParams({ queue, state: stateName, search, key });
    if (after) p.set("after", after);
    let r;
    try {
      r = await get("/api/jobs?" + p.toString());
    } catch (e) {
      if (e.status !== 401) { clear(more); more.appendChild(el("p", { class: "error", id: "error" }, e.message)); }
      return;
    }
    if (!after && !r.jobs.length) {
      body.appendChild(el("tr", {}, el("td", { colspan: 8, class: "muted", id: "jobs-none" }, search || key ? "No job matches." : "No jobs.")));
    }
    for (const j of r.jobs) {
      body.appendChild(el("tr", { "data-job": j.id },
        el("td", { class: "mono" }, el("a", { href: "#/job/" + encodeURIComponent(j.id) }, j.id)),
        el("td", {}, j.queue),
        el("td", { class: "mono", "data-col": "key" }, j.key || "–"),
        el("td", { "data-col": "state" }, el("span", { class: "badge " + j.state }, j.state)),
        el("td", { class: "num" }, num(j.attempt)),
        el("td", { class: "mono", "data-col": "error" }, j.last_error || "–"),
        el("td", {}, when(j.enqueued_at)),
        el("td", {}, when(j.run_at))));
    }
    partialNote(r.unavailable_clusters);
    clear(more);
    if (r.next) more.appendChild(el("button", { id: "jobs-more", onclick: () => load(r.next) }, "Load more"));
  };
  await load(null);
}

// ---- dead letters ----------------------------------------------------------

async function deadPage(queue) {
  const m = clear(main());
  const select = el("select", { id: "dead-queue", "aria-label": "Queue" },
    el("option", { value: "" }, "every queue"));
  const names = (state.queues.length ? state.queues : (await get("/api/queues").catch(() => ({ queues: [] }))).queues)
    .map((q) => q.name);
  for (const n of names) select.appendChild(el("option", { value: n, selected: n === queue }, n));
  select.addEventListener("change", () => { location.hash = "#/dead/" + encodeURIComponent(select.value); });
  m.appendChild(el("h1", {}, "Dead letters"));
  m.appendChild(el("div", { class: "toolbar" }, el("label", { for: "dead-queue" }, "Queue"), select));
  const q = state.queues.find((x) => x.name === queue);
  const canAdmin = queue !== "" && (!q || q.can_admin);
  const box = el("div", { id: "dead-box" });
  m.appendChild(box);
  let token = "";
  const load = async (more) => {
    let r;
    try {
      r = await get("/api/dead?queue=" + encodeURIComponent(queue) + (more ? "&page_token=" + encodeURIComponent(token) : ""));
    } catch (e) {
      if (e.status !== 401) box.appendChild(el("p", { class: "error", id: "error" }, e.message));
      return;
    }
    token = r.next_page_token;
    renderDead(box, queue, r.jobs, more, canAdmin, token ? () => load(true) : null);
  };
  await load(false);
}

function renderDead(box, queue, jobs, more, canAdmin, next) {
  if (!more) clear(box);
  const denied = canAdmin ? null : (queue ? "needs the admin grant on this queue" : "choose a queue first");
  let body = $("#dead-body", box);
  if (!body) {
    const all = el("input", { type: "checkbox", id: "dead-all", "aria-label": "Select all" });
    all.addEventListener("change", () => {
      for (const c of box.querySelectorAll("input.pick")) c.checked = all.checked;
    });
    const selected = () => [...box.querySelectorAll("input.pick:checked")].map((c) => c.value);
    const confirmBox = el("div", { id: "confirm-box" });
    const requeue = (ids) => act("Requeue", async () => {
      const r = await post("/api/dead/requeue", ids ? { queue, ids } : { queue, all: true });
      await refresh();
      return `Requeued ${r.requeued} job(s)` + (r.skipped_duplicates ? `, ${r.skipped_duplicates} skipped (a live job has the same dedup key)` : "");
    });
    const purge = (ids) => {
      const n = ids ? ids.length : "every";
      clear(confirmBox).appendChild(el("div", { class: "confirm" },
        el("strong", {}, `Delete ${n} dead letter(s) of ${queue} for good?`), " ",
        el("button", { class: "danger", id: "confirm-purge", onclick: () => act("Purge", async () => {
          const r = await post("/api/dead/purge", ids ? { queue, ids, confirm: true } : { queue, all: true, confirm: true });
          await refresh();
          return `Purged ${r.purged} dead letter(s)`;
        }) }, "Yes, purge"), " ",
        el("button", { id: "cancel-purge", onclick: () => clear(confirmBox) }, "Cancel")));
    };
    const needSome = (f) => () => {
      const ids = selected();
      if (!ids.length) { flash("Select dead letters first", "error"); return; }
      f(ids);
    };
    box.appendChild(el("div", { class: "toolbar" },
      el("button", { id: "requeue-selected", disabled: !canAdmin, title: denied, onclick: needSome(requeue) }, "Requeue selected"),
      el("button", { id: "requeue-all", disabled: !canAdmin, title: denied, onclick: () => requeue(null) }, "Requeue all"),
      el("button", { id: "purge-selected", class: "danger", disabled: !canAdmin, title: denied, onclick: needSome(purge) }, "Purge selected"),
      el("button", { id: "purge-all", class: "danger", disabled: !canAdmin, title: denied, onclick: () => purge(null) }, "Purge all…")));
    box.appendChild(confirmBox);
    body = el("tbody", { id: "dead-body" });
    box.appendChild(el("table", { id: "dead" },
      el("thead", {}, el("tr", {}, el("th", {}, all), el("th", {}, "Job"), el("th", {}, "Queue"),
        el("th", {}, "Reason"), el("th", {}, "Last error"), el("th", { class: "num" }, "Attempts"),
        el("th", {}, "Died"))),
      body));
  }
  if (!jobs.length && !more) {
    body.appendChild(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No dead letters.")));
  }
  for (const j of jobs) {
    body.appendChild(el("tr", { "data-job": j.id },
      el("td", {}, el("input", { type: "checkbox", class: "pick", value: j.id, "aria-label": "Select " + j.id })),
      el("td", { class: "mono" }, el("a", { href: "#/job/" + encodeURIComponent(j.id) }, j.id)),
      el("td", {}, j.queue),
      el("td", { "data-col": "reason" }, j.dead_reason),
      el("td", { class: "mono", "data-col": "error" }, j.last_error || "–"),
      el("td", { class: "num" }, num(j.attempt)),
      el("td", {}, when(j.died_at))));
  }
  const old = $("#dead-more", box);
  if (old) old.remove();
  if (next) box.appendChild(el("button", { id: "dead-more", onclick: next }, "Load more"));
}

// ---- one job ---------------------------------------------------------------

function decodeB64(s) {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function hexdump(bytes) {
  const lines = [];
  for (let off = 0; off < bytes.length; off += 16) {
    const row = bytes.slice(off, off + 16);
    const hex = [...row].map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = [...row].map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(off.toString(16).padStart(8, "0") + "  " + hex.padEnd(47) + "  " + ascii);
  }
  return lines.join("\n");
}

function payloadViews(bytes) {
  const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
  let json = null;
  try { json = JSON.stringify(JSON.parse(text), null, 2); } catch (_) { json = null; }
  return { text, json, hex: hexdump(bytes) };
}

async function jobPage(id) {
  const m = clear(main());
  let j;
  try {
    j = await get("/api/jobs/" + encodeURIComponent(id));
  } catch (e) {
    if (e.status !== 401) m.appendChild(el("p", { class: "error", id: "error" }, e.message));
    return;
  }
  const canAdmin = j.can_admin;
  const fields = [
    ["State", el("span", { id: "job-state", class: "badge " + j.state }, j.state)],
    ["Queue", el("a", { href: "#/queue/" + encodeURIComponent(j.queue) }, j.queue)],
    ["Attempts", el("span", { id: "job-attempts" }, j.attempt + (j.max_attempts ? " of " + j.max_attempts : ""))],
    ["Last error", el("span", { id: "job-error", class: "mono" }, j.last_error || "–")],
    ["Lease holder", el("span", { id: "job-leased-by" }, j.leased_by || "–")],
    ["Lease expires", when(j.lease_expires_at)],
    ["Dead reason", j.dead_reason || "–"],
    ["Died", when(j.died_at)],
    ["Completed", j.completed_at ? when(j.completed_at) + " by " + (j.completed_by || "?") : "–"],
    ["Progress", j.progress === null || j.progress === undefined ? el("span", { id: "job-progress" }, "–")
      : el("span", { id: "job-progress" },
        el("progress", { max: "1", value: String(j.progress) }), " ",
        el("span", { id: "job-progress-pct" }, Math.round(j.progress * 100) + " %"), " ",
        el("span", { id: "job-progress-message", class: "mono" }, j.progress_message || ""), " ",
        el("span", { class: "muted" }, when(j.progress_at)))],
    ["Enqueued", when(j.enqueued_at)],
    ["Run at", when(j.run_at)],
    ["Expires (ttl)", when(j.expires_at)],
    ["Priority", String(j.priority)],
    ["Dedup key", j.dedup_key || "–"],
    ["Key", el("span", { id: "job-key", class: "mono" }, j.key || "–")],
  ];
  const dl = el("dl", { id: "job-fields" });
  for (const [k, v] of fields) append(dl, [el("dt", {}, k), el("dd", {}, v)]);
  const headers = el("dl", { id: "job-headers" });
  for (const [k, v] of j.headers) append(headers, [el("dt", { class: "mono" }, k), el("dd", { class: "mono" }, v)]);
  const bytes = decodeB64(j.payload_b64 || "");
  const views = payloadViews(bytes);
  const pre = el("pre", { id: "payload" });
  const tabs = el("div", { class: "tabs", role: "tablist" });
  const show = (kind) => {
    pre.textContent = kind === "json" ? views.json : kind === "hex" ? views.hex : views.text;
    pre.dataset.view = kind;
    for (const b of tabs.querySelectorAll("button")) b.classList.toggle("on", b.dataset.kind === kind);
  };
  for (const [kind, label] of [["text", "Text"], ["json", "JSON"], ["hex", "Hex"]]) {
    tabs.appendChild(el("button", { "data-kind": kind, id: "view-" + kind, disabled: kind === "json" && views.json === null,
      title: kind === "json" && views.json === null ? "not JSON" : null, onclick: () => show(kind) }, label));
  }
  show(views.json !== null ? "json" : "text");
  const actions = el("div", { class: "toolbar" });
  const confirmBox = el("div", { id: "cancel-box" });
  if (["available", "scheduled", "leased"].includes(j.state)) {
    const denied = canAdmin ? null : "needs the admin grant on this queue";
    actions.appendChild(el("button", { id: "job-cancel", class: "danger", disabled: !canAdmin, title: denied,
      onclick: () => clear(confirmBox).appendChild(el("div", { class: "confirm" },
        el("strong", {}, "Cancel this job? It is deleted" + (j.state === "leased" ? ", and its consumer's ack will be refused" : "") + "."), " ",
        el("button", { class: "danger", id: "confirm-cancel", onclick: () => act("Cancel", async () => {
          await post(`/api/jobs/${encodeURIComponent(j.id)}/cancel`);
          await refresh();
          return "Job cancelled";
        }) }, "Yes, cancel it"), " ",
        el("button", { id: "keep-job", onclick: () => clear(confirmBox) }, "Keep it"))) }, "Cancel job…"));
  }
  if (j.state === "dead") {
    const denied = canAdmin ? null : "needs the admin grant on this queue";
    actions.appendChild(el("button", { id: "job-requeue", class: "primary", disabled: !canAdmin, title: denied,
      onclick: () => act("Requeue", async () => {
        const r = await post("/api/dead/requeue", { queue: j.queue, ids: [j.id] });
        await refresh();
        return r.requeued ? "Requeued" : "Not requeued: a live job has the same dedup key";
      }) }, "Requeue"));
  }
  const attempts = j.attempts.length
    ? el("table", { id: "attempts" },
      el("thead", {}, el("tr", {}, el("th", { class: "num" }, "Attempt"), el("th", {}, "Ended"), el("th", {}, "Error"))),
      el("tbody", {}, j.attempts.map((a) => el("tr", { "data-attempt": a.attempt },
        el("td", { class: "num" }, num(a.attempt)),
        el("td", {}, when(a.at)),
        el("td", { class: "mono", "data-col": "error" }, a.error || "–")))))
    : el("p", { class: "muted", id: "attempts" }, "No failed attempt.");
  // The result (AckRequest.result): a preview of its first bytes, as text
  // (never as markup: textContent) or JSON.
  const result = [];
  if (j.result_b64) {
    const rv = payloadViews(decodeB64(j.result_b64));
    const shown = decodeB64(j.result_b64).length;
    result.push(
      el("h2", {}, "Result ", el("span", { class: "muted", id: "result-size" }, "(" + num(j.result_bytes) + " bytes"
        + (shown < j.result_bytes ? ", the first " + num(shown) + " shown" : "") + ")")),
      el("pre", { id: "result" }, rv.json !== null ? rv.json : rv.text));
  }
  append(m, [
    el("h1", {}, "Job ", el("span", { class: "mono", id: "job-id" }, j.id)),
    actions, confirmBox,
    el("div", { class: "grid" },
      el("div", { class: "panel" }, dl),
      el("div", { class: "panel" }, el("h2", {}, "Headers"), j.headers.length ? headers : el("p", { class: "muted" }, "none"))),
    result,
    el("h2", {}, "Failed attempts"), attempts,
    el("h2", {}, "Payload ", el("span", { class: "muted" }, "(" + num(j.payload_bytes) + " bytes)")),
    tabs, pre]);
}

document.addEventListener("DOMContentLoaded", start);
