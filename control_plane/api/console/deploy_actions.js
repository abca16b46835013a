// A deployment's actions (scope `deploy`): scale (its min and max workers) and redeploy (edit
// its spec). Both PUT the whole spec to /v1/deployments/{name}, read fresh just before, so a
// change made elsewhere meanwhile is kept; a changed spec is a new version (docs/api.md).
import { state, api, send } from "./session.js";
import { h } from "./dom.js";
import { scoped, outcome, said, perform } from "./actions.js";

// what GET adds to the spec (PUT refuses unknown fields)
const SERVER_FIELDS = [
  "id",
  "version",
  "created_at",
  "updated_at",
  "workers",
  "scaling",
  "engine_resolved",
  "engine_reason",
];

function specOf(dep) {
  const spec = { ...dep };
  for (const k of SERVER_FIELDS) delete spec[k];
  return spec;
}

const path = (name) => `/v1/deployments/${encodeURIComponent(name)}`;
const count = (input) => (input.value === "" ? null : Number(input.value));

function scaleForm(name, redraw) {
  const dep = state.deployments.find((d) => d.name === name) || {};
  const min = h("input", { type: "number", name: "min_workers", min: 0, max: 64, value: dep.min_workers });
  const max = h("input", { type: "number", name: "max_workers", min: 1, max: 64, value: dep.max_workers });
  const button = h("button", { type: "submit", text: "Scale" });
  const line = outcome();
  const fields = h(
    "fieldset",
    {},
    h("label", {}, "min workers ", min),
    h("label", {}, "max workers ", max),
    button,
  );
  const form = h(
    "form",
    {
      class: "scale-form",
      onsubmit: async (e) => {
        e.preventDefault();
        const done = await perform(
          button,
          line,
          async () => {
            const spec = specOf(await api(path(name)));
            spec.min_workers = count(min);
            spec.max_workers = count(max);
            return send("PUT", path(name), spec);
          },
          (d) => `Scaled: min ${d.min_workers}, max ${d.max_workers} workers (version ${d.version}).`,
        );
        if (done) redraw();
      },
    },
    scoped("deploy", fields),
    line,
  );
  return form;
}

function redeployForm(name, redraw) {
  const text = h("textarea", { name: "spec", rows: 14, spellcheck: "false", "aria-label": "spec" });
  const line = outcome();
  let before = null; // the version the editor was filled from
  const load = async () => {
    try {
      const dep = await api(path(name));
      before = dep.version;
      text.value = JSON.stringify(specOf(dep), null, 2);
      said(line, `Spec of version ${dep.version}: edit it, check it, then redeploy.`, false);
    } catch (e) {
      said(line, `Could not read the spec: ${e.message}`, true);
    }
  };
  const put = (dryRun) => async () => {
    let spec;
    try {
      spec = JSON.parse(text.value);
    } catch (e) {
      throw new Error(`the spec is not JSON (${e.message})`);
    }
    return send("PUT", path(name), spec, dryRun ? { dry_run: "true" } : {});
  };
  const check = h("button", { type: "button", text: "Check (dry run)" });
  const apply = h("button", { type: "button", class: "primary", text: "Redeploy" });
  check.addEventListener("click", () =>
    perform(check, line, put(true), (d) =>
      d.version === before ? "Valid; nothing changes." : `Valid: it would be version ${d.version}.`,
    ),
  );
  apply.addEventListener("click", async () => {
    const d = await perform(apply, line, put(false), (dep) =>
      dep.version === before
        ? `Unchanged: still version ${dep.version}.`
        : `Redeployed: version ${dep.version}; new workers run it, old ones drain.`,
    );
    if (d) {
      before = d.version;
      redraw();
    }
  });
  const fields = h("fieldset", {}, text, h("div", { class: "toolbar" }, check, apply));
  return h(
    "details",
    {
      class: "redeploy",
      ontoggle: (e) => {
        if (e.target.open) load();
      },
    },
    h("summary", { text: "Edit the spec and redeploy" }),
    scoped("deploy", fields),
    line,
  );
}

function deploymentActions(name, redraw) {
  return h(
    "div",
    { class: "dep-actions" },
    h("h3", { text: "Actions" }),
    scaleForm(name, redraw),
    redeployForm(name, redraw),
  );
}

export { deploymentActions, specOf };
