// The console's session: the signed-in key, what the polls keep, and the one API call.

const KEY_STORAGE = "platform-console-key";
const state = {
  key: null, // the API key (also in sessionStorage)
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

async function api(path, params) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
  }
  const r = await fetch(url, {
    headers: { Authorization: `Bearer ${state.key}`, Accept: "application/json" },
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  });
  if (!r.ok) {
    let detail = r.statusText || `HTTP ${r.status}`;
    try {
      const problem = await r.json();
      detail = problem.detail || problem.title || detail;
    } catch (_) {
      // not JSON: keep the status text
    }
    throw new ApiError(r.status, detail);
  }
  return r.json();
}

export { KEY_STORAGE, state, ApiError, api };
