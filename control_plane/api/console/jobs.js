// The jobs view: the list (filters in the URL; a failed job's error shown whole) and the
// newest batches. One job's view is job.js.
import { api, state } from "./session.js";
import { h, s, fill, num, secs, money, clock, ago, stateBadge, table, td, empty, section } from "./dom.js";
import { svgRoot } from "./charts.js";
import { setParams } from "./url.js";

const JOB_STATUSES = [
  "queued", "starting", "running", "succeeded", "failed", "canceled", "expired", "timed_out",
];
// a name ending in "#" heads a numeric column (`table`)
const JOB_COLUMNS = [
  "job", "deployment", "status", "created", "queue | run", "queue#", "run#", "tokens in → out#",
  "cost#",
];
const TERMINAL = new Set(["succeeded", "failed", "canceled", "expired", "timed_out"]);

// `redraw`: refresh this view now (the router's, with its error handling)
function jobsView(redraw, params) {
  const filters = {
    deployment: params.get("deployment") || "",
    status: params.get("status") || "",
    limit: 50,
  };
  const depSelect = h("select", {
    id: "filter-deployment",
    onchange: (e) => {
      filters.deployment = e.target.value;
      again();
    },
  });
  const statusSelect = h(
    "select",
    {
      id: "filter-status",
      onchange: (e) => {
        filters.status = e.target.value;
        again();
      },
    },
    h("option", { value: "", text: "any status" }),
    JOB_STATUSES.map((st) => h("option", { value: st, text: st, selected: st === filters.status })),
  );
  const more = h("button", {
    type: "button",
    text: "Show more",
    onclick: () => {
      filters.limit = Math.min(filters.limit * 2, 200);
      again();
    },
  });
  const body = h("div", {});
  const batches = h("div", {});
  const root = h(
    "div",
    {},
    h("h1", { text: "Jobs" }),
    h(
      "div",
      { class: "toolbar" },
      h("label", {}, "Deployment ", depSelect),
      h("label", {}, "Status ", statusSelect),
    ),
    body,
    h("div", { class: "toolbar" }, more),
    batches,
  );
  const view = {
    root,
    everyMs: 0,
    async refresh(current) {
      syncDeploymentOptions(depSelect, filters.deployment);
      const [jobs, usage, batchList] = await Promise.all([
        api("/v1/jobs", { deployment: filters.deployment, status: filters.status, limit: filters.limit }),
        api("/v1/usage", { deployment: filters.deployment, limit: 500 }),
        api("/v1/batches", { deployment: filters.deployment, limit: 10 }),
      ]);
      if (!current()) return;
      const cost = new Map(usage.data.map((u) => [u.job_id, u]));
      fill(
        body,
        jobs.data.length
          ? table(
              JOB_COLUMNS,
              jobs.data.map((j) => jobRow(j, cost.get(j.id))),
              { cls: "jobs" },
            )
          : empty("No jobs match."),
      );
      more.hidden = !jobs.next_cursor || filters.limit >= 200;
      fill(batches, batchList.data.length ? batchPanel(batchList.data) : null);
    },
  };
  const again = () => {
    setParams({ deployment: filters.deployment, status: filters.status });
    redraw();
  };
  return view;
}

function syncDeploymentOptions(select, chosen) {
  const names = ["", ...state.deployments.map((d) => d.name)];
  if (chosen && !names.includes(chosen)) names.push(chosen); // from the URL, not (yet) listed
  const have = [...select.options].map((o) => o.value);
  if (have.join("\n") === names.join("\n")) return;
  fill(select, ...names.map((n) => h("option", { value: n, text: n || "all", selected: n === chosen })));
}

function phaseBar(queue, run) {
  const W = 120;
  const q = num(queue) || 0;
  const r = num(run) || 0;
  const total = q + r;
  const root = svgRoot(W, 10, "mini", "queue and run time");
  if (total > 0) {
    const qw = (W * q) / total;
    const queueBar = s("rect", { x: 0, y: 0, width: qw, height: 10, class: "ph-queue" });
    const runBar = s("rect", { x: qw, y: 0, width: W - qw, height: 10, class: "ph-run" });
    queueBar.append(s("title", { text: `queue ${secs(q)}` }));
    runBar.append(s("title", { text: `run ${secs(r)}` }));
    root.append(queueBar, runBar);
  } else {
    root.append(s("rect", { x: 0, y: 0, width: W, height: 10, class: "track" }));
  }
  return root;
}

const reasonNote = (reason) => (reason ? h("small", { class: "muted", text: ` ${reason}` }) : null);

// the error in full (wrapped, never clipped): it says why the job failed
const errorText = (error) =>
  error ? h("div", { class: "error-text", text: `${error.type}: ${error.message}` }) : null;

function jobRow(j, usage) {
  const u = j.usage || {};
  return h(
    "tr",
    { "data-job": j.id },
    td(h("a", { href: `#/jobs/${encodeURIComponent(j.id)}`, text: j.id })),
    td(`${j.deployment} v${j.deployment_version}`),
    td(h("span", {}, stateBadge(j.status), reasonNote(j.status_reason), errorText(j.error)), {
      class: "status",
    }),
    td(clock(j.created_at), { title: j.created_at }),
    td(phaseBar(u.queue_s, u.execution_s)),
    td(secs(u.queue_s), { class: "num" }),
    td(secs(u.execution_s), { class: "num" }),
    td(`${u.prompt_tokens ?? "—"} → ${u.generated_tokens ?? "—"}`, { class: "num" }),
    td(jobCost(j, usage), { class: "num" }),
  );
}

// The job's share of busy time; "…" until the worker's busy segment closed and was shared.
function jobCost(j, usage) {
  if (!usage) return "—";
  if (num(usage.cost) === 0 && j.started_at && num(usage.billed_seconds) === 0) {
    return h("span", { class: "muted", title: "not shared out yet", text: "…" });
  }
  return money(usage.cost);
}

function batchPanel(list) {
  return section(
    "Batches",
    table(
      ["batch", "deployment", "status", "done / total", "created", "webhook"],
      list.map((b) => {
        const done = [...TERMINAL].reduce((a, k) => a + (b.counts[k] || 0), 0);
        return h(
          "tr",
          {},
          td(h("code", { text: b.id })),
          td(b.deployment),
          td(stateBadge(b.status)),
          td(`${done} / ${b.total}`),
          td(ago(b.created_at)),
          td(b.webhook_status),
        );
      }),
    ),
  );
}

export { jobsView, TERMINAL };
