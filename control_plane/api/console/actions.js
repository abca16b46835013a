// What the actions share: a control that needs a scope (disabled, with the reason shown, for a
// key without it), and the line under it that says what happened (the API's problem+json
// `detail` when it refused).
import { ApiError, lacks } from "./session.js";
import { h } from "./dom.js";

// `control`: a button or a fieldset; returns it wrapped with its reason when it is disabled.
function scoped(scope, control) {
  const why = lacks(scope);
  control.disabled = Boolean(why);
  if (why) control.title = why;
  return h(
    "span",
    { class: "action" },
    control,
    why ? h("small", { class: "why", "data-needs": scope, text: why }) : null,
  );
}

function outcome() {
  return h("p", { class: "outcome", role: "status" });
}

function said(line, text, isError) {
  line.className = isError ? "outcome error" : "outcome ok";
  line.textContent = text;
}

function failure(e) {
  if (e instanceof ApiError) return `Refused (${e.status}): ${e.message}`;
  return `Could not reach the API: ${e.message}`;
}

// Run `act` once at a time from `button`: the button is off while it runs; the outcome line
// gets its message (or the refusal). Returns act's value, or undefined when it failed.
async function perform(button, line, act, done) {
  button.disabled = true;
  line.className = "outcome pending";
  line.textContent = "…";
  try {
    const value = await act();
    said(line, done(value), false);
    return value;
  } catch (e) {
    said(line, failure(e), true);
    return undefined;
  } finally {
    button.disabled = false;
  }
}

export { scoped, outcome, said, failure, perform };
