// The deployments view: per deployment its health, workers by state (failed ones shown open),
// the autoscaler's decision, queue depth over time, recent workers and its actions
// (deploy_actions.js); filters in the URL; and the warm pool for the operator's keys.
import { state, ApiError, api } from "./session.js";
import {
  h,
  s,
  fill,
  secs,
  stamp,
  ago,
  stateBadge,
  table,
  td,
  empty,
  section,
  foldable,
  fact,
} from "./dom.js";
import { svgRoot, stepChart } from "./charts.js";
import { deploymentActions } from "./deploy_actions.js";
import { setParams } from "./url.js";

const WORKER_STATES = ["booting", "loading", "warming", "idle", "busy", "draining"];

const HEALTH = ["failing", "starting", "serving", "scaled_to_zero"];

// `redraw`: refresh this view now; `params`: its filters from the URL (url.js)
function deploymentsView(redraw, params) {
  const filters = { deployment: params.get("deployment") || "", health: params.get("health") || "" };
  const changed = (key) => (e) => {
    filters[key] = e.target.value;
    setParams(filters);
    redraw();
  };
  const depSelect = h("select", { id: "filter-deployment", onchange: changed("deployment") });
  const healthSelect = h(
    "select",
    { id: "filter-health", onchange: changed("health") },
    h("option", { value: "", text: "any" }),
    HEALTH.map((x) => h("option", { value: x, text: x.replaceAll("_", " "), selected: x === filters.health })),
  );
  const list = h("div", { class: "cards" });
  const pool = h("div", {});
  const root = h(
    "div",
    {},
    h("h1", { text: "Deployments" }),
    h(
      "div",
      { class: "toolbar" },
      h("label", {}, "Deployment ", depSelect),
      h("label", {}, "Health ", healthSelect),
    ),
    list,
    pool,
  );
  // name → the card, kept across polls: its actions (forms being filled in) are never redrawn
  const cards = new Map();
  return {
    root,
    everyMs: 0,
    async refresh(current) {
      syncOptions(depSelect, filters.deployment);
      const [workers, poolBody] = await Promise.all([
        api("/v1/workers").then((b) => b.data),
        readPool(),
      ]);
      if (!current()) return;
      const byDep = new Map();
      for (const w of workers) {
        if (!byDep.has(w.deployment)) byDep.set(w.deployment, []);
        byDep.get(w.deployment).push(w);
      }
      const names = new Set(state.deployments.map((d) => d.name));
      for (const name of cards.keys()) if (!names.has(name)) cards.delete(name);
      const shown = [];
      for (const d of state.deployments) {
        const ws = byDep.get(d.name) || [];
        const health = healthOf(d, ws);
        if (filters.deployment && d.name !== filters.deployment) continue;
        if (filters.health && health !== filters.health) continue;
        if (!cards.has(d.name)) cards.set(d.name, newCard(d.name, redraw));
        const card = cards.get(d.name);
        card.root.dataset.health = health;
        fill(card.body, cardBody(d, ws, health));
        shown.push(card.root);
      }
      if (shown.length) {
        // re-inserted only when the set or order changed (re-inserting drops the focus)
        const same =
          list.children.length === shown.length && shown.every((c, i) => list.children[i] === c);
        if (!same) fill(list, shown);
      } else {
        fill(
          list,
          empty(
            state.deployments.length
              ? "No deployment matches these filters."
              : "No deployments yet: create one with 'platform deploy' or POST /v1/deployments.",
          ),
        );
      }
      fill(pool, poolBody && poolBody.data.length ? poolPanel(poolBody) : null);
    },
  };
}

function syncOptions(select, chosen) {
  const names = ["", ...state.deployments.map((d) => d.name)];
  if (chosen && !names.includes(chosen)) names.push(chosen); // from the URL, not (yet) listed
  const have = [...select.options].map((o) => o.value);
  if (have.join("\n") === names.join("\n")) return;
  fill(select, ...names.map((n) => h("option", { value: n, text: n || "all", selected: n === chosen })));
}

// failing: the autoscaler holds back (crash backoff or loop), or the current version's newest
// worker failed and none serves; else serving, starting (workers not ready yet) or at zero.
function healthOf(d, workers) {
  const reason = d.scaling ? d.scaling.reason : null;
  if (reason === "crash_loop" || reason === "crash_backoff") return "failing";
  const counts = d.workers || {};
  if (counts.idle || counts.busy) return "serving";
  const current = workers.filter((w) => w.deployment_version === d.version);
  if (current.length && current[0].state === "failed") return "failing";
  if (Object.values(counts).some((n) => n > 0)) return "starting";
  return "scaled_to_zero";
}

function newCard(name, redraw) {
  const body = h("div", {});
  const root = h(
    "article",
    { class: "card", "data-deployment": name },
    body,
    deploymentActions(name, redraw),
  );
  return { root, body };
}

async function readPool() {
  if (!state.poolReadable) return null;
  try {
    return await api("/v1/pool");
  } catch (e) {
    if (e instanceof ApiError && (e.status === 403 || e.status === 404)) {
      state.poolReadable = false; // not the operator: the pool is the platform's
      return null;
    }
    throw e;
  }
}

function workerBar(d) {
  const counts = d.workers || {};
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const scale = Math.max(total, d.max_workers || 1);
  const W = 240;
  const root = svgRoot(W, 14, "wbar", "workers by state");
  root.append(s("rect", { x: 0, y: 0, width: W, height: 14, rx: 3, class: "track" }));
  let x0 = 0;
  for (const st of WORKER_STATES) {
    const n = counts[st] || 0;
    if (!n) continue;
    const w = (W * n) / scale;
    const seg = s("rect", { x: x0, y: 0, width: w, height: 14, class: `seg st-${st}` });
    seg.append(s("title", { text: `${n} ${st}` }));
    root.append(seg);
    x0 += w;
  }
  const chips = WORKER_STATES.filter((st) => counts[st]).map((st) =>
    h("span", { class: `chip st-${st}`, "data-state": st, text: `${counts[st]} ${st}` }),
  );
  return h(
    "div",
    { class: "workers", "data-workers-total": total },
    root,
    h(
      "span",
      { class: "chips" },
      chips.length ? chips : h("span", { class: "muted", text: "0 workers: scaled to zero" }),
    ),
    h("span", { class: "muted", text: ` (min ${d.min_workers}, max ${d.max_workers})` }),
  );
}

function scalingFacts(sc) {
  if (!sc) {
    return h("p", {
      class: "muted",
      text: "No autoscaler decision in the last five minutes (a new deployment, or the reconciler is not running).",
    });
  }
  const pl = sc.placement;
  const eta = pl && pl.eta_s != null ? ` (ready in ~${secs(pl.eta_s)})` : "";
  const place = pl ? `${pl.choice}${eta}, ${ago(pl.at)}` : "—";
  const keepalive = sc.idle_windows ? sc.idle_windows.keepalive_s : null;
  const crash = sc.reason === "crash_loop" || sc.reason === "crash_backoff";
  const reason = h("span", {
    class: `badge reason${crash ? " bad" : ""}`,
    "data-reason": sc.reason,
    text: sc.reason,
  });
  const forecast = sc.forecast ? `${(sc.forecast.rate_per_s * 60).toFixed(2)} calls/min` : "—";
  return h(
    "dl",
    { class: "facts scaling" },
    fact("decision", h("span", {}, reason, ` ${ago(sc.decided_at)}`)),
    fact("desired / actual / ready", `${sc.desired} / ${sc.actual} / ${sc.ready}`),
    fact("needed now", sc.needed),
    fact("queued / running", `${sc.queued} / ${sc.running}`),
    fact("boot / service", `${secs(sc.boot_s)} / ${secs(sc.service_s)}`),
    fact("next pre-warm", sc.next_prewarm_at ? stamp(sc.next_prewarm_at) : "—"),
    fact("keep-alive", keepalive != null ? secs(keepalive) : "—"),
    fact("forecast", forecast),
    fact("last placement", place),
  );
}

function cardBody(d, workers, health) {
  const series = state.samples.get(d.name) || [];
  const chart = stepChart(
    [
      // drawn in this order: the queue on top where the lines meet
      { name: "workers", cls: "s-workers", area: true, points: series.map((p) => [p.t, p.workers]) },
      { name: "running", cls: "s-running", points: series.map((p) => [p.t, p.running]) },
      { name: "queued", cls: "s-queued", points: series.map((p) => [p.t, p.queued]) },
    ],
    { now: Date.now(), label: `queue depth of ${d.name} over time` },
  );
  const recent = workers.slice(0, 6).map(workerRow);
  const q = encodeURIComponent(d.name);
  return [
    h(
      "header",
      {},
      h("h2", { text: d.name }),
      h("span", {
        class: `badge health h-${health}`,
        "data-health": health,
        text: health.replaceAll("_", " "),
      }),
      h("span", { class: "muted", text: `v${d.version} · ${d.accelerator} · ${d.model}` }),
      h(
        "span",
        { class: "links" },
        h("a", { href: `#/jobs?deployment=${q}`, text: "jobs" }),
        h("a", { href: `#/playground?deployment=${q}`, text: "playground" }),
      ),
    ),
    workerBar(d),
    failedWorkers(workers),
    h(
      "div",
      { class: "split" },
      h("div", {}, h("h3", { text: "Autoscaler" }), scalingFacts(d.scaling)),
      h("div", {}, h("h3", { text: "Queue depth (polled every 2 s)" }), chart),
    ),
    h(
      "details",
      foldable(`workers:${d.name}`, { class: "workers-list" }),
      h("summary", { text: `Workers (${workers.length} recent)` }),
      recent.length
        ? table(["worker", "state", "reason", "version", "started", "stopped"], recent)
        : empty("No workers yet."),
    ),
  ];
}

function workerRow(w) {
  return h(
    "tr",
    { "data-worker": w.id },
    td(h("code", { text: w.id })),
    td(stateBadge(w.state)),
    td(w.reason || "—", { class: "reason" }),
    td(`v${w.deployment_version}`),
    td(ago(w.started_at)),
    td(w.stopped_at ? ago(w.stopped_at) : "—"),
  );
}

// Failed workers are shown open, never folded: why they failed is what one came to read.
function failedWorkers(workers) {
  const failed = workers.filter((w) => w.state === "failed");
  if (!failed.length) return null;
  return h(
    "div",
    { class: "failed-workers", role: "alert" },
    h("h3", { text: `Failed workers (${failed.length} recent)` }),
    table(["worker", "state", "reason", "version", "started", "stopped"], failed.slice(0, 5).map(workerRow)),
  );
}

function poolPanel(body) {
  // a pool per accelerator type and engine (a pool worker serves only its engine's deployments)
  const counts = Object.entries(body.counts_by_engine).flatMap(([engine, byAcc]) =>
    Object.entries(byAcc).map(([acc, byState]) =>
      h(
        "li",
        {},
        h("strong", { text: `${acc} · ${engine}` }),
        `: ${Object.entries(byState).map(([st, n]) => `${n} ${st}`).join(", ")}`,
      ),
    ),
  );
  const rows = body.data.map((w) =>
    h(
      "tr",
      {},
      td(h("code", { text: w.id })),
      td(w.accelerator),
      td(w.engine),
      td(stateBadge(w.state)),
      td(ago(w.state_since)),
      td(ago(w.started_at)),
    ),
  );
  return section(
    "Warm pool",
    h("p", {
      class: "muted",
      text:
        "Generic workers booted ahead of cold starts, each with its engine prepared; a " +
        "deployment on that engine that needs one takes it instead of booting (billed to the " +
        "platform until then).",
    }),
    h("ul", { class: "inline" }, counts),
    table(["worker", "accelerator", "engine", "state", "since", "started"], rows),
  );
}

export { deploymentsView };
