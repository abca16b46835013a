// The jobs view (list, filters, batches) and one job's view (timeline, details, cost,
// webhook deliveries).
import { ApiError, api, state } from "./session.js";
import {
  h,
  s,
  fill,
  num,
  secs,
  money,
  clock,
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
import { svgRoot, timelineChart } from "./charts.js";

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
function jobsView(redraw) {
  const filters = { deployment: "", status: "", limit: 50 };
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
    JOB_STATUSES.map((st) => h("option", { value: st, text: st })),
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
  const again = () => redraw();
  return view;
}

function syncDeploymentOptions(select, chosen) {
  const names = ["", ...state.deployments.map((d) => d.name)];
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

function jobRow(j, usage) {
  const u = j.usage || {};
  return h(
    "tr",
    { "data-job": j.id },
    td(h("a", { href: `#/jobs/${encodeURIComponent(j.id)}`, text: j.id })),
    td(`${j.deployment} v${j.deployment_version}`),
    td(h("span", {}, stateBadge(j.status), reasonNote(j.status_reason))),
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

function jobView(jobId) {
  const head = h("div", {});
  const chart = h("div", {});
  const detail = h("div", { class: "split" });
  const hooks = h("div", {});
  const io = h("div", {});
  const root = h(
    "div",
    { class: "job", "data-job": jobId },
    h("p", {}, h("a", { href: "#/jobs", text: "← Jobs" })),
    head,
    section("Timeline", chart),
    detail,
    hooks,
    io,
  );
  let settled = false; // finished and its cost shared out: nothing changes any more
  return {
    root,
    everyMs: 0,
    async refresh(current) {
      if (settled) return;
      let job;
      let tl;
      try {
        [job, tl] = await Promise.all([
          api(`/v1/jobs/${encodeURIComponent(jobId)}`),
          api(`/v1/jobs/${encodeURIComponent(jobId)}/timeline`),
        ]);
      } catch (e) {
        if (!(e instanceof ApiError) || e.status !== 404 || !current()) throw e;
        settled = true; // another tenant's job answers the same as a missing one
        fill(head, h("h1", {}, "Job ", h("code", { text: jobId })), empty(e.message));
        fill(chart, empty("No timeline."));
        return;
      }
      const deliveries = job.webhook
        ? (await api(`/v1/jobs/${encodeURIComponent(jobId)}/webhook/deliveries`)).data
        : [];
      if (!current()) return;
      settled = TERMINAL.has(job.status) && tl.cost.allocated && job.webhook_status !== "pending";
      fill(
        head,
        h("h1", {}, "Job ", h("code", { text: job.id }), " ", stateBadge(job.status)),
        job.status_reason ? h("p", { class: "muted", text: `reason: ${job.status_reason}` }) : null,
      );
      fill(chart, timelineChart(tl), timelineSummary(tl));
      fill(detail, jobFacts(job), costPanel(tl));
      fill(hooks, webhookPanel(job, deliveries));
      fill(io, ioPanel(job));
    },
  };
}

function timelineSummary(tl) {
  const total = tl.phases.reduce((acc, p) => {
    acc[p.phase] = (acc[p.phase] || 0) + p.seconds;
    return acc;
  }, {});
  const parts = ["queue", "boot", "load", "warm", "run"]
    .filter((p) => total[p] !== undefined)
    .map((p) => `${p} ${secs(total[p])}`);
  const going = tl.completed_at ? "" : " (still going)";
  return h("p", {
    class: "muted",
    text:
      `${parts.join(" · ")}${going}. Boot, load and warm are the part of the queue time ` +
      "spent waiting on a worker starting for it.",
  });
}

function jobFacts(job) {
  const u = job.usage || {};
  const cs = job.cold_start;
  return section(
    "Details",
    h(
      "dl",
      { class: "facts" },
      fact("deployment", `${job.deployment} v${job.deployment_version}`),
      fact("kind", job.kind),
      fact("created", stamp(job.created_at)),
      fact("started", stamp(job.started_at)),
      fact("completed", stamp(job.completed_at)),
      fact("attempt", job.attempt),
      fact("tokens", `${u.prompt_tokens ?? "—"} prompt → ${u.generated_tokens ?? "—"} generated`),
      job.queue_position != null ? fact("queue position", job.queue_position) : null,
      job.eta_s != null ? fact("ETA", secs(job.eta_s)) : null,
      cs ? fact("cold start", `${cs.phase}${cs.eta_s != null ? `, ready in ~${secs(cs.eta_s)}` : ""}`)
        : null,
      job.error ? fact("error", `${job.error.type}: ${job.error.message}`) : null,
    ),
  );
}

function costNote(p) {
  if (p.phase !== "run") return "the worker's, billed to you; not in the job's share";
  return p.billable === false ? "not billed (lost by the platform)" : "this job's share of busy time";
}

function costPanel(tl) {
  const rows = tl.phases
    .filter((p) => p.amount !== null)
    .map((p) =>
      h(
        "tr",
        {},
        td(p.phase === "run" ? `run #${p.attempt}` : p.phase),
        td(secs(p.seconds), { class: "num" }),
        td(money(p.amount), { class: "num" }),
        td(costNote(p)),
      ),
    );
  return section(
    "Cost",
    h(
      "p",
      { class: "big" },
      h("span", {
        class: "amount",
        "data-allocated": String(tl.cost.allocated),
        text: money(tl.cost.amount),
      }),
      h("span", { class: "muted", text: ` for ${secs(tl.cost.billed_seconds)} of worker time` }),
    ),
    tl.cost.allocated
      ? null
      : h("p", {
          class: "muted",
          text: "Not shared out yet: busy time is split among jobs once the worker's busy segment closes.",
        }),
    rows.length ? table(["phase", "time#", "amount#", ""], rows) : null,
  );
}

function webhookPanel(job, deliveries) {
  if (!job.webhook) return section("Webhook", empty("No webhook for this job."));
  const rows = deliveries.map((d) =>
    h(
      "tr",
      {},
      td(h("code", { text: d.msg_id })),
      td(d.event_type),
      td(d.attempt, { class: "num" }),
      td(d.status_code ?? "—"),
      td(d.delivered ? "yes" : "no"),
      td(d.error || ""),
      td(stamp(d.created_at)),
    ),
  );
  return section(
    "Webhook",
    h("p", {}, h("code", { text: job.webhook }), " ", stateBadge(job.webhook_status)),
    rows.length
      ? table(["message", "event", "attempt#", "HTTP", "delivered", "error", "at"], rows)
      : empty("No delivery attempt yet."),
  );
}

function ioPanel(job) {
  const input = { ...job.input };
  const prompt = input.prompt;
  delete input.prompt;
  return h(
    "details",
    foldable(`io:${job.id}`, { class: "panel io" }),
    h("summary", { text: "Input and output" }),
    h("h3", { text: "Parameters" }),
    h("pre", { text: JSON.stringify(input, null, 2) }),
    h("h3", { text: "Prompt" }),
    h("pre", { text: prompt ?? "" }),
    h("h3", { text: "Output" }),
    h("pre", { text: job.output ? job.output.text : "—" }),
  );
}

export { jobsView, jobView };
