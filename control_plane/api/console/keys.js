// The API keys view (scope `admin`): the tenant's keys, a new one with its scopes (its secret
// shown once, in this view only, never stored), and revoking one (two clicks).
import { state, api, send, lacks } from "./session.js";
import { h, fill, stamp, table, td, empty, section } from "./dom.js";
import { scoped, outcome, perform } from "./actions.js";

const SCOPES = ["read", "run", "deploy", "admin"];
const SCOPE_NOTES = {
  read: "read deployments, jobs, usage",
  run: "run and cancel jobs",
  deploy: "create, update, delete deployments",
  admin: "everything, keys included",
};

// `redraw`: refresh this view now (the router's, with its error handling)
function keysView(redraw) {
  const list = h("div", {});
  const rowsLine = outcome(); // what a revoke did: kept across the list's redraws
  const secretBox = h("div", { class: "secret", hidden: true });
  const root = h(
    "div",
    {},
    h("h1", { text: "API keys" }),
    section("New key", createForm(secretBox, redraw), secretBox),
    section("Keys", list, rowsLine),
  );
  return {
    root,
    everyMs: 30_000,
    async refresh(current) {
      const why = lacks("admin");
      if (why) {
        fill(list, empty(`This key may not list keys: it ${why}.`));
        return;
      }
      const keys = (await api("/v1/keys")).data;
      if (!current()) return;
      fill(
        list,
        keys.length
          ? table(["name", "prefix", "scopes", "created", "revoked", ""], keys.map((k) => keyRow(k, redraw, rowsLine)))
          : empty("No keys."),
      );
    },
  };
}

function createForm(secretBox, redraw) {
  const name = h("input", { type: "text", name: "name", maxlength: 200, placeholder: "ci" });
  const boxes = SCOPES.map((sc) =>
    h("input", { type: "checkbox", name: "scope", value: sc, checked: sc === "read" || sc === "run" }),
  );
  const button = h("button", { type: "submit", text: "Create key" });
  const line = outcome();
  const fields = h(
    "fieldset",
    {},
    h("label", {}, "Name ", name),
    h(
      "div",
      { class: "scopes" },
      boxes.map((box) =>
        h("label", { title: SCOPE_NOTES[box.value] }, box, ` ${box.value}`),
      ),
    ),
    button,
  );
  return h(
    "form",
    {
      id: "create-key",
      onsubmit: async (e) => {
        e.preventDefault();
        const scopes = boxes.filter((b) => b.checked).map((b) => b.value);
        const created = await perform(
          button,
          line,
          () => send("POST", "/v1/keys", { name: name.value, scopes }),
          (k) => `Created ${k.prefix}_… with scopes ${k.scopes.join(", ")}.`,
        );
        if (!created) return;
        name.value = "";
        showSecret(secretBox, created);
        redraw();
      },
    },
    scoped("admin", fields),
    line,
  );
}

// The secret, once: it is in no list and no later answer; "Done" removes it from the page.
function showSecret(box, created) {
  const value = h("code", { id: "new-key-secret", text: created.key });
  fill(
    box,
    h("p", {}, h("strong", { text: "Copy this key now: it is shown only once." })),
    h("p", {}, value),
    h("button", {
      type: "button",
      text: "Done",
      onclick: () => {
        fill(box);
        box.hidden = true;
      },
    }),
  );
  box.hidden = false;
}

function keyRow(k, redraw, line) {
  const revoked = Boolean(k.revoked_at);
  const self = state.keyId === k.id;
  const button = h("button", { type: "button", class: "danger", text: "Revoke" });
  let armed = false;
  button.addEventListener("click", async () => {
    if (!armed) {
      armed = true; // a second click revokes: a key refused can never be used again
      button.textContent = self ? "Confirm: revoke the key signed in" : "Confirm revoke";
      return;
    }
    const done = await perform(button, line, () => send("DELETE", `/v1/keys/${encodeURIComponent(k.id)}`), () => `Revoked ${k.prefix}_….`);
    if (done !== undefined) redraw();
  });
  return h(
    "tr",
    { "data-key": k.id, "data-revoked": String(revoked) },
    td(k.name || "—"),
    td(h("code", { text: `${k.prefix}_…` })),
    td(k.scopes.join(", ")),
    td(stamp(k.created_at)),
    td(revoked ? stamp(k.revoked_at) : "—"),
    td(revoked ? null : button),
  );
}

export { keysView };
