// rlsdk view: the page. Plain JavaScript, no library, nothing loaded from elsewhere.
// Text from the run (prompts, responses, settings) goes into the page as text nodes, never as markup.
"use strict";

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const live = document.getElementById("live");
const POLL_MS = 4000;
let generation = 0; // each navigation renders once; an older render that finishes late is dropped
let routed = ""; // the address the current navigation renders (main.dataset.route once shown)
let poller = null;

// ------------------------------------------------------------------ DOM and data helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function s(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "style") Object.assign(el.style, value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "value") el.value = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

async function api(path, params) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(key, value);
  }
  const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) throw new Error((body && body.error) || `${response.status} ${response.statusText}`);
  return body;
}

function fmt(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return value.toFixed(digits);
}

// A number as the page shows it, its exact value in data-value (tests read it) and in the tooltip.
function num(value, digits) {
  return h("span", { class: "number", title: value === null || value === undefined ? null : String(value),
    dataset: { value: value === null || value === undefined ? "" : String(value) } }, fmt(value, digits));
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  if (value < 7200) return `${(value / 60).toFixed(1)} min`;
  return `${(value / 3600).toFixed(2)} h`;
}

function rewardColor(reward) {
  if (reward === null || reward === undefined) return null;
  const t = Math.max(0, Math.min(1, reward));
  const hue = 5 + t * 130; // red to green
  return `hsl(${hue}, 60%, 40%)`;
}

function chip(sample, href) {
  const color = rewardColor(sample.reward);
  return h("a", {
    class: color ? "chip" : "chip none", href, style: color ? { background: color } : null,
    title: `sample ${sample.index ?? ""}: reward ${fmt(sample.reward)}, ${sample.length ?? "?"} tokens, ${sample.status ?? ""}` +
      (sample.reason ? `, ${sample.reason}` : ""),
    dataset: { n: sample.n, reward: sample.reward === null ? "" : String(sample.reward) },
  }, fmt(sample.reward, 2));
}

function kv(rows) {
  return h("table", { class: "kv" }, rows.filter(Boolean).map(([key, value]) =>
    h("tr", {}, h("td", {}, key), h("td", {}, value))));
}

function table(headers, rows, options = {}) {
  return h("table", { class: options.class || null },
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", { class: options.numeric && options.numeric.includes(name) ? "num" : null }, name)))),
    h("tbody", {}, rows));
}

function card(label, value) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
}

function runHref(run, ...rest) { return `#/run/${run}${rest.length ? "/" + rest.join("/") : ""}`; }
function sampleHref(run, file, n) { return runHref(run, "sample", file, n); }
function query(params) {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value !== null && value !== undefined && value !== "") q.set(key, value);
  const text = q.toString();
  return text ? `?${text}` : "";
}

function setCrumbs(...items) {
  crumbs.replaceChildren(...items.filter(Boolean).map(([label, href]) => href ? h("a", { href }, label) : h("span", {}, label)));
}

function show(gen, pageName, ...content) {
  if (gen !== generation) return false;
  main.replaceChildren(...content.flat(Infinity).filter(Boolean));
  main.dataset.page = pageName;
  main.dataset.route = routed;
  main.dataset.ready = "1";
  main.dataset.readyAt = performance.now().toFixed(1); // ms since this document's navigation began
  return true;
}

function notes(list) {
  if (!list || !list.length) return null;
  return h("ul", { class: "notes" }, list.map((note) => h("li", {}, note)));
}

function statusBadge(status) { return h("span", { class: `badge ${status.replace(" ", "-")}` }, status); }

// ------------------------------------------------------------------ charts

// One metric (or a few) against steps or wall time; a point's click opens its step.
function lineChart(title, series, options) {
  const W = 330, H = 150, L = 44, R = 8, T = 8, B = 20;
  const points = series.flatMap((line) => line.points);
  const hover = h("div", { class: "hover" }, "\u00a0");
  const box = h("div", { class: "chart", dataset: { metric: title } }, h("div", { class: "title", title }, title), hover);
  if (!points.length) { box.append(h("div", { class: "muted" }, "no values")); return box; }
  let [x0, x1] = [Math.min(...points.map((p) => p.x)), Math.max(...points.map((p) => p.x))];
  let [y0, y1] = [Math.min(...points.map((p) => p.y)), Math.max(...points.map((p) => p.y))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "xMidYMid meet", role: "img" });
  svg.append(s("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  svg.append(s("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (const y of [y0, (y0 + y1) / 2, y1]) {
    svg.append(s("text", { x: L - 4, y: py(y) + 3, "text-anchor": "end" }, fmt(y, 3)));
  }
  const xTicks = options.xFormat === String ? [...new Set([x0, (x0 + x1) / 2, x1].map(Math.round))] : [x0, (x0 + x1) / 2, x1];
  for (const x of xTicks) {
    svg.append(s("text", { x: px(x), y: H - 6, "text-anchor": "middle" }, options.xFormat(x)));
  }
  const marker = s("circle", { r: 4, fill: "none", stroke: "#1d2330", visibility: "hidden" });
  for (const line of series) {
    if (!line.points.length) continue;
    const d = line.points.map((p, i) => `${i ? "L" : "M"}${px(p.x).toFixed(1)},${py(p.y).toFixed(1)}`).join("");
    svg.append(s("path", { d, fill: "none", stroke: line.color, "stroke-width": 1.5 }));
    if (line.points.length <= 300) {
      for (const p of line.points) {
        svg.append(s("circle", { cx: px(p.x), cy: py(p.y), r: 2.5, fill: line.color,
          dataset: { step: p.step, value: p.y, series: line.name } }));
      }
    }
  }
  svg.append(marker);
  const nearest = (event) => {
    const rect = svg.getBoundingClientRect();
    const x = ((event.clientX - rect.left) / rect.width) * W;
    let best = null;
    for (const line of series) for (const p of line.points) {
      const d = Math.abs(px(p.x) - x);
      if (!best || d < best.d) best = { d, p, line };
    }
    return best;
  };
  svg.addEventListener("mousemove", (event) => {
    const best = nearest(event);
    if (!best) return;
    marker.setAttribute("cx", px(best.p.x));
    marker.setAttribute("cy", py(best.p.y));
    marker.setAttribute("visibility", "visible");
    const where = options.xFormat === String ? `step ${best.p.step}` : `step ${best.p.step} (${options.xFormat(best.p.x)})`;
    hover.textContent = `${where}: ${series.length > 1 ? best.line.name + " " : ""}${fmt(best.p.y)}`;
  });
  svg.addEventListener("mouseleave", () => { marker.setAttribute("visibility", "hidden"); hover.textContent = "\u00a0"; });
  svg.addEventListener("click", (event) => {
    const step = event.target.dataset && event.target.dataset.step;
    const best = step !== undefined ? { p: { step: Number(step) } } : nearest(event);
    if (best && options.onPick) options.onPick(best.p.step);
  });
  box.append(svg);
  if (series.length > 1) {
    box.append(h("div", { class: "legend" }, series.map((line) =>
      [h("span", { class: "swatch", style: { background: line.color } }), line.name, " "])));
  }
  return box;
}

const COLORS = ["#2f6fde", "#e07b00", "#1a7f4b", "#8e44ad", "#c0392b", "#16a085"];

// Wall time across resumes: a resumed run's clock starts again at 0, so its steps continue from the last.
function wallClock(rows) {
  let offset = 0, last = 0;
  return rows.map((row) => {
    const t = row["run/elapsed_seconds"];
    if (t === undefined) return null;
    if (t + offset < last) offset = last;
    last = t + offset;
    return last;
  });
}

const KEY_CHARTS = [
  ["reward", ["rollout/reward_mean", "rollout/reward_mean_before_filter"]],
  ["response length", ["rollout/response_len_mean"]],
  ["loss", ["train/loss", "train/pg_loss"]],
  ["KL", ["train/ppo_kl", "train/kl_loss"]],
  ["entropy", ["train/entropy_loss"]],
  ["clip fraction", ["train/pg_clipfrac"]],
  ["grad norm", ["train/grad_norm"]],
  ["samples", ["ledger/kept", "ledger/dropped", "ledger/failed", "ledger/returned"]],
  ["seconds per step", ["rollout/seconds", "train/seconds", "train/sync_seconds"]],
  ["policy lag", ["async/lag_max", "async/lag_mean"]],
];

function seriesOf(rows, keys, xs) {
  return keys.map((key, i) => ({
    name: key, color: COLORS[i % COLORS.length],
    points: rows.map((row, j) => ({ x: xs[j], y: row[key], step: row.rollout_id }))
      .filter((p) => typeof p.y === "number" && p.x !== null && p.x !== undefined),
  })).filter((line) => line.points.length);
}

// ------------------------------------------------------------------ pages

async function runsPage(gen) {
  setCrumbs(["runs", null]);
  const { runs } = await api("/api/runs");
  // the user went elsewhere meanwhile (the address can change before its hashchange event has run route()):
  // no redirect over their page
  if (gen !== generation || location.hash !== routed) return;
  if (runs.length === 1) { location.replace(runHref(0)); return; }
  const rows = runs.map((run) => h("tr", { class: "link", onclick: () => { location.hash = runHref(run.id); } },
    h("td", {}, h("a", { href: runHref(run.id) }, run.name)), h("td", {}, statusBadge(run.status)),
    h("td", { class: "num" }, `${run.steps} / ${run.num_rollout ?? "?"}`), h("td", { class: "num" }, num(run.reward)),
    h("td", { class: "num" }, run.samples.rollouts), h("td", { class: "num" }, run.samples.discarded),
    h("td", { class: "num" }, run.samples.eval), h("td", { class: "muted" }, run.path)));
  const canCompare = runs.filter((run) => run.samples.eval).length >= 2;
  show(gen, "runs", h("h1", {}, "Runs"),
    table(["run", "status", "steps", "reward", "kept", "discarded", "eval samples", "folder"], rows,
      { numeric: ["steps", "reward", "kept", "discarded", "eval samples"] }),
    canCompare ? h("p", {}, h("a", { href: "#/compare" }, "Compare two runs' evals")) : null);
}

async function runPage(gen, run) {
  const [summary, metrics, evals] = await Promise.all([
    api(`/api/runs/${run}`), api(`/api/runs/${run}/metrics`), api(`/api/runs/${run}/evals`)]);
  setCrumbs(["runs", "#/"], [summary.name, null]);
  const state = { rows: metrics.rows, next: metrics.next, evals: evals.rows, axis: "step", filter: "" };
  const charts = h("div", { id: "charts" });
  const allCharts = h("div", { class: "charts", id: "all-charts" });
  const steps = h("div", { id: "steps" });
  const evalBox = h("div", { id: "evals" });
  const axis = h("select", { id: "axis", onchange: (e) => { state.axis = e.target.value; draw(); } },
    h("option", { value: "step" }, "step"), h("option", { value: "time" }, "wall time"));
  const filter = h("input", { type: "search", placeholder: "metric name", id: "metric-filter",
    oninput: (e) => { state.filter = e.target.value; drawAll(); } });
  const allDetails = h("details", { ontoggle: () => drawAll() }, h("summary", {}, "Every metric"),
    h("div", { class: "controls" }, h("label", {}, "filter "), filter), allCharts);

  const pick = (step) => { location.hash = runHref(run, "step", step); };
  const xsOf = (rows) => state.axis === "step" ? rows.map((r) => r.rollout_id) : wallClock(rows);
  const xFormat = () => state.axis === "step" ? String : seconds;

  function draw() {
    const xs = xsOf(state.rows);
    const list = [];
    for (const [title, keys] of KEY_CHARTS) {
      const series = seriesOf(state.rows, keys, xs);
      if (series.length) list.push(lineChart(title, series, { xFormat: xFormat(), onPick: pick }));
    }
    for (const dataset of evals.datasets) {
      const keys = Object.keys(state.evals[0] || {}).filter((k) => k.startsWith(`eval/${dataset}/`) &&
        (k.endsWith("/reward_mean") || k.includes("/pass@")));
      const exs = xsOf(state.evals);
      const series = seriesOf(state.evals, keys, exs);
      if (series.length) list.push(lineChart(`eval ${dataset}`, series, { xFormat: xFormat(), onPick: pick }));
    }
    charts.replaceChildren(list.length ? h("div", { class: "charts" }, list) : h("p", { class: "muted" }, "no steps yet"));
    drawAll();
    drawSteps();
  }

  function drawAll() {
    if (!allDetails.open) return;
    const xs = xsOf(state.rows);
    const keys = [...new Set(state.rows.flatMap((row) => Object.keys(row)))]
      .filter((k) => k !== "rollout_id" && k.toLowerCase().includes(state.filter.toLowerCase())).sort();
    allCharts.replaceChildren(...keys.map((key) =>
      lineChart(key, seriesOf(state.rows, [key], xs), { xFormat: xFormat(), onPick: pick })));
  }

  let stepPage = 0;
  function drawSteps() {
    const per = 50, rows = [...state.rows].reverse();
    const pages = Math.max(1, Math.ceil(rows.length / per));
    stepPage = Math.min(stepPage, pages - 1);
    const shown = rows.slice(stepPage * per, stepPage * per + per);
    const body = shown.map((row) => h("tr", { class: "link", dataset: { step: row.rollout_id },
      onclick: () => pick(row.rollout_id) },
      h("td", {}, h("a", { href: runHref(run, "step", row.rollout_id) }, `step ${row.rollout_id}`)),
      h("td", { class: "num" }, num(row["rollout/reward_mean"])),
      h("td", { class: "num" }, num(row["rollout/reward_mean_before_filter"])),
      h("td", { class: "num" }, num(row["ledger/kept"])), h("td", { class: "num" }, num(row["ledger/dropped"])),
      h("td", { class: "num" }, num(row["ledger/failed"])),
      h("td", { class: "num" }, num(row["rollout/response_len_mean"], 1)),
      h("td", { class: "num" }, seconds(row["rollout/seconds"])), h("td", { class: "num" }, seconds(row["train/seconds"]))));
    steps.replaceChildren(...[
      table(["step", "reward", "before filter", "kept", "dropped", "failed", "length", "rollout", "train"], body,
        { numeric: ["reward", "before filter", "kept", "dropped", "failed", "length", "rollout", "train"] }),
      pages > 1 ? h("div", { class: "pager" },
        h("button", { disabled: stepPage === 0, onclick: () => { stepPage--; drawSteps(); } }, "newer"),
        `page ${stepPage + 1} of ${pages}`,
        h("button", { disabled: stepPage >= pages - 1, onclick: () => { stepPage++; drawSteps(); } }, "older")) : null,
    ].filter(Boolean));
  }

  function drawEvals() {
    const parts = evals.datasets.map((dataset) => {
      const rank = (k) => (k.endsWith("/reward_mean") ? 0 : k.includes("/pass@") ? 1 : 2);
      const keys = [...new Set(state.evals.flatMap((row) => Object.keys(row)))]
        .filter((k) => k.startsWith(`eval/${dataset}/`))
        .sort((a, b) => rank(a) - rank(b) || a.localeCompare(b, "en", { numeric: true }));
      const names = keys.map((k) => k.slice(`eval/${dataset}/`.length));
      const rows = state.evals.map((row) => h("tr", { dataset: { step: row.rollout_id } },
        h("td", {}, row.rollout_id < 0 ? "before training" : h("a", { href: runHref(run, "step", row.rollout_id) }, `after step ${row.rollout_id}`)),
        keys.map((k) => h("td", { class: "num", dataset: { key: k } }, num(row[k])))));
      return [h("h3", {}, dataset), table(["eval", ...names], rows, { numeric: names })];
    });
    const compareLink = summary.eval_steps.length >= 2
      ? h("p", {}, h("a", { href: `#/compare${query({ a: run, b: run, step_a: summary.eval_steps[0],
        step_b: summary.eval_steps[summary.eval_steps.length - 1] })}` }, "Compare the first and last evals prompt by prompt"))
      : null;
    evalBox.replaceChildren(...(parts.length ? parts.flat() : [h("p", { class: "muted" }, "no evals")]), compareLink || "");
  }

  const settings = summary.settings;
  const settingsFilter = h("input", { type: "search", placeholder: "setting name", oninput: (e) => {
    const q = e.target.value.toLowerCase();
    for (const tr of settingsTable.querySelectorAll("tr")) tr.hidden = !tr.dataset.key.includes(q);
  } });
  const settingsTable = h("table", { class: "kv" }, Object.keys(settings).sort().map((key) =>
    h("tr", { dataset: { key } }, h("td", {}, key), h("td", {}, typeof settings[key] === "object" && settings[key] !== null
      ? JSON.stringify(settings[key]) : String(settings[key])))));
  const plugins = Object.entries(summary.plugins).map(([name, version]) => h("tr", {}, h("td", {}, name), h("td", {}, version)));
  const files = summary.files.map((f) => h("tr", {}, h("td", {}, f.name), h("td", { class: "num" }, f.lines),
    h("td", { class: "num" }, f.bytes), h("td", { class: "num" }, f.partial_bytes), h("td", { class: "num" }, f.bad_lines),
    h("td", { class: "num" }, f.past_saved_state)));

  draw();
  drawEvals();
  const shown = show(gen, "run",
    h("h1", {}, summary.name, " ", statusBadge(summary.status)),
    h("p", { class: "muted" }, summary.path, " · ", `${summary.steps} of ${summary.num_rollout ?? "?"} steps`,
      summary.checkpoint ? ` · last checkpoint ${summary.checkpoint}` : ""),
    notes(summary.notes),
    h("p", {}, h("a", { href: runHref(run, "samples") }, "Search samples"), " · ",
      h("a", { href: runHref(run, "samples") + query({ file: "discarded" }) }, "Discarded samples"), " · ",
      h("a", { href: runHref(run, "samples") + query({ file: "eval" }) }, "Eval samples")),
    h("h2", {}, "Curves"), h("div", { class: "controls" }, h("label", {}, "x axis "), axis), charts, allDetails,
    h("h2", {}, "Evals"), evalBox,
    h("h2", {}, "Steps"), steps,
    h("h2", {}, "Settings"), h("details", {}, h("summary", {}, `${Object.keys(settings).length} settings`),
      h("div", { class: "controls" }, settingsFilter), settingsTable),
    h("h2", {}, "Plugins"), plugins.length ? table(["distribution", "version"], plugins) : h("p", { class: "muted" }, "not recorded"),
    h("h2", {}, "Files"), table(["file", "lines", "bytes", "partial bytes", "damaged lines", "past saved state"], files,
      { numeric: ["lines", "bytes", "partial bytes", "damaged lines", "past saved state"] }));
  if (!shown || summary.status !== "running") return;
  startPolling(gen, async () => {
    const [fresh, more, ev] = await Promise.all([api(`/api/runs/${run}/metrics`, { since: state.next }),
      api(`/api/runs/${run}`), api(`/api/runs/${run}/evals`)]);
    if (fresh.next < state.next) { route(); return; } // the run was replaced or cut back: start over
    if (fresh.rows.length || ev.rows.length !== state.evals.length) {
      state.rows = state.rows.concat(fresh.rows);
      state.next = fresh.next;
      state.evals = ev.rows;
      evals.datasets = ev.datasets;
      draw();
      drawEvals();
    }
    return more.status === "running";
  });
}

async function stepPage(gen, run, step) {
  const [summary, data] = await Promise.all([api(`/api/runs/${run}`), api(`/api/runs/${run}/steps/${step}`)]);
  setCrumbs(["runs", "#/"], [summary.name, runHref(run)], [`step ${step}`, null]);
  const m = data.metrics || {};
  const ledger = ["entered", "kept", "dropped", "returned", "failed", "produced", "requeued"]
    .filter((k) => m[`ledger/${k}`] !== undefined).map((k) => card(k, num(m[`ledger/${k}`])));
  const rewards = [["reward (kept)", "rollout/reward_mean"], ["reward (all scored)", "rollout/reward_mean_before_filter"],
    ["group spread", "rollout/reward_group_std_mean"], ["response length", "rollout/response_len_mean"]]
    .filter(([, k]) => m[k] !== undefined).map(([label, k]) => card(label, num(m[k])));
  const timings = Object.keys(m).filter((k) => /seconds$/.test(k) && typeof m[k] === "number" && k !== "run/elapsed_seconds");
  const longest = Math.max(1e-9, ...timings.map((k) => m[k]));
  const timingRows = timings.map((k) => h("tr", {}, h("td", {}, k), h("td", { class: "num" }, seconds(m[k])),
    h("td", {}, h("span", { class: "bar", style: { width: `${Math.round((m[k] / longest) * 240)}px` } }))));
  const drops = Object.keys(m).filter((k) => k.startsWith("rollout/dynamic_filter/drop_"))
    .map((k) => h("tr", {}, h("td", {}, k.slice("rollout/dynamic_filter/drop_".length)), h("td", { class: "num" }, num(m[k]))));
  const failures = [...(m["rollout/failures"] || []), ...(m["rollout/invalid_reward_causes"] || [])];
  const stale = Object.keys(m).filter((k) => k.startsWith("async/")).map((k) => card(k.slice(6), num(m[k])));
  const versions = Object.entries(data.versions).map(([v, count]) => card(`policy ${v}`, `${count} sampled`));

  const groupRows = data.groups.map((g) => h("tr", { dataset: { group: g.group } },
    h("td", { class: "num" }, g.group), h("td", {}, h("div", { class: "muted" }, g.prompt)),
    h("td", {}, g.label), h("td", { class: "num" }, num(g.reward_mean)), h("td", { class: "num" }, num(g.reward_std)),
    h("td", {}, g.samples.map((sample) => chip(sample, sampleHref(run, "rollouts", sample.n))))));
  const pages = Math.ceil(data.group_count / 50);
  const groupPager = pages > 1 ? h("div", { class: "pager" }, `groups ${data.group_offset + 1}–${data.group_offset + data.groups.length} of ${data.group_count}`) : null;
  const discarded = data.discarded.map(({ reason, groups }) => [
    h("h3", {}, `${reason}: ${groups.reduce((n, g) => n + g.samples.length, 0)} samples in ${groups.length} groups`),
    table(["group", "mean", "samples"], groups.map((g) => h("tr", { dataset: { group: g.group } },
      h("td", { class: "num" }, g.group), h("td", { class: "num" }, num(g.reward_mean)),
      h("td", {}, g.samples.map((sample) => chip(sample, sampleHref(run, "discarded", sample.n))))))),
  ]);
  const evalRow = data.eval ? kv(Object.keys(data.eval).filter((k) => k !== "rollout_id").sort()
    .map((k) => [k, typeof data.eval[k] === "number" ? num(data.eval[k]) : JSON.stringify(data.eval[k])])) : null;
  const allMetrics = kv(Object.keys(m).sort().map((k) => [k, typeof m[k] === "number" ? num(m[k]) : JSON.stringify(m[k])]));
  show(gen, "step",
    h("h1", {}, `${summary.name}: step ${step}`),
    h("div", { class: "pager" },
      data.previous !== null ? h("a", { href: runHref(run, "step", data.previous), id: "previous-step" }, `← step ${data.previous}`) : null,
      data.next !== null ? h("a", { href: runHref(run, "step", data.next), id: "next-step" }, `step ${data.next} →`) : null,
      h("a", { href: runHref(run, "samples") + query({ step }) }, "search this step's samples")),
    data.metrics ? null : h("p", { class: "notes" }, "no metrics row for this step yet"),
    h("div", { class: "cards", id: "ledger" }, ledger), h("div", { class: "cards", id: "rewards" }, rewards),
    versions.length || stale.length ? [h("h2", {}, "Policy versions and staleness"), h("div", { class: "cards" }, versions, stale)] : null,
    h("h2", {}, "Filter verdicts"),
    drops.length ? table(["dropped because", "samples"], drops, { numeric: ["samples"] }) : h("p", { class: "muted" }, "no group was dropped"),
    failures.length ? [h("h3", {}, "failures"), h("ul", {}, failures.map((f) => h("li", {}, f)))] : null,
    h("h2", {}, `Kept groups (${data.group_count})`), groupPager,
    table(["group", "prompt", "label", "mean", "spread", "samples (reward)"], groupRows, { numeric: ["mean", "spread"], class: "groups" }),
    h("h2", {}, "Discarded"), discarded.length ? discarded : h("p", { class: "muted" }, "nothing discarded"),
    timingRows.length ? [h("h2", {}, "Timings"), table(["phase", "time", ""], timingRows)] : null,
    evalRow ? [h("h2", {}, "Eval after this step"), evalRow] : null,
    h("h2", {}, "Every metric of the step"), h("details", {}, h("summary", {}, `${Object.keys(m).length} metrics`), allMetrics));
}

function contentText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => part.text ?? (part.type ? `[${part.type}]` : JSON.stringify(part))).join("");
  return content === null || content === undefined ? "" : JSON.stringify(content);
}

function messages(list) {
  return list.map((message) => h("div", { class: `message ${message.role || ""}` },
    h("div", { class: "role" }, message.role || "?", message.name ? ` · ${message.name}` : "",
      message.tool_call_id ? ` · answer to ${message.tool_call_id}` : ""),
    contentText(message.content) ? h("div", { class: "text" }, contentText(message.content)) : null,
    (message.tool_calls || []).map((call) => h("div", { class: "toolcall" },
      `${(call.function && call.function.name) || call.name || "call"}(${(call.function && call.function.arguments) || JSON.stringify(call.arguments || call.input || {})})`,
      call.id ? h("span", { class: "muted" }, ` · ${call.id}`) : null))));
}

const TOKEN_MODES = {
  gap: "gap between rollout and trainer log-probs (white 0, red 1 nat or more)",
  logprob: "rollout log-prob (white 0, orange -5 or lower)",
  mask: "loss mask (blue: trained, grey: not)",
};

function tokenColor(mode, t) {
  if (t.prompt) return null;
  if (mode === "mask") return t.mask ? "#dbe8ff" : "#e4e7ec";
  if (mode === "logprob") {
    if (typeof t.lp !== "number") return null;
    const a = Math.min(1, -t.lp / 5);
    return `rgba(224, 123, 0, ${a.toFixed(3)})`;
  }
  if (typeof t.gap !== "number") return null;
  return `rgba(192, 57, 43, ${Math.min(1, t.gap).toFixed(3)})`;
}

function tokenView(data) {
  const row = data.row;
  const ids = row.tokens || [];
  const P = data.prompt_length;
  const rollout = row.rollout_log_probs || [];
  const trained = data.train_log_probs || [];
  const mask = row.loss_mask;
  const tokens = ids.map((id, i) => {
    const j = i - P;
    const t = { i, id, text: data.pieces ? data.pieces[i] : `[${id}]`, prompt: j < 0 };
    if (j >= 0) {
      t.j = j; t.mask = mask ? mask[j] : 1; t.lp = rollout[j]; t.tlp = trained[j];
      if (typeof t.lp === "number" && typeof t.tlp === "number") t.gap = Math.abs(t.lp - t.tlp);
    }
    return t;
  });
  let mode = trained.length ? "gap" : "logprob";
  const detail = h("div", { class: "legend", id: "token-detail" }, "click a token for its numbers");
  const box = h("div", { class: "tokens", id: "tokens" });
  const spans = tokens.map((t) => {
    const span = h("span", { class: `tok${t.prompt ? " prompt" : ""}${!t.prompt && !t.mask ? " masked" : ""}`,
      dataset: { i: t.i, j: t.j ?? "", lp: t.lp ?? "", tlp: t.tlp ?? "" } }, t.text);
    span.title = t.prompt ? `prompt token ${t.i}: id ${t.id}` :
      `response token ${t.j}: id ${t.id}, rollout ${fmt(t.lp)}, trainer ${fmt(t.tlp)}, gap ${fmt(t.gap)}, loss mask ${t.mask}`;
    span.addEventListener("click", () => {
      for (const other of box.querySelectorAll(".selected")) other.classList.remove("selected");
      span.classList.add("selected");
      detail.replaceChildren();
      append(detail, [t.prompt ? `prompt token ${t.i} · id ${t.id} · ${JSON.stringify(t.text)}` :
        [`response token ${t.j} · id ${t.id} · ${JSON.stringify(t.text)} · rollout log-prob `, num(t.lp),
          " · trainer log-prob ", num(t.tlp), " · gap ", num(t.gap), ` · loss mask ${t.mask}`]]);
    });
    return span;
  });
  box.append(...spans);
  const paint = () => tokens.forEach((t, k) => { spans[k].style.background = tokenColor(mode, t) || ""; });
  const select = h("select", { id: "token-mode", onchange: (e) => { mode = e.target.value; legend.textContent = TOKEN_MODES[mode]; paint(); } },
    Object.keys(TOKEN_MODES).map((key) => h("option", { value: key, selected: key === mode }, key)));
  const legend = h("span", {}, TOKEN_MODES[mode]);
  paint();
  const response = tokens.filter((t) => !t.prompt);
  const gaps = response.filter((t) => typeof t.gap === "number");
  const worst = gaps.reduce((a, t) => (!a || t.gap > a.gap ? t : a), null);
  const mean = (list) => (list.length ? list.reduce((a, b) => a + b, 0) / list.length : null);
  const stats = h("div", { class: "cards", id: "logprob-stats" },
    card("response tokens", num(response.length)), card("trained (loss mask 1)", num(response.filter((t) => t.mask).length)),
    card("mean rollout log-prob", num(mean(response.map((t) => t.lp).filter((v) => typeof v === "number")))),
    card("mean trainer log-prob", trained.length ? num(mean(trained)) : "not recorded"),
    card("mean |gap|", gaps.length ? num(mean(gaps.map((t) => t.gap))) : "–"),
    card("largest |gap|", worst ? [num(worst.gap), ` at token ${worst.j}`] : "–"));
  return [stats,
    trained.length ? null : h("p", { class: "muted" }, "The trainer's log-probs of this sample were not recorded: the torch trainer records them " +
      "(metadata.train_log_probs) when it computes the old policy's log-probs (several optimizer steps per rollout, or a KL term, without --use-rollout-logprobs)."),
    data.pieces ? null : h("p", { class: "muted" }, `Token ids only: ${data.tokenizer.missing}`),
    h("div", { class: "controls" }, h("label", {}, "colour by "), select, legend), detail, box];
}

// The response split where the loss mask changes: the model's turns and what the tools answered.
function responseTurns(data) {
  const row = data.row, mask = row.loss_mask;
  if (!mask || !data.pieces || mask.every((m) => m === 1)) return null;
  const P = data.prompt_length, parts = [];
  for (let j = 0; j < mask.length; j++) {
    const piece = data.pieces[P + j] ?? "";
    if (parts.length && parts[parts.length - 1].mask === mask[j]) parts[parts.length - 1].text += piece;
    else parts.push({ mask: mask[j], text: piece });
  }
  return [h("h2", {}, "Response by turn"), parts.map((part) => h("div", { class: `message ${part.mask ? "assistant" : "tool"}` },
    h("div", { class: "role" }, part.mask ? "model (trained)" : "observation (not trained)"), h("div", { class: "text" }, part.text)))];
}

function treeView(tree, pieces) {
  const children = new Map();
  for (const node of tree.nodes) {
    const key = node.parent === null ? "root" : node.parent;
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(node);
  }
  const trained = new Set(tree.trained || []);
  const render = (key) => h("ul", {}, (children.get(key) || []).map((node) => {
    const sampled = (node.loss_mask || []).filter((m) => m).length;
    const text = pieces && pieces[node.id] ? pieces[node.id].join("") : `${node.tokens.length} token ids`;
    return h("li", {}, h("span", { class: `node${trained.has(node.id) ? " trained" : ""}`, dataset: { node: node.id } },
      h("span", { class: "meta" }, `node ${node.id} · ${node.tokens.length} tokens (${sampled} sampled)` +
        (node.ends && node.ends.length ? ` · ends ${node.ends.map(([turn, choice]) => `turn ${turn}${choice ? ` choice ${choice}` : ""}`).join(", ")}` : "") +
        (trained.has(node.id) ? " · trained path" : "")), text), children.has(node.id) ? render(node.id) : null);
  }));
  return [h("p", { class: "muted" }, `${tree.nodes.length} segments, ${tree.branches} branches; the trained path is green.`),
    h("div", { class: "tree", id: "tree" }, render("root"))];
}

async function samplePage(gen, run, file, n) {
  const [summary, data] = await Promise.all([api(`/api/runs/${run}`), api(`/api/runs/${run}/samples/${file}/${n}`)]);
  const v = data.values;
  setCrumbs(["runs", "#/"], [summary.name, runHref(run)], v.step !== null ? [`step ${v.step}`, runHref(run, "step", v.step)] : null,
    [`${file} line ${n}`, null]);
  const nav = h("div", { class: "pager" },
    data.previous !== null && data.previous !== undefined ? h("a", { href: sampleHref(run, file, data.previous), id: "previous-sample" }, "← previous sample") : null,
    data.next !== null && data.next !== undefined ? h("a", { href: sampleHref(run, file, data.next), id: "next-sample" }, "next sample →") : null);
  const row = data.row;
  if (!row) {
    show(gen, "sample", h("h1", {}, `${file} line ${n}`), nav, h("p", { class: "error" }, "This line is not a JSON object (damaged)."));
    return;
  }
  const metadata = row.metadata || {};
  const reward = row.reward;
  const rubric = metadata.rubric || (reward && typeof reward === "object" ? reward : null);
  const agent = metadata.agent && typeof metadata.agent === "object" ? metadata.agent : null;
  const errors = ["generate_error", "filter_error", "reward_error"].filter((k) => metadata[k]).map((k) => [k, String(metadata[k])]);
  const facts = kv([
    ["file", `${file} line ${n}`], ["step", v.step], ["group / index", `${v.group ?? "–"} / ${v.index ?? "–"}`],
    ["reward", h("span", { id: "reward" }, num(v.reward))],
    rubric ? ["reward parts", kv(Object.entries(rubric).map(([k, value]) => [k, typeof value === "number" ? num(value) : JSON.stringify(value)]))] : null,
    ["status", row.status], ["response length", h("span", { id: "response-length" }, num(row.response_length))],
    ["prompt length", num(data.prompt_length)],
    ["policy versions", (row.weight_versions || []).join(", ") || "–"],
    row.dataset ? ["dataset", row.dataset] : null,
    v.reason ? ["dropped because", v.reason] : null,
    ["label", row.label === null || row.label === undefined ? "–" : (typeof row.label === "string" ? row.label : JSON.stringify(row.label))],
    ...errors,
  ]);
  const prompt = typeof row.prompt === "string" ? h("pre", { id: "prompt" }, row.prompt) : h("div", { id: "prompt" }, messages(row.prompt || []));
  show(gen, "sample",
    h("h1", {}, `${summary.name}: ${file === "rollouts" ? "kept sample" : file === "eval" ? "eval sample" : "discarded sample"}`),
    nav, facts,
    h("h2", {}, "Prompt"), prompt,
    h("h2", {}, "Response"), h("pre", { id: "response" }, row.response || ""),
    responseTurns(data),
    agent && Array.isArray(agent.messages) ? [h("h2", {}, "Agent conversation (trained path)"), h("div", { id: "agent-messages" }, messages(agent.messages)),
      agent.result !== undefined ? kv([["agent result", JSON.stringify(agent.result)]]) : null] : null,
    agent && agent.tree ? [h("h2", {}, "Trajectory tree"), treeView(agent.tree, data.tree_pieces)] : null,
    h("h2", {}, "Tokens"), tokenView(data),
    h("h2", {}, "Metadata"), h("details", {}, h("summary", {}, "metadata"), h("pre", {}, JSON.stringify(metadata, null, 1))),
    h("details", {}, h("summary", {}, "the whole line"), h("pre", {}, JSON.stringify(row))));
}

const FILE_LABELS = { rollouts: "kept (rollouts.jsonl)", discarded: "discarded (discarded.jsonl)", eval: "eval (eval_samples.jsonl)" };

async function samplesPage(gen, run, params) {
  const file = params.get("file") || "rollouts";
  const fields = ["step", "group", "min_reward", "max_reward", "min_length", "max_length", "status", "reason", "dataset", "q", "sort", "offset"];
  const asked = Object.fromEntries(fields.map((k) => [k, params.get(k)]));
  const [summary, data] = await Promise.all([api(`/api/runs/${run}`), api(`/api/runs/${run}/samples`, { file, ...asked, limit: 50 })]);
  setCrumbs(["runs", "#/"], [summary.name, runHref(run)], ["samples", null]);
  const input = (name, type, placeholder) => h("input", { name, type, placeholder, value: asked[name] || "", step: type === "number" ? "any" : null });
  const choice = (name, options) => h("select", { name }, h("option", { value: "" }, "any"),
    options.map((o) => h("option", { value: o, selected: asked[name] === o }, o)));
  const form = h("form", { class: "controls", id: "filters", onsubmit: (e) => {
    e.preventDefault();
    const values = Object.fromEntries([...new FormData(form).entries()].filter(([, v]) => v !== ""));
    location.hash = runHref(run, "samples") + query(values);
  } },
    h("label", {}, "file ", h("select", { name: "file" }, Object.entries(FILE_LABELS).map(([k, label]) => h("option", { value: k, selected: k === file }, label)))),
    h("label", {}, "step ", input("step", "number")),
    h("label", {}, "reward ", input("min_reward", "number", "min"), " – ", input("max_reward", "number", "max")),
    h("label", {}, "length ", input("min_length", "number", "min"), " – ", input("max_length", "number", "max")),
    h("label", {}, "finish ", choice("status", data.facets.status)),
    data.facets.reason.length ? h("label", {}, "reason ", choice("reason", data.facets.reason)) : null,
    data.facets.dataset.length ? h("label", {}, "dataset ", choice("dataset", data.facets.dataset)) : null,
    h("label", {}, "text ", input("q", "search", "in prompt, response or label")),
    h("label", {}, "sort ", h("select", { name: "sort" }, [["order", "file order"], ["reward", "reward ↑"], ["-reward", "reward ↓"],
      ["length", "length ↑"], ["-length", "length ↓"]].map(([k, label]) => h("option", { value: k, selected: asked.sort === k }, label)))),
    h("button", { type: "submit" }, "Search"));
  const offset = Number(asked.offset || 0);
  const rows = data.rows.map((r) => h("tr", { class: "link", dataset: { n: r.n }, onclick: () => { location.hash = sampleHref(run, file, r.n); } },
    h("td", {}, h("a", { href: sampleHref(run, file, r.n) }, r.n)), h("td", { class: "num" }, r.step), h("td", { class: "num" }, r.group),
    h("td", { class: "num" }, num(r.reward)), h("td", { class: "num" }, r.length), h("td", {}, r.status),
    h("td", {}, r.reason || r.dataset || ""), h("td", {}, h("div", { class: "muted" }, r.prompt)), h("td", {}, r.response)));
  const page = (to) => { location.hash = runHref(run, "samples") + query({ file, ...asked, offset: to || null }); };
  show(gen, "samples", h("h1", {}, `${summary.name}: samples`), form,
    h("div", { class: "pager" }, h("span", { id: "total" }, `${data.total} samples`),
      offset > 0 ? h("button", { onclick: () => page(Math.max(0, offset - 50)) }, "previous 50") : null,
      offset + 50 < data.total ? h("button", { onclick: () => page(offset + 50) }, "next 50") : null,
      data.total ? `showing ${offset + 1}–${offset + data.rows.length}` : ""),
    table(["line", "step", "group", "reward", "length", "finish", file === "eval" ? "dataset" : "reason", "prompt", "response"], rows,
      { numeric: ["step", "group", "reward", "length"], class: "results" }));
}

async function comparePage(gen, params) {
  const { runs } = await api("/api/runs");
  const asked = Object.fromEntries(["a", "b", "step_a", "step_b", "dataset", "sort", "offset"].map((k) => [k, params.get(k)]));
  const data = await api("/api/compare", { ...asked, limit: 50 });
  setCrumbs(["runs", "#/"], ["compare", null]);
  const go = (changes) => { location.hash = "#/compare" + query({ ...asked, ...changes }); };
  const runSelect = (side) => h("select", { id: `run-${side}`, onchange: (e) => go({ [side]: e.target.value, [`step_${side}`]: null, offset: null }) },
    runs.map((r) => h("option", { value: r.id, selected: data[side].run === r.id }, r.name)));
  const stepSelect = (side) => h("select", { id: `step-${side}`, onchange: (e) => go({ [`step_${side}`]: e.target.value, offset: null }) },
    data[side].steps.map((st) => h("option", { value: st, selected: data[side].step === st }, st < 0 ? "before training" : `after step ${st}`)));
  const rows = [];
  for (const r of data.rows) {
    const detail = h("tr", { hidden: true }, h("td", { colspan: 5 }));
    const line = h("tr", { class: "link", dataset: { key: r.key }, onclick: async () => {
      detail.hidden = !detail.hidden;
      if (detail.hidden || detail.dataset.loaded) return;
      detail.dataset.loaded = "1";
      const side = async (runId, lines) => Promise.all(lines.map((n) => api(`/api/runs/${runId}/samples/eval/${n}`)));
      const [left, right] = await Promise.all([side(data.a.run, r.a.lines), side(data.b.run, r.b.lines)]);
      const column = (runId, samples) => h("div", {}, samples.map((smp) => h("div", { class: "message" },
        h("div", { class: "role" }, h("a", { href: sampleHref(runId, "eval", smp.n) }, `reward ${fmt(smp.values.reward)}`)),
        h("div", { class: "text" }, smp.row ? smp.row.response : "(damaged line)"))));
      detail.firstChild.replaceChildren(h("div", { class: "sidebyside" },
        h("div", {}, h("h3", {}, `A: ${data.a.name}`), column(data.a.run, left)),
        h("div", {}, h("h3", {}, `B: ${data.b.name}`), column(data.b.run, right))));
    } },
      h("td", {}, h("div", { class: "muted" }, r.prompt)), h("td", {}, r.label),
      h("td", { class: "num" }, num(r.a.mean)), h("td", { class: "num" }, num(r.b.mean)), h("td", { class: "num" }, num(r.delta)));
    rows.push(line, detail);
  }
  const offset = Number(asked.offset || 0);
  show(gen, "compare", h("h1", {}, "Two evals, prompt by prompt"),
    h("div", { class: "controls" }, h("label", {}, "A "), runSelect("a"), stepSelect("a"), h("label", {}, "B "), runSelect("b"), stepSelect("b"),
      h("label", {}, "dataset "), h("select", { id: "dataset", onchange: (e) => go({ dataset: e.target.value, offset: null }) },
        data.datasets.map((d) => h("option", { value: d, selected: d === data.dataset }, d))),
      h("label", {}, "sort "), h("select", { id: "sort", onchange: (e) => go({ sort: e.target.value, offset: null }) },
        [["delta", "B worse first"], ["-delta", "B better first"], ["order", "prompt order"]].map(([k, label]) =>
          h("option", { value: k, selected: (asked.sort || "delta") === k }, label)))),
    h("div", { class: "cards", id: "compare-summary" }, card("prompts in both", num(data.total)), card("mean A", num(data.mean_a)),
      card("mean B", num(data.mean_b)), card("B better", num(data.better)), card("B worse", num(data.worse)), card("same", num(data.same)),
      data.only_a || data.only_b ? card("only in A / B", `${data.only_a} / ${data.only_b}`) : null),
    h("p", { class: "muted" }, "Click a prompt for both sides' responses."),
    h("div", { class: "pager" },
      offset > 0 ? h("button", { onclick: () => go({ offset: Math.max(0, offset - 50) || null }) }, "previous 50") : null,
      offset + 50 < data.total ? h("button", { onclick: () => go({ offset: offset + 50 }) }, "next 50") : null),
    table(["prompt", "label", "A", "B", "B − A"], rows, { numeric: ["A", "B", "B − A"], class: "compare" }));
}

// ------------------------------------------------------------------ routing and live updates

function startPolling(gen, poll) {
  live.replaceChildren(h("span", { class: "badge running" }, "● live"));
  poller = setInterval(async () => {
    if (gen !== generation) return;
    try {
      if ((await poll()) === false) stopPolling();
    } catch (e) { live.replaceChildren(h("span", { class: "badge stopped", title: String(e.message) }, "live: server not answering")); }
  }, POLL_MS);
}

function stopPolling() {
  if (poller !== null) clearInterval(poller);
  poller = null;
  live.replaceChildren();
}

async function route() {
  const gen = ++generation;
  routed = location.hash;
  stopPolling();
  delete main.dataset.ready;
  delete main.dataset.readyAt;
  const [path, qs] = (location.hash.slice(1) || "/").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(qs || "");
  try {
    if (!parts.length) await runsPage(gen);
    else if (parts[0] === "compare") await comparePage(gen, params);
    else if (parts[0] === "run" && parts.length === 2) await runPage(gen, parts[1]);
    else if (parts[0] === "run" && parts[2] === "step" && parts.length === 4) await stepPage(gen, parts[1], parts[3]);
    else if (parts[0] === "run" && parts[2] === "samples") await samplesPage(gen, parts[1], params);
    else if (parts[0] === "run" && parts[2] === "sample" && parts.length === 5) await samplePage(gen, parts[1], parts[3], parts[4]);
    else show(gen, "error", h("p", { class: "error" }, `no such page: ${location.hash}`), h("a", { href: "#/" }, "all runs"));
  } catch (e) {
    show(gen, "error", h("p", { class: "error" }, e.message), h("a", { href: "#/" }, "all runs"));
  }
  if (gen === generation) window.scrollTo(0, 0);
}

window.addEventListener("hashchange", route);
route();
