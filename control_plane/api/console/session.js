// The console's session: the signed-in key and its scopes, what the polls keep, and the API
// calls (reads, and the actions' writes).

const KEY_STORAGE = "platform-console-key";
const state = {
  key: null, // the API key (also in sessionStorage)
  scopes: null, // the key's scopes (GET /v1/keys/current); null until read
  deployments: [], // the latest GET /v1/deployments
  samples: new Map(), // deployment name → [{t, queued, running, workers}]
  poolReadable: true, // false once /v1/pool answered 403 (not the operator's key)
  unfolded: new Set(), // <details> the user opened (views are redrawn at every poll)
  view: null, // the current view object {refresh, everyMs}
  viewToken: 0, // bumped on every view change: late answers of an old view are dropped
  timer: null,
  session: 0, // bumped at every sign-in: a poll of an earlier session stops
};

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

const FETCH_OPTIONS = { cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer" };

function authHeaders(extra) {
  return { Authorization: `Bearer ${state.key}`, Accept: "application/json", ...extra };
}

// An answer that is not 2xx as an ApiError carrying its problem+json `detail`.
async function refusal(r) {
  let detail = r.statusText || `HTTP ${r.status}`;
  try {
    const problem = await r.json();
    detail = problem.detail || problem.title || detail;
  } catch (_) {
    // not JSON: keep the status text
  }
  return new ApiError(r.status, detail);
}

function urlOf(path, params) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
  }
  return url;
}

async function api(path, params) {
  const r = await fetch(urlOf(path, params), { headers: authHeaders(), ...FETCH_OPTIONS });
  if (!r.ok) throw await refusal(r);
  return r.json();
}

// A write (POST, PUT, DELETE) with an optional JSON body; its JSON answer, or null (204).
async function send(method, path, body, params) {
  const r = await fetch(urlOf(path, params), {
    method,
    headers: authHeaders(body === undefined ? {} : { "Content-Type": "application/json" }),
    body: body === undefined ? undefined : JSON.stringify(body),
    ...FETCH_OPTIONS,
  });
  if (!r.ok) throw await refusal(r);
  return r.status === 204 ? null : r.json();
}

// Why this key may not do what needs `scope` (null: it may). `admin` implies every scope.
function lacks(scope) {
  if (state.scopes === null) return "this key's scopes could not be read";
  if (state.scopes.includes("admin") || state.scopes.includes(scope)) return null;
  const has = state.scopes.length ? state.scopes.join(", ") : "none";
  return `needs the '${scope}' scope (this key has: ${has})`;
}

export { KEY_STORAGE, state, ApiError, FETCH_OPTIONS, authHeaders, refusal, api, send, lacks };
