// The platform console: plain JS over the JSON API (docs/api.md), no framework, no build.
// This module signs in and out, polls, and routes `#/<view>[?filters]` to the views' modules
// (deployments.js, jobs.js, job.js, usage.js, keys.js, playground.js), which draw with dom.js
// and charts.js, read and act through session.js and actions.js, and keep their filters in
// the URL (url.js).
//
// NOTE: the API key lives in sessionStorage (this tab only) and travels only in the
// Authorization header; it never enters a URL, the DOM or a log. Every value from the API is
// put in the page with textContent or as an SVG attribute, never parsed as HTML.
import { KEY_STORAGE, state, ApiError, api } from "./session.js";
import { h, $, fill } from "./dom.js";
import { deploymentsView } from "./deployments.js";
import { jobsView } from "./jobs.js";
import { jobView } from "./job.js";
import { usageView } from "./usage.js";
import { keysView } from "./keys.js";
import { playgroundView } from "./playground.js";
import { parseHash } from "./url.js";

const POLL_MS = 2000;
const HISTORY = 900; // queue-depth samples kept per deployment (30 min at POLL_MS)

function showLogin(message) {
  $("login").hidden = false;
  $("view").hidden = true;
  $("nav").hidden = true;
  $("who").hidden = true;
  $("login-error").textContent = message || "";
  $("api-key").value = "";
  $("api-key").focus();
}

function signOut(message) {
  sessionStorage.removeItem(KEY_STORAGE);
  state.key = null;
  state.scopes = null;
  state.keyId = null;
  state.samples.clear();
  state.unfolded.clear();
  state.poolReadable = true;
  clearTimeout(state.timer);
  if (state.view && state.view.close) state.view.close();
  state.view = null;
  fill($("view"));
  showLogin(message);
}

async function signIn(key) {
  state.key = key;
  try {
    state.deployments = (await api("/v1/deployments")).data;
  } catch (e) {
    state.key = null;
    throw e;
  }
  sessionStorage.setItem(KEY_STORAGE, key);
  await startApp();
}

// The key's own scopes: the actions it may not take are shown disabled, with the reason.
async function readScopes() {
  try {
    const me = await api("/v1/keys/current");
    state.scopes = me.scopes;
    state.keyId = me.id;
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) throw e;
    state.scopes = null; // unknown: every action shows why it is off
  }
}

async function startApp() {
  try {
    await readScopes();
  } catch (e) {
    signOut(`The key was refused: ${e.message}`);
    return;
  }
  $("login").hidden = true;
  $("view").hidden = false;
  $("nav").hidden = false;
  $("who").hidden = false;
  // only the public lookup prefix of the key is shown (pk_<prefix>_…)
  const prefix = state.key.split("_").slice(0, 2).join("_");
  const scopes = state.scopes ? ` (${state.scopes.join(", ")})` : "";
  $("key-prefix").textContent = `${prefix}_…${scopes}`;
  state.session += 1;
  route();
  tick(state.session);
}

function sample(deps) {
  const t = Date.now();
  for (const d of deps) {
    const series = state.samples.get(d.name) || [];
    const workers = Object.values(d.workers || {}).reduce((a, b) => a + b, 0);
    series.push({
      t,
      queued: d.scaling ? d.scaling.queued : null,
      running: d.scaling ? d.scaling.running : null,
      workers,
    });
    if (series.length > HISTORY) series.splice(0, series.length - HISTORY);
    state.samples.set(d.name, series);
  }
}

async function tick(session) {
  clearTimeout(state.timer);
  if (!state.key || session !== state.session) return;
  try {
    state.deployments = (await api("/v1/deployments")).data;
    sample(state.deployments);
    setStatus(null);
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      signOut(`The key was refused: ${e.message}`);
      return;
    }
    setStatus(e);
  }
  const view = state.view;
  if (view && Date.now() - view.refreshedAt >= (view.everyMs || 0)) {
    await refreshView(view);
  }
  if (state.key && session === state.session) {
    state.timer = setTimeout(() => tick(session), POLL_MS);
  }
}

async function refreshView(view) {
  view.refreshedAt = Date.now();
  const token = state.viewToken;
  try {
    await view.refresh(() => token === state.viewToken);
    if (token === state.viewToken) setStatus(null);
  } catch (e) {
    if (token !== state.viewToken) return;
    if (e instanceof ApiError && e.status === 401) {
      signOut(`The key was refused: ${e.message}`);
      return;
    }
    setStatus(e);
  }
}

function setStatus(error) {
  const bar = $("status");
  if (!bar) return;
  bar.className = error ? "status error" : "status";
  const time = new Date().toLocaleTimeString([], { hour12: false });
  if (!error) {
    bar.textContent = `Updated ${time}`;
  } else if (error instanceof ApiError) {
    bar.textContent = `${time}: the API answered ${error.status}: ${error.message}`;
  } else {
    bar.textContent = `${time}: could not reach the API (${error.message})`;
  }
}

function decoded(part) {
  try {
    return decodeURIComponent(part);
  } catch (_) {
    return part; // a malformed escape: looked up as typed (the API answers 404)
  }
}

const VIEWS = {
  deployments: deploymentsView,
  jobs: jobsView,
  usage: usageView,
  keys: keysView,
  playground: playgroundView,
};

function route() {
  if (!state.key) return;
  const { name, arg, params } = parseHash();
  const make = name === "jobs" && arg ? (redraw) => jobView(decoded(arg), redraw) : VIEWS[name];
  if (!make) {
    window.location.hash = "#/deployments";
    return;
  }
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.view === name);
  }
  state.viewToken += 1;
  if (state.view && state.view.close) state.view.close();
  const main = $("view");
  fill(main, h("p", { id: "status", class: "status", text: "Loading…" }));
  // a view refreshes itself through the router (a filter changed), with its error handling
  let view = null;
  view = make(() => refreshView(view), params);
  view.refreshedAt = 0;
  main.append(view.root);
  state.view = view;
  refreshView(view);
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const key = $("api-key").value.trim();
    $("login-error").textContent = "";
    if (!key) return;
    try {
      await signIn(key);
    } catch (err) {
      $("api-key").value = "";
      $("login-error").textContent =
        err instanceof ApiError && err.status === 401
          ? "That key was refused (unknown or revoked)."
          : err instanceof ApiError && err.status === 403
            ? "That key may not read this tenant's deployments (it needs the 'read' scope)."
            : `Could not sign in: ${err.message}`;
    }
  });
  $("sign-out").addEventListener("click", () => signOut(""));
  window.addEventListener("hashchange", route);
  const saved = sessionStorage.getItem(KEY_STORAGE);
  if (saved) {
    state.key = saved;
    startApp();
  } else {
    showLogin("");
  }
});

