// Charts as inline SVG: step lines of counts over time, vertical and horizontal bars, and a
// job's timeline.
import { h, s, secs, money, clock, ticks, niceAxis } from "./dom.js";

// An <svg> drawn at its own size (W × H user units = CSS pixels; CSS only shrinks it).
function svgRoot(W, H, cls, label) {
  const root = s("svg", {
    viewBox: `0 0 ${W} ${H}`,
    width: W,
    height: H,
    class: cls,
    role: "img",
    "aria-label": label,
  });
  root.append(s("title", { text: label }));
  return root;
}

// A step chart of counts over time: series [{name, cls, area?, points: [[t_ms, value|null]]}]
// (an `area` series is filled down to zero, under the lines drawn after it).
function stepChart(series, opts) {
  const W = 620;
  const H = 170;
  const L = 34;
  const R = 10;
  const T = 12;
  const B = 24;
  const now = opts.now;
  const t0 = Math.min(now - 60_000, ...series.flatMap((x) => x.points.map((p) => p[0])));
  const lo = Math.max(t0, now - 10 * 60_000);
  const yAxis = niceAxis(Math.max(2, ...series.flatMap((x) => x.points.map((p) => p[1] || 0))), 4);
  const vmax = yAxis.top;
  const x = (t) => L + ((t - lo) / (now - lo)) * (W - L - R);
  const y = (v) => T + (1 - v / vmax) * (H - T - B);
  const root = svgRoot(W, H, "chart", opts.label);
  for (const v of yAxis.values) {
    if (!Number.isInteger(v)) continue;
    root.append(s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
    root.append(s("text", { x: L - 6, y: y(v) + 4, class: "axis end", text: v }));
  }
  const xt = ticks(0, (now - lo) / 1000, 5);
  for (const back of xt.values) {
    const t = now - back * 1000;
    const label =
      back === 0 ? "now" : back >= 60 ? `-${(back / 60).toFixed(back % 60 ? 1 : 0)} min` : `-${back} s`;
    root.append(s("text", { x: x(t), y: H - 6, class: "axis mid", text: label }));
  }
  for (const ser of series) {
    // runs of consecutive samples (a gap: the decision was unknown), each a list of [x, y]
    const runs = [];
    let run = null;
    for (const [t, v] of ser.points) {
      if (t < lo || v === null) {
        run = null;
        continue;
      }
      if (run === null) runs.push((run = []));
      run.push([x(t), y(v)]);
    }
    if (run !== null) run.push([x(now), run[run.length - 1][1]]);
    let d = "";
    for (const r of runs) {
      // a step line: hold each value until the next sample
      const steps = r.slice(1).map(([px, py]) => `H${px}V${py}`).join("");
      d += ser.area
        ? `M${r[0][0]},${y(0)}V${r[0][1]}${steps}V${y(0)}Z`
        : `M${r[0][0]},${r[0][1]}${steps}`;
    }
    if (d) root.append(s("path", { d, class: `${ser.area ? "area" : "line"} ${ser.cls}` }));
  }
  const legend = h(
    "div",
    { class: "legend" },
    series.map((ser) => {
      const last = ser.points.length ? ser.points[ser.points.length - 1][1] : null;
      return h("span", {}, h("i", { class: `swatch ${ser.cls}` }), `${ser.name} ${last ?? "—"}`);
    }),
  );
  return h("figure", { class: "figure" }, root, legend);
}

// Vertical bars: items [{label, value, title, cls}] (values only draw; labels say the money).
function barChart(items, opts) {
  const W = opts.width || 1000;
  const H = 200;
  const R = 8;
  const T = 14;
  const B = 36;
  const axis = niceAxis(Math.max(...items.map((i) => i.value), 0), 4);
  const vmax = axis.top;
  const L = 14 + 6.5 * Math.max(...axis.values.map((v) => opts.tick(v).length));
  const y = (v) => T + (1 - v / vmax) * (H - T - B);
  const slot = (W - L - R) / Math.max(items.length, 1);
  const root = svgRoot(W, H, "chart", opts.label);
  for (const v of axis.values) {
    root.append(s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
    root.append(s("text", { x: L - 6, y: y(v) + 4, class: "axis end", text: opts.tick(v) }));
  }
  const every = Math.ceil(items.length / 12);
  items.forEach((item, i) => {
    const bw = Math.max(Math.min(slot * 0.7, 48), 2);
    const bx = L + i * slot + (slot - bw) / 2;
    const bar = s("rect", {
      x: bx,
      y: y(item.value),
      width: bw,
      height: Math.max(y(0) - y(item.value), item.value > 0 ? 1 : 0),
      class: `bar ${item.cls || ""}`,
    });
    bar.append(s("title", { text: item.title }));
    root.append(bar);
    if (i % every === 0) {
      root.append(s("text", { x: bx + bw / 2, y: H - 18, class: "axis mid", text: item.label }));
    }
  });
  root.append(s("line", { x1: L, x2: W - R, y1: y(0), y2: y(0), class: "baseline" }));
  return h("figure", { class: "figure" }, root);
}

// Horizontal bars with a text label each: items [{label, value, text, cls}].
function hbarChart(items, opts) {
  const W = opts.width || 1000;
  const row = 26;
  const L = 70;
  const R = 220;
  const H = items.length * row + 8;
  const vmax = Math.max(...items.map((i) => i.value), 0) || 1;
  const root = svgRoot(W, H, "chart", opts.label);
  items.forEach((item, i) => {
    const yy = 4 + i * row;
    const bw = Math.max(((W - L - R) * item.value) / vmax, item.value > 0 ? 1 : 0);
    root.append(s("text", { x: L - 8, y: yy + 16, class: "axis end", text: item.label }));
    const bar = s("rect", { x: L, y: yy + 4, width: bw, height: row - 10, class: `bar ${item.cls || ""}` });
    bar.append(s("title", { text: item.text }));
    root.append(bar);
    root.append(s("text", { x: L + bw + 6, y: yy + 16, class: "value", text: item.text }));
  });
  return h("figure", { class: "figure" }, root);
}

// The job's timeline: one row per phase on a time axis from its creation.
function timelineChart(tl) {
  const W = 1000;
  const row = 28;
  const L = 92;
  const R = 96;
  const T = 8;
  const t0 = Date.parse(tl.created_at);
  const endOf = (p) => (p.end ? Date.parse(p.end) : Date.parse(tl.at));
  const t1 = Math.max(t0 + 100, ...tl.phases.map(endOf));
  const H = T + tl.phases.length * row + 26;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const root = svgRoot(W, H, "chart timeline", "job timeline: where its time went");
  const axis = ticks(0, (t1 - t0) / 1000, 6);
  const yAxis = T + tl.phases.length * row;
  for (const v of axis.values) {
    const xx = x(t0 + v * 1000);
    root.append(s("line", { x1: xx, x2: xx, y1: T, y2: yAxis, class: "grid" }));
    const digits = axis.step < 0.1 ? 2 : axis.step < 1 ? 1 : 0;
    root.append(s("text", { x: xx, y: yAxis + 16, class: "axis mid", text: `${v.toFixed(digits)} s` }));
  }
  tl.phases.forEach((p, i) => {
    const yy = T + i * row;
    const sub = ["boot", "load", "warm"].includes(p.phase);
    const label = p.phase === "run" ? `run #${p.attempt}` : sub ? `↳ ${p.phase}` : p.phase;
    root.append(s("text", { x: L - 8, y: yy + 18, class: `axis end${sub ? " sub" : ""}`, text: label }));
    const bx = x(Date.parse(p.start));
    const bw = Math.max(x(endOf(p)) - bx, 2);
    const bar = s("rect", {
      x: bx,
      y: yy + 5,
      width: bw,
      height: row - 10,
      rx: 3,
      class: `bar ph-${p.phase}${p.end ? "" : " open"}`,
      "data-phase": p.phase,
    });
    bar.append(s("title", { text: `${label}: ${clock(p.start)} → ${p.end ? clock(p.end) : "now"}` }));
    root.append(bar);
    const note = p.end ? secs(p.seconds) : `${secs(p.seconds)} …`;
    root.append(s("text", { x: bx + bw + 6, y: yy + 18, class: "value", text: note }));
  });
  return h("figure", { class: "figure" }, root);
}

export { svgRoot, stepChart, barChart, hbarChart, timelineChart };
