// DOM and formatting helpers: every value from the API enters the page through these, as
// text or an SVG attribute (never as HTML).
import { state } from "./session.js";

const SVG_NS = "http://www.w3.org/2000/svg";

function build(ns, tag, attrs, kids) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = String(v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}
const h = (tag, attrs, ...kids) => build(null, tag, attrs, kids);
const s = (tag, attrs, ...kids) => build(SVG_NS, tag, attrs, kids);
const $ = (id) => document.getElementById(id);
// replaceChildren without the null / false placeholders of optional parts
const present = (k) => k !== null && k !== undefined && k !== false;
const fill = (node, ...kids) => node.replaceChildren(...kids.flat().filter(present));

const num = (v) => (v === null || v === undefined || v === "" ? NaN : Number(v));
function secs(v) {
  const x = num(v);
  if (Number.isNaN(x)) return "—";
  if (x < 10) return `${x.toFixed(2)} s`;
  if (x < 600) return `${x.toFixed(1)} s`;
  return `${(x / 60).toFixed(1)} min`;
}
function money(v) {
  // decimal strings from the API: shown as they are, trailing zeros trimmed (≥ 2 places)
  if (v === null || v === undefined) return "—";
  const [whole, frac = ""] = String(v).split(".");
  let f = frac.replace(/0+$/, "");
  if (f.length < 2) f = f.padEnd(2, "0");
  return `$${whole}.${f}`;
}
function clock(iso) {
  if (!iso) return "—";
  return new Date(iso).toLocaleTimeString([], { hour12: false });
}
function stamp(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return `${d.toLocaleDateString()} ${d.toLocaleTimeString([], { hour12: false })}`;
}
function ago(iso) {
  if (!iso) return "—";
  const dt = Math.round((Date.now() - Date.parse(iso)) / 1000);
  if (dt < -1) return `in ${secs(-dt)}`;
  if (dt < 60) return `${Math.max(dt, 0)} s ago`;
  if (dt < 3600) return `${Math.round(dt / 60)} min ago`;
  return stamp(iso);
}
const badge = (value, cls) => h("span", { class: `badge ${cls || ""}`, text: value });
const stateBadge = (st) => badge(st, `st-${st}`);

// "Nice" axis ticks: about `count` round values from 0 (or lo) to hi.
function ticks(lo, hi, count) {
  const span = Math.max(hi - lo, 1e-9);
  const raw = span / Math.max(count, 1);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((m) => m >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return { step, values: out };
}

// Ticks of a value axis from 0 whose last tick is at or above `max` (the axis' top).
function niceAxis(max, count) {
  const { step } = ticks(0, max || 1, count);
  const top = Math.ceil((max || 1) / step - 1e-9) * step;
  return { step, top, values: ticks(0, top, Math.round(top / step)).values };
}

// headers: names; a name ending in "#" heads a numeric (right-aligned) column
function table(headers, rows, opts) {
  const th = (x) =>
    x.endsWith("#") ? h("th", { class: "num", text: x.slice(0, -1) }) : h("th", { text: x });
  // in a box that scrolls sideways: a wide table never widens the page
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: `grid ${(opts && opts.cls) || ""}` },
      h("thead", {}, h("tr", {}, headers.map(th))),
      h("tbody", {}, rows),
    ),
  );
}
const td = (value, attrs) => h("td", attrs || {}, value);
const empty = (text) => h("p", { class: "empty", text });
const section = (title, ...kids) => h("section", { class: "panel" }, h("h2", { text: title }), ...kids);

// attributes of a <details> that stays open across redraws once the user opened it
function foldable(id, attrs) {
  return {
    ...attrs,
    open: state.unfolded.has(id),
    ontoggle: (e) => (e.target.open ? state.unfolded.add(id) : state.unfolded.delete(id)),
  };
}

function fact(label, value) {
  return [h("dt", { text: label }), h("dd", {}, value ?? "—")];
}

export {
  h,
  s,
  $,
  fill,
  num,
  secs,
  money,
  clock,
  stamp,
  ago,
  badge,
  stateBadge,
  ticks,
  niceAxis,
  table,
  td,
  empty,
  section,
  foldable,
  fact,
};
