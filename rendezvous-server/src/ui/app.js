// The status page of accel's rendezvous server: polls /api/jobs every two
// seconds and shows every job, its nodes and its last failure. All text
// goes in through textContent: nothing a node reported is read as HTML.
"use strict";

const EVERY_MS = 2000;
const KEY = "accel-rdzv-token";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
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

function jobCard(j) {
  const left = Math.max(0, j.max_restarts - j.restart_count);
  const card = el("section", { class: "job", "data-job": j.job_id },
    el("h2", {}, el("span", { class: "id" }, j.job_id),
      el("span", { class: "phase phase-" + j.phase }, j.phase)),
    el("div", { class: "facts" },
      fact("round", j.round),
      fact("restarts", j.restart_count + " of " + j.max_restarts + " (" + left + " left)"),
      fact("nnodes", nnodes(j)),
      fact("members", j.node_count)));
  if (j.last_failure) {
    card.append(el("div", { class: "failure", title: "last failure" }, j.last_failure));
  }
  const rows = j.nodes.map((n) => el("tr", { "data-node": n.node_id },
    el("td", { class: "rank" }, n.node_rank === null ? "–" : n.node_rank),
    el("td", {}, n.hostname),
    el("td", {}, el("span", { class: "state state-" + n.state }, n.state)),
    el("td", {}, n.topology || ""),
    el("td", {}, n.node_id)));
  card.append(el("table", {},
    el("thead", {}, el("tr", {}, ...["rank", "host", "state", "topology", "node"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows)));
  if (j.node_count > j.nodes.length) {
    card.append(el("p", { class: "more" }, "… and " + (j.node_count - j.nodes.length) + " more nodes"));
  }
  return card;
}

let refreshes = 0;

function show(doc) {
  const main = document.getElementById("jobs");
  // How many answers the page has shown since it loaded (it never reloads).
  refreshes += 1;
  main.dataset.refreshes = String(refreshes);
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

function state(text, error) {
  const s = document.getElementById("state");
  s.textContent = text;
  s.classList.toggle("error", error);
}

async function poll() {
  const token = sessionStorage.getItem(KEY);
  const headers = token ? { Authorization: "Bearer " + token } : {};
  try {
    const r = await fetch("/api/jobs", { headers, cache: "no-store" });
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
  poll();
});
