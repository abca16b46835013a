// The usage view: cost by day and by phase as bar charts, and by deployment.
import { api } from "./session.js";
import { h, fill, num, secs, money, table, td, empty, section } from "./dom.js";
import { barChart, hbarChart } from "./charts.js";
import { setParams } from "./url.js";

const PHASES = ["boot", "load", "warm", "busy", "idle", "drain", "pool"];

// `redraw`: refresh this view now (the router's, with its error handling);
// `params`: its filters from the URL (url.js): `days`
function usageView(redraw, params) {
  const asked = Number(params.get("days"));
  let days = [7, 30, 90].includes(asked) ? asked : 7;
  const buttons = [7, 30, 90].map((n) =>
    h("button", {
      type: "button",
      class: n === days ? "active" : "",
      "data-days": n,
      text: `${n} days`,
      onclick: () => pick(n),
    }),
  );
  const total = h("p", { class: "big" });
  const byDay = h("div", {});
  const byPhase = h("div", {});
  const byDep = h("div", {});
  const root = h(
    "div",
    {},
    h("h1", { text: "Usage and cost" }),
    h("div", { class: "toolbar" }, buttons),
    total,
    section("Cost by day", byDay),
    section("Cost by phase", byPhase),
    section("By deployment", byDep),
  );
  const view = {
    root,
    everyMs: 10_000,
    async refresh(current) {
      // the last `days` UTC days, today included
      const since = new Date(Date.now() - (days - 1) * 86_400_000);
      since.setUTCHours(0, 0, 0, 0);
      const q = (group_by) => api("/v1/usage/summary", { group_by, since: since.toISOString() });
      const [day, phase, dep] = await Promise.all([q("day"), q("phase"), q("deployment")]);
      if (!current()) return;
      fill(
        total,
        h("span", { class: "amount", id: "usage-total", text: money(day.total_amount) }),
        h("span", {
          class: "muted",
          text: ` in the last ${days} days (UTC days, per second of worker time)`,
        }),
      );
      fill(byDay, dayChart(day.data, since, days));
      fill(
        byPhase,
        phase.data.length
          ? hbarChart(
              [...phase.data]
                .sort((a, b) => PHASES.indexOf(a.group) - PHASES.indexOf(b.group))
                .map((g) => ({
                  label: g.group,
                  value: num(g.amount),
                  text: `${money(g.amount)} · ${secs(g.seconds)}`,
                  cls: `ph-${g.group}`,
                })),
              { label: "cost by phase" },
            )
          : empty("No billed time in this period."),
      );
      fill(
        byDep,
        dep.data.length
          ? table(
              ["deployment", "worker time#", "cost#"],
              dep.data.map((g) =>
                h(
                  "tr",
                  {},
                  td(g.group),
                  td(secs(g.seconds), { class: "num" }),
                  td(money(g.amount), { class: "num" }),
                ),
              ),
            )
          : empty("No billed time in this period."),
      );
    },
  };
  const pick = (n) => {
    days = n;
    setParams({ days: n === 7 ? "" : n });
    for (const b of buttons) b.classList.toggle("active", Number(b.dataset.days) === n);
    redraw();
  };
  return view;
}

function dayChart(groups, since, days) {
  const amounts = new Map(groups.map((g) => [g.group, g]));
  const items = [];
  for (let i = 0; i < days; i += 1) {
    const day = new Date(since.getTime() + i * 86_400_000).toISOString().slice(0, 10);
    const g = amounts.get(day);
    items.push({
      label: day.slice(5),
      value: g ? num(g.amount) : 0,
      title: `${day}: ${g ? `${money(g.amount)} · ${secs(g.seconds)}` : "nothing billed"}`,
      cls: "ph-day",
    });
  }
  const vmax = Math.max(...items.map((i) => i.value));
  const digits = vmax > 0 ? Math.max(2, -Math.floor(Math.log10(vmax)) + 1) : 2;
  return barChart(items, { label: "cost by day", tick: (v) => `$${v.toFixed(Math.min(digits, 9))}` });
}

export { usageView };
