// One job's view: its timeline, details (a failed job's error in full), cost, webhook
// deliveries, input and output, its log lines; and Cancel (scope `run`) while it has not ended.
import { ApiError, api, send } from "./session.js";
import {
  h, fill, secs, money, stamp, clock, stateBadge, table, td, empty, section, foldable, fact,
} from "./dom.js";
import { timelineChart } from "./charts.js";
import { TERMINAL } from "./jobs.js";
import { scoped, outcome, perform } from "./actions.js";

// `redraw`: refresh this view now (the router's, with its error handling)
function jobView(jobId, redraw) {
  const head = h("div", {});
  const cancel = cancelAction(jobId, redraw);
  const chart = h("div", {});
  const detail = h("div", { class: "split" });
  const hooks = h("div", {});
  const io = h("div", {});
  const logs = h("div", {});
  const root = h(
    "div",
    { class: "job", "data-job": jobId },
    h("p", {}, h("a", { href: "#/jobs", text: "← Jobs" })),
    head,
    cancel.root,
    section("Timeline", chart),
    detail,
    hooks,
    io,
    logs,
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
      cancel.show(!TERMINAL.has(job.status));
      fill(
        head,
        h("h1", {}, "Job ", h("code", { text: job.id }), " ", stateBadge(job.status)),
        job.status_reason ? h("p", { class: "muted", text: `reason: ${job.status_reason}` }) : null,
      );
      fill(chart, timelineChart(tl), timelineSummary(tl));
      fill(detail, jobFacts(job), costPanel(tl));
      fill(hooks, webhookPanel(job, deliveries));
      fill(io, ioPanel(job));
      const lines = await logLines(jobId);
      if (current()) fill(logs, logsPanel(lines));
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
      job.error
        ? fact("error", h("pre", { class: "error-text", text: `${job.error.type}: ${job.error.message}` }))
        : null,
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

// The Cancel button, kept across redraws (its outcome line too); shown while the job runs.
function cancelAction(jobId, redraw) {
  const button = h("button", { type: "button", class: "danger", id: "cancel-job", text: "Cancel job" });
  const line = outcome();
  button.addEventListener("click", async () => {
    const job = await perform(
      button,
      line,
      () => send("POST", `/v1/jobs/${encodeURIComponent(jobId)}/cancel`),
      (j) => (j.status === "canceled" ? "Canceled." : `The job had already ended: ${j.status}.`),
    );
    if (job) redraw();
  });
  const root = h("div", { class: "toolbar job-actions", hidden: true }, scoped("run", button), line);
  return {
    root,
    show(running) {
      // the outcome stays in sight after the job ended (it says what the click did)
      root.hidden = !running && !line.textContent;
      button.hidden = !running;
    },
  };
}

export { jobView };

// The job's log lines (GET /v1/logs: the platform's and its workers' lines carrying its id;
// never a prompt or an output), the newest 200; an error is shown in the panel, not thrown.
async function logLines(jobId) {
  try {
    return (await api(`/v1/logs?job=${encodeURIComponent(jobId)}&limit=200`)).data || [];
  } catch (e) {
    return e instanceof ApiError ? e : new ApiError(0, String(e));
  }
}

function logsPanel(lines) {
  if (lines instanceof ApiError) return section("Logs", empty(lines.message));
  if (!lines.length) return section("Logs", empty("No log lines yet."));
  const rows = lines.map((l) =>
    h(
      "tr",
      { "data-level": l.level || "" },
      td(clock(l.timestamp)),
      td(l.level || ""),
      td(l.component || ""),
      td(h("span", { class: "log-message", text: l.message || "" })),
    ),
  );
  return section("Logs", table(["time", "level", "component", "message"], rows, { cls: "logs" }));
}
