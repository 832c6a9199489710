// The status page of accel's rendezvous server: polls /api/jobs every two
// seconds and shows every job, its nodes, its last failure and its root
// cause, and the job's last stack collection (grouped, the odd ranks out
// first): one a FileTimer hang took, or one the Stacks button asks for
// (POST /api/stacks?job=ID; a link to #stacks=ID asks on load). All text
// goes in through textContent: nothing a node reported is read as HTML.
"use strict";

const EVERY_MS = 2000;
const KEY = "accel-rdzv-token";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    // A style through the CSSOM: the page's policy allows no inline style.
    if (k === "class") e.className = v; else if (k === "style") Object.assign(e.style, v); else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fact(label, value) {
  return el("span", {}, label + " ", el("b", {}, value));
}

function nnodes(j) {
  return j.min_nodes === j.max_nodes ? String(j.max_nodes) : j.min_nodes + ":" + j.max_nodes;
}

// Per job: the last stacks fetched ({at, text}), whether their panel is
// open (at first: a job has kept stacks only when someone asked or a rank
// hung, and then they are what matters), and whether a collection this
// page asked for is awaited.
const stacks = new Map();

function headers() {
  const token = sessionStorage.getItem(KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}

function stacksOf(id) {
  if (!stacks.has(id)) stacks.set(id, { at: null, text: null, open: true, asking: false, error: null });
  return stacks.get(id);
}

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

// Fetches the job's kept stacks; while a collection runs, again every
// second. One loop per job at a time (`fetching`).
async function fetchStacks(id) {
  const s = stacksOf(id);
  if (s.fetching) return;
  s.fetching = true;
  try {
    for (;;) {
      const r = await fetch("/api/stacks?job=" + encodeURIComponent(id), { headers: headers(), cache: "no-store" });
      // Still collecting (202), or the server paces large answers (429,
      // 503 with Retry-After: 1): ask again in a second.
      if (r.status === 202 || ((r.status === 429 || r.status === 503) && r.headers.get("Retry-After"))) {
        await sleep(1000);
        continue;
      }
      const doc = await r.json();
      if (r.ok) {
        s.at = doc.at_unix_ms;
        s.text = doc.text;
        s.error = null;
      } else {
        s.error = doc.error || ("HTTP " + r.status);
      }
      break;
    }
  } catch (e) {
    s.error = "cannot reach the server: " + e;
  }
  s.asking = false;
  s.fetching = false;
  redraw();
}

// Asks the server to collect the job's stacks now, then shows them.
async function askStacks(id) {
  const s = stacksOf(id);
  s.asking = true;
  s.open = true;
  s.error = null;
  redraw();
  try {
    const r = await fetch("/api/stacks?job=" + encodeURIComponent(id), {
      method: "POST", headers: Object.assign({ "X-Accel-Request": "stacks" }, headers()), cache: "no-store",
    });
    if (r.status !== 202) {
      const doc = await r.json();
      s.asking = false;
      s.error = doc.error || ("HTTP " + r.status);
      redraw();
      return;
    }
  } catch (e) {
    s.asking = false;
    s.error = "cannot reach the server: " + e;
    redraw();
    return;
  }
  await sleep(500);
  fetchStacks(id);
}

// "0.4 s ago", "3 min ago".
function ago(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s ago";
  if (ms < 3600000) return Math.round(ms / 60000) + " min ago";
  return Math.round(ms / 3600000) + " h ago";
}

const KINDS = { formed: "formed", restart: "restarted", "re-form": "re-formed", succeeded: "succeeded", failed: "failed" };

// The job's rounds, restarts and end, newest first (the last eight).
function timeline(events) {
  const items = events.slice(-8).reverse().map((e) => {
    const what = e.kind === "formed"
      ? "round " + e.round + " formed: " + e.nnodes + " nodes, " + e.world_size + " workers"
      : "round " + e.round + " " + (KINDS[e.kind] || e.kind) + (e.reason ? ": " + e.reason : "");
    return el("li", { class: "tl tl-" + e.kind },
      el("time", {}, new Date(e.unix_ms).toLocaleTimeString()), " " + what);
  });
  return el("details", { class: "timeline", open: "" }, el("summary", {}, "timeline"), el("ol", {}, ...items));
}

const CATEGORIES = ["productive", "recomputation", "recovery", "start-up", "waiting"];

function seconds(ms) {
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  if (ms < 3600000) return Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
  return (ms / 3600000).toFixed(1) + " h";
}

// Where the job's time went: a bar in time order, one color per category,
// a mark at each restart, and the totals under it.
function timeBar(g) {
  const wall = CATEGORIES.reduce((a, c) => a + (g[c.replace("-", "_") + "_s"] || 0), 0) * 1000;
  if (!(wall > 0)) return null;
  const segs = g.segments || [];
  const from = segs.length ? segs[0].unix_ms : 0;
  const to = segs.length ? segs[segs.length - 1].unix_ms + segs[segs.length - 1].ms : 0;
  const span = Math.max(1, to - from);
  const pct = (x) => (Math.max(0, Math.min(1, x)) * 100).toFixed(3) + "%";
  const bar = el("div", { class: "timebar", "data-goodput": (g.goodput_percent || 0).toFixed(1) },
    ...segs.map((s) => el("span", {
      class: "seg seg-" + s.category,
      "data-category": s.category,
      "data-ms": s.ms,
      style: { left: pct((s.unix_ms - from) / span), width: pct(s.ms / span) },
      title: s.category + " " + seconds(s.ms) + " from " + new Date(s.unix_ms).toLocaleTimeString(),
    })),
    ...(g.losses || []).filter((l) => l.unix_ms >= from).map((l) => el("i", {
      class: "loss",
      "data-round": l.round,
      style: { left: pct((l.unix_ms - from) / span) },
      title: "restart of round " + l.round + (l.step !== null ? " at step " + l.step : "") + ": " + l.cause,
    })));
  const legend = el("div", { class: "legend" },
    el("b", {}, "goodput " + (g.goodput_percent || 0).toFixed(1) + " %"), " of " + seconds(wall) + ": ",
    ...CATEGORIES.map((c) => {
      const ms = (g[c.replace("-", "_") + "_s"] || 0) * 1000;
      let what = c + " " + seconds(ms);
      if (c === "recomputation" && g.lost_steps) what += " (" + g.lost_steps + " steps)";
      if (c === "recovery" && g.restarts) what += " (" + g.restarts + (g.restarts === 1 ? " restart)" : " restarts)");
      return el("span", { class: "key key-" + c, "data-category": c, "data-ms": Math.round(ms) }, what);
    }));
  const last = (g.losses || []).slice(-1)[0];
  const cost = last ? el("div", { class: "loss-cost" },
    "last restart (round " + last.round + ") cost " + seconds(last.recovery_s * 1000) + " recovery" +
    (last.lost_steps ? " + " + seconds(last.recomputation_s * 1000) + " recomputation (" + last.lost_steps +
      " steps, " + (last.checkpoint === null ? 0 : last.checkpoint) + "→" + last.step + ")" : "") +
    ": " + last.cause) : null;
  return el("div", { class: "goodput" }, bar, legend, cost);
}

function rootCause(f) {
  const exit = f.exitcode < 0 ? "signal " + (-f.exitcode) : "exit code " + f.exitcode;
  return el("div", { class: "root-cause", title: "root cause: the first failure reported in its round" },
    el("b", {}, "root cause "), "rank " + f.rank + " (local rank " + f.local_rank + ") on " + f.host +
    ", " + exit + (f.pid ? ", pid " + f.pid : "") + (f.message ? ": " + f.message : ""));
}

function stacksPanel(j) {
  const s = stacksOf(j.job_id);
  const button = el("button", { type: "button", class: "ask-stacks", title: "collect every rank's Python stacks now (py-spy dump on each node)" }, s.asking ? "collecting…" : "Stacks");
  if (j.job_id === linked) {
    button.dataset.linked = "true";
    if (!linkFocused) {
      linkFocused = true;
      queueMicrotask(() => button.focus());
    }
  }
  if (s.asking) button.disabled = true;
  button.addEventListener("click", () => askStacks(j.job_id));
  const panel = el("div", { class: "stacks-panel" }, button);
  if (s.error) panel.append(el("span", { class: "error" }, " " + s.error));
  if (s.text !== null) {
    const when = new Date(s.at).toLocaleTimeString();
    const d = el("details", { class: "stacks", "data-stacks-at": s.at },
      el("summary", {}, "every rank's stacks, grouped, as of " + when),
      el("pre", {}, s.text));
    d.open = s.open;
    d.addEventListener("toggle", () => { s.open = d.open; });
    panel.append(d);
  }
  return panel;
}

function jobCard(j) {
  const left = Math.max(0, j.max_restarts - j.restart_count);
  const card = el("section", { class: "job", "data-job": j.job_id },
    el("h2", {}, el("span", { class: "id" }, j.job_id),
      el("span", { class: "phase phase-" + j.phase }, j.phase)),
    el("div", { class: "facts" },
      fact("round", j.round),
      fact("restarts", j.restart_count + " of " + j.max_restarts + " (" + left + " left)"),
      fact("nnodes", nnodes(j)),
      fact("world", j.world_size),
      fact("members", j.node_count)));
  if (j.last_failure) {
    card.append(el("div", { class: "failure", title: "last failure" }, j.last_failure));
  }
  if (j.root_cause) card.append(rootCause(j.root_cause));
  if (j.goodput) {
    const bar = timeBar(j.goodput);
    if (bar) card.append(bar);
  }
  for (const s of j.stragglers || []) {
    card.append(el("div", { class: "straggler", "data-straggler-rank": s.rank, title: "a rank persistently slower per step than the job's median" },
      el("b", {}, "straggler "), "rank " + s.rank + " on " + s.host + ": " +
      (s.step_us / Math.max(1, s.median_us)).toFixed(2) + "x the job's median step (" +
      (s.step_us / 1000).toFixed(1) + " ms against " + (s.median_us / 1000).toFixed(1) + " ms)"));
  }
  // Stacks the server kept that this page has not fetched (a hang's, or
  // another operator's): fetched once.
  const s = stacksOf(j.job_id);
  if (j.stacks_unix_ms !== null && j.stacks_unix_ms !== undefined && j.stacks_unix_ms !== s.at && !s.asking) {
    fetchStacks(j.job_id);
  }
  card.append(stacksPanel(j));
  const rows = j.nodes.map((n) => el("tr", { "data-node": n.node_id },
    el("td", { class: "rank" }, n.node_rank === null ? "–" : n.node_rank),
    el("td", {}, n.hostname),
    el("td", {}, el("span", { class: "state state-" + n.state }, n.state)),
    el("td", {}, n.topology || ""),
    el("td", { class: "seen" }, ago(n.last_seen_ms)),
    el("td", {}, n.node_id)));
  card.append(el("table", {},
    el("thead", {}, el("tr", {}, ...["rank", "host", "state", "topology", "heard", "node"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows)));
  if (j.timeline && j.timeline.length) card.append(timeline(j.timeline));
  if (j.node_count > j.nodes.length) {
    card.append(el("p", { class: "more" }, "… and " + (j.node_count - j.nodes.length) + " more nodes"));
  }
  return card;
}

let refreshes = 0;
let last = null;
// The job a #stacks=ID link points at, and whether its button got the focus.
let linked = null;
let linkFocused = false;

// Draws the last answer again (a stacks fetch or a click changed what a
// card shows).
function redraw() {
  if (last) draw(last);
}

function show(doc) {
  last = doc;
  // How many answers the page has shown since it loaded (it never reloads).
  refreshes += 1;
  document.getElementById("jobs").dataset.refreshes = String(refreshes);
  draw(doc);
}

function draw(doc) {
  const main = document.getElementById("jobs");
  const cards = doc.jobs.map(jobCard);
  if (cards.length === 0) cards.push(el("p", { class: "more" }, "no jobs"));
  if (doc.more) cards.push(el("p", { class: "more" }, "more jobs than one page: rdzv-server status lists them all"));
  main.replaceChildren(...cards);
  const phases = {};
  for (const j of doc.jobs) phases[j.phase] = (phases[j.phase] || 0) + 1;
  const summary = Object.entries(phases).map(([p, n]) => n + " " + p).join(", ");
  state(doc.jobs.length + " job" + (doc.jobs.length === 1 ? "" : "s") + (summary ? " (" + summary + ")" : "") +
        " · updated " + new Date().toLocaleTimeString(), false);
}

// The torchft lighthouse (rdzv-server --lighthouse): its last quorum and
// the replica groups it hears. Hidden when the server does not serve one.
function drawLighthouse(l) {
  const box = document.getElementById("lighthouse");
  if (!l) {
    box.hidden = true;
    return;
  }
  const members = l.members.map((m) => m.replica_id + " (step " + m.step + ")").join(", ");
  const heard = l.heartbeats.map((h) => h.replica_id + " " + h.age_s.toFixed(1) + " s ago").join(", ");
  box.replaceChildren(
    el("h2", {}, "torchft lighthouse"),
    el("p", { class: "facts" },
      fact("quorum", l.quorum_id ? String(l.quorum_id) : "none yet"),
      fact("members", members || "none"),
      fact("formed", l.since_quorum_ms === null ? "never" : (l.since_quorum_ms / 1000).toFixed(1) + " s ago"),
      fact("healthy groups", String(l.healthy)),
      fact("waiting", l.waiting + (l.waiting_reason ? ": " + l.waiting_reason : "")),
      fact("heartbeats", heard || "none")));
  box.hidden = false;
}

async function pollLighthouse() {
  try {
    const r = await fetch("/api/lighthouse", { headers: headers(), cache: "no-store" });
    drawLighthouse(r.ok ? await r.json() : null);
  } catch (e) {
    drawLighthouse(null);
  }
}

function state(text, error) {
  const s = document.getElementById("state");
  s.textContent = text;
  s.classList.toggle("error", error);
}

async function poll() {
  try {
    const r = await fetch("/api/jobs", { headers: headers(), cache: "no-store" });
    const doc = await r.json();
    if (r.status === 401) {
      sessionStorage.removeItem(KEY);
      document.getElementById("login").hidden = false;
      state(doc.error || "this rendezvous requires its token", true);
      return;
    }
    if (!r.ok) {
      state(doc.error || ("HTTP " + r.status), true);
    } else {
      document.getElementById("login").hidden = true;
      show(doc);
      await pollLighthouse();
    }
  } catch (e) {
    state("cannot reach the server: " + e, true);
  }
  setTimeout(poll, EVERY_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, document.getElementById("token").value.trim());
    document.getElementById("login").hidden = true;
    poll();
  });
  // A link to #stacks=ID points at that job's stacks: its card is marked
  // and its Stacks button focused. Collecting takes a click: a link from
  // another site must not make the server dump every worker.
  const m = /^#stacks=(.+)$/.exec(location.hash);
  if (m) {
    try {
      linked = decodeURIComponent(m[1]);
    } catch (e) {
      linked = null;
    }
  }
  poll();
});
