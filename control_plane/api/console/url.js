// The view and its filters live in the URL's hash (`#/jobs?deployment=demo&status=failed`):
// a reload or a shared link shows the same view. Filters are replaced in place (no history
// entry, no hashchange: the view redraws itself).

function parseHash() {
  const raw = window.location.hash.replace(/^#\/?/, "");
  const q = raw.indexOf("?");
  const path = q < 0 ? raw : raw.slice(0, q);
  const params = new URLSearchParams(q < 0 ? "" : raw.slice(q + 1));
  const [name, arg] = path.split("/");
  return { path, name, arg, params };
}

// Set the current view's filters (empty values are left out).
function setParams(values) {
  const { path } = parseHash();
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(values)) {
    if (v !== null && v !== undefined && v !== "") params.set(k, String(v));
  }
  const query = params.toString();
  window.history.replaceState(null, "", `#/${path}${query ? `?${query}` : ""}`);
}

export { parseHash, setParams };
