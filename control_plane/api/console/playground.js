// The playground (scope `run`): a prompt sent to a deployment, its answer shown as it is
// generated: POST /v1/deployments/{name}/run with "stream": true answers server-sent events
// (docs/api.md "Streaming").
//
// NOTE: the prompt and the answer stay in this page: never logged, stored, or put in a URL
// (only the deployment's name is, as the view's filter).
import { state, authHeaders, refusal, FETCH_OPTIONS } from "./session.js";
import { h, fill, section } from "./dom.js";
import { scoped, outcome, said, failure } from "./actions.js";
import { setParams } from "./url.js";

const ENDS = new Set(["completed", "failed", "canceled", "expired", "timed_out"]);

// `params`: the view's filters from the URL (url.js)
function playgroundView(_redraw, params) {
  let chosen = params.get("deployment") || "";
  const dep = h("select", {
    id: "pg-deployment",
    onchange: (e) => {
      chosen = e.target.value;
      setParams({ deployment: chosen });
    },
  });
  const prompt = h("textarea", {
    id: "pg-prompt",
    rows: 5,
    required: true,
    spellcheck: "false",
    autocomplete: "off",
    placeholder: "The weather today",
  });
  const maxTokens = h("input", { id: "pg-max-tokens", type: "number", min: 1, max: 32768, value: 64 });
  const temperature = h("input", { id: "pg-temperature", type: "number", min: 0, max: 5, step: "0.1", value: 0 });
  const go = h("button", { type: "submit", class: "primary", text: "Send" });
  const stop = h("button", { type: "button", text: "Stop", hidden: true });
  const line = outcome();
  const meta = h("p", { class: "muted", id: "pg-meta" });
  const output = h("pre", { id: "pg-output", class: "answer", "aria-live": "polite" });
  let controller = null;
  stop.addEventListener("click", () => controller && controller.abort());

  const run = async () => {
    if (!chosen) {
      said(line, "Choose a deployment.", true);
      return;
    }
    controller = new AbortController();
    go.disabled = true;
    stop.hidden = false;
    line.className = "outcome pending";
    line.textContent = "Sending…";
    let text = "";
    output.textContent = "";
    delete output.dataset.done;
    delete output.dataset.status;
    const input = {
      prompt: prompt.value,
      max_tokens: Number(maxTokens.value) || undefined,
      temperature: temperature.value === "" ? undefined : Number(temperature.value),
    };
    const on = (type, data) => {
      if (type === "job") output.dataset.job = data.job_id || "";
      else if (type === "queued") meta.textContent = "Queued.";
      else if (type === "starting") {
        const eta = data.eta_s != null ? `, ready in ~${Math.round(data.eta_s)} s` : "";
        meta.textContent = `A worker is starting: ${data.phase || data.reason}${eta}.`;
      } else if (type === "running") meta.textContent = `Running (attempt ${data.attempt}).`;
      else if (type === "output" && !data.index) {
        text += data.delta; // the first choice's deltas: they add up to the output
        output.textContent = text;
      } else if (type === "restarted") {
        text = ""; // the job started anew: its text comes again from the start
        output.textContent = "";
      } else if (ENDS.has(type)) ended(data);
    };
    const ended = (job) => {
      output.dataset.status = job.status;
      const u = job.usage || {};
      meta.textContent =
        `${job.status} · ${u.prompt_tokens ?? "—"} prompt → ${u.generated_tokens ?? "—"} ` +
        `generated tokens · job ${job.id}`;
      if (job.error) said(line, `${job.error.type}: ${job.error.message}`, true);
      else said(line, job.status === "succeeded" ? "Done." : `The job ended: ${job.status}.`, job.status !== "succeeded");
    };
    try {
      await stream(chosen, { input, stream: true }, controller.signal, on);
    } catch (e) {
      if (e.name === "AbortError") said(line, "Stopped: the job is canceled.", true);
      else said(line, failure(e), true);
    } finally {
      output.dataset.done = "true";
      controller = null;
      go.disabled = false;
      stop.hidden = true;
    }
  };

  const fields = h(
    "fieldset",
    {},
    h("div", { class: "toolbar" }, h("label", {}, "Deployment ", dep)),
    h("label", { class: "block", for: "pg-prompt", text: "Prompt" }),
    prompt,
    h(
      "div",
      { class: "toolbar" },
      h("label", {}, "max tokens ", maxTokens),
      h("label", {}, "temperature ", temperature),
      go,
      stop,
    ),
  );
  const form = h(
    "form",
    {
      id: "playground",
      onsubmit: (e) => {
        e.preventDefault();
        run();
      },
    },
    scoped("run", fields),
    line,
  );
  const root = h(
    "div",
    {},
    h("h1", { text: "Playground" }),
    h("p", {
      class: "muted",
      text:
        "Runs a job on the deployment and shows its answer as it is generated (billed like any " +
        "job). The prompt stays in this page: it is not kept or logged.",
    }),
    section("Prompt", form),
    section("Answer", meta, output),
  );
  return {
    root,
    everyMs: 0,
    async refresh() {
      const names = ["", ...state.deployments.map((d) => d.name)];
      if (chosen && !names.includes(chosen)) names.push(chosen);
      const have = [...dep.options].map((o) => o.value);
      if (have.join("\n") !== names.join("\n")) {
        fill(dep, names.map((n) => h("option", { value: n, text: n || "choose…", selected: n === chosen })));
      }
    },
    close() {
      if (controller) controller.abort(); // leaving the view: the stream's job is canceled
    },
  };
}

// POST …/run with "stream": true; calls on(type, data) per event ("job" first, from X-Job-Id).
async function stream(name, body, signal, on) {
  const r = await fetch(`/v1/deployments/${encodeURIComponent(name)}/run`, {
    method: "POST",
    headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify(body),
    signal,
    ...FETCH_OPTIONS,
  });
  if (!r.ok) throw await refusal(r);
  on("job", { job_id: r.headers.get("X-Job-Id") });
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const event = parseEvent(block);
      if (event) on(event.type, event.data);
    }
  }
}

function parseEvent(block) {
  let type = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (!line || line.startsWith(":")) continue; // a comment: the server's keep-alive
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") type = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return null;
  try {
    return { type, data: JSON.parse(data.join("\n")) };
  } catch (_) {
    return null;
  }
}

export { playgroundView };
