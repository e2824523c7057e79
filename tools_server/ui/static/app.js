// The ctproxy dashboard: live requests, tool calls, capabilities, tasks → agents → sessions → windows, and
// a session's context plot. Plain ES modules, no build step; data only ever goes into text nodes.
import { bytes, el, events, get, ms, time, when } from "./api.js";
import { renderPlot } from "./plot.js";

const MAX_ROWS = 200;
const state = { requests: [], calls: [], lastRequest: 0, source: null, selected: null };
const main = document.getElementById("main");

function statusCell(r) {
  const text = r.status ?? r.error ?? "error";
  return el("td", { class: r.status && r.status < 400 ? "status-ok" : "status-err" }, text);
}

function requestRow(r) {
  const row = el("tr", { class: "clickable request", dataset: { id: r.id, path: r.path, status: r.status ?? "" },
    onclick: () => { state.selected = r.id; showRequest(r); } },
    el("td", {}, time(r.at)), el("td", {}, r.method), el("td", {}, r.path), el("td", {}, r.model ?? "—"),
    statusCell(r), el("td", { class: "num" }, ms(r.ms)), el("td", { class: "num" }, ms(r.ttfb_ms)),
    el("td", { class: "num" }, bytes(r.bytes_in)), el("td", { class: "num" }, bytes(r.bytes_out)),
    el("td", {}, r.stream ? "stream" : "buffered"),
    el("td", {}, r.stages.length ? r.stages.map((s) => el("span", { class: "stage" }, s)) : el("span", { class: "muted" }, "none")),
    el("td", {}, r.session ? el("a", { href: `#/session/${encodeURIComponent(r.session)}` }, r.session.slice(0, 12)) : "—"));
  return row;
}

function showRequest(r) {
  const box = document.getElementById("request-detail");
  if (!box) return;
  box.replaceChildren(el("h2", {}, `request ${r.id}: ${r.method} ${r.path}`),
    el("p", {}, "What each stage did to this request:"),
    el("ul", {}, r.stages.length ? r.stages.map((s) => el("li", {}, stageText(s))) : el("li", { class: "muted" }, "passed through untouched")),
    r.diff ? el("button", { id: "show-diff", onclick: () => showDiff(r.id) }, "show what the chain changed in the body")
      : el("p", { class: "muted" }, "the body diff is not kept for this request (large, or not a Responses call)"),
    el("pre", { id: "request-diff", hidden: "" }),
    el("pre", {}, JSON.stringify(r, null, 2)));
}

async function showDiff(id) {
  const box = document.getElementById("request-diff");
  box.hidden = false;
  box.textContent = "…";
  try {
    const data = await get(`/ui/api/requests/${id}/diff`);
    box.textContent = data.lines.length ? data.lines.join("\n") : "(the chain did not change the body)";
  } catch (err) {
    box.textContent = String(err.message ?? err);
  }
}

function stageText(s) {
  const [what, ...rest] = s.split(":");
  const words = { web_search: "injected the hosted web_search tool", window: "projected the window",
    compaction: "compacted", held: "held the answer for a possible overflow recovery", body: "body limit",
    bridge: "bridged tool rounds" };
  return `${words[what] ?? what}${rest.length ? ` (${rest.join(", ")})` : ""}`;
}

function requestsSection() {
  const body = el("tbody", { id: "requests-body" }, [...state.requests].reverse().map(requestRow));
  return el("section", { id: "requests" }, el("h2", {}, "live requests"),
    el("table", {}, el("thead", {}, el("tr", {}, ["time", "method", "path", "model", "status", "duration", "TTFB",
      "in", "out", "answer", "stages", "session"].map((h) => el("th", {}, h)))), body),
    el("div", { id: "request-detail", class: "muted" }, "click a request to see what each stage did"));
}

function callRow(c) {
  return el("tr", { class: "toolcall", dataset: { name: c.name, outcome: c.outcome } }, el("td", {}, time(c.at)),
    el("td", {}, c.name), el("td", {}, c.transport), el("td", { class: "num" }, ms(c.ms)),
    el("td", { class: c.outcome === "ok" ? "status-ok" : "status-err" }, c.outcome),
    el("td", { class: "wrap" }, c.error ?? ""));
}

async function toolsSection() {
  const data = await get("/ui/api/tools");
  state.calls = data.calls;
  return el("section", { id: "tools" }, el("h2", {}, "tool calls (bridged, MCP, REST)"),
    el("table", {}, el("thead", {}, el("tr", {}, ["time", "tool", "via", "duration", "outcome", "error"].map((h) => el("th", {}, h)))),
      el("tbody", { id: "calls-body" }, [...data.calls].reverse().map(callRow))),
    el("h2", {}, "running now (shell jobs, code cells)"),
    data.running.length ? el("table", {}, el("tbody", {}, data.running.map((j) => el("tr", {}, el("td", {}, j.kind),
      el("td", {}, j.id), el("td", {}, j.agent ?? ""), el("td", { class: "num" }, `${j.seconds} s`)))))
      : el("p", { class: "muted" }, "nothing running"));
}

async function statusSection() {
  const data = await get("/ui/api/status");
  const sec = el("section", { id: "status" }, el("h2", {}, "capabilities (ctproxy status)"),
    data.proxy ? el("p", {}, `proxy ${data.proxy.proxy} · mode ${data.proxy.mode} · upstream ${data.proxy.upstream}`)
      : el("p", { class: "muted" }, "the proxy is not running (tool server alone)"),
    el("table", {}, el("tbody", {}, data.capabilities.map((c) => el("tr", { dataset: { capability: c.name } },
      el("td", {}, c.name), el("td", { class: `cap-${c.state}` }, c.state), el("td", { class: "wrap" }, c.reason),
      el("td", { class: "wrap muted" }, c.pending ?? ""))))));
  return sec;
}

function taskTree(tasks) {
  return el("div", { class: "tree" }, el("ul", {}, tasks.map((t) => el("li", { class: "task", dataset: { task: t.task_id } },
    el("b", {}, t.label), " ", el("span", { class: "muted" }, `${t.task_id} · ${when(t.last_activity)}`),
    el("ul", {}, t.agents.map((a) => el("li", {}, el("span", {}, a.address),
      el("ul", {}, a.sessions.map((s) => el("li", {},
        el("a", { href: `#/session/${encodeURIComponent(s.session_key)}`, class: "session-link" }, `session ${s.session_key}`),
        el("span", { class: "muted" }, ` via ${s.source ?? "?"} · ${s.items} items · ${s.responses} answers`),
        el("ul", {}, s.windows.map((w) => el("li", { class: "window" },
          `${w.window_id} · ${w.strategy} · ${w.items} items · bootstrap: ${w.bootstrap}`)))))))))))));
}

async function tasksSection(limit) {
  const data = await get(`/ui/api/tasks?limit=${limit}`);
  return el("section", { id: "tasks" }, el("h2", {}, "tasks → agents → sessions → windows"),
    data.data.length ? taskTree(data.data) : el("p", { class: "muted" }, "no tasks yet"));
}

async function overview() {
  const [tools, status, tasks] = await Promise.all([toolsSection(), statusSection(), tasksSection(10)]);
  main.replaceChildren(requestsSection(), el("div", { class: "grid2" }, tools, status), tasks);
}

async function sessionView(key) {
  const data = await get(`/ui/api/sessions/${encodeURIComponent(key)}`);
  const s = data.session;
  const plotBox = el("section", { id: "session-plot" }, el("h2", {}, "context use per request"));
  const itemBox = el("div", { id: "item-detail" });
  main.replaceChildren(
    el("section", {}, el("h2", {}, `session ${s.session_key}`),
      el("p", {}, `task ${s.task_id} · agent ${s.agent} · via ${s.source ?? "?"} · ${s.items} items · ${s.responses} answers`),
      el("table", {}, el("thead", {}, el("tr", {}, ["window", "strategy", "items", "from", "bootstrap"].map((h) => el("th", {}, h)))),
        el("tbody", {}, s.windows.map((w) => el("tr", { class: "window-row" }, el("td", {}, w.window_id), el("td", {}, w.strategy),
          el("td", { class: "num" }, w.items), el("td", {}, when(w.created_at)), el("td", { class: "wrap" }, w.bootstrap)))))),
    cacheSection(data.prompt_cache),
    plotBox,
    el("section", {}, el("h2", {}, "items"), el("table", {}, el("thead", {}, el("tr", {}, ["seq", "window", "origin", "role / type", "preview"].map((h) => el("th", {}, h)))),
      el("tbody", {}, data.items.map((i) => el("tr", { class: "clickable item", onclick: () => showItem(i.item_id, itemBox) },
        el("td", { class: "num" }, i.seq), el("td", {}, i.window_id), el("td", {}, i.origin),
        el("td", {}, `${i.role ? i.role + " / " : ""}${i.type}${i.name ? " " + i.name : ""}`), el("td", { class: "wrap" }, i.preview))))),
      itemBox));
  renderPlot(plotBox, data.plot);
}

// What the upstream's prompt cache did for the session and each window (issue 47).
function cacheSection(c) {
  const pct = (v) => (v === null || v === undefined ? "—" : `${(100 * v).toFixed(1)}%`);
  const share = (w) => (w.input_tokens ? w.cached_tokens / w.input_tokens : null);
  return el("section", { id: "session-cache", "data-cached-share": c && c.cached_share !== null ? c.cached_share.toFixed(4) : "" },
    el("h2", {}, "prompt cache"),
    el("p", { class: "cache-summary" }, c && c.requests
      ? `${pct(c.cached_share)} of ${c.input_tokens} input tokens cached over ${c.requests} answers · ${c.misses} misses in a window · ` +
        `${c.prefix_mismatch} reasoning items dropped (prefix_mismatch) · ${c.prewarms} pre-warms (${c.prewarm_tokens} tokens) · ` +
        `~${c.saved_tokens} tokens saved by window changes`
      : "no answers counted yet"),
    el("table", {}, el("thead", {}, el("tr", {}, ["window", "answers", "input", "cached", "misses", "prefix_mismatch", "pre-warms"].map((h) => el("th", {}, h)))),
      el("tbody", {}, (c ? c.windows : []).map((w) => el("tr", { class: "cache-row" }, el("td", {}, w.window_id || "—"),
        el("td", { class: "num" }, w.requests), el("td", { class: "num" }, w.input_tokens), el("td", { class: "num" }, pct(share(w))),
        el("td", { class: "num" }, w.misses), el("td", { class: "num" }, w.prefix_mismatch), el("td", { class: "num" }, w.prewarms))))));
}

async function showItem(id, box) {
  const data = await get(`/ui/api/items/${encodeURIComponent(id)}`);
  box.replaceChildren(el("h2", {}, `item ${id}`), el("pre", {}, JSON.stringify(data.raw, null, 2)));
}

async function route() {
  const hash = location.hash || "#/";
  try {
    if (hash.startsWith("#/session/")) await sessionView(decodeURIComponent(hash.slice(10)));
    else if (hash === "#/tasks") main.replaceChildren(await tasksSection(200));
    else await overview();
  } catch (err) {
    main.replaceChildren(el("section", {}, el("h2", {}, "error"), el("p", {}, String(err.message ?? err))));
  }
}

function onRequest(r) {
  state.lastRequest = Math.max(state.lastRequest, r.id);
  state.requests.push(r);
  if (state.requests.length > MAX_ROWS) state.requests.shift();
  const body = document.getElementById("requests-body");
  if (body) {
    body.prepend(requestRow(r));
    while (body.children.length > MAX_ROWS) body.lastChild.remove();
  }
}

function onToolCall(c) {
  const body = document.getElementById("calls-body");
  if (body) body.prepend(callRow(c));
}

function setLive(on) {
  const badge = document.getElementById("live");
  badge.textContent = on ? "live" : "reconnecting…";
  badge.className = `badge ${on ? "on" : "off"}`;
}

async function start() {
  const initial = await get("/ui/api/requests");
  state.requests = initial.data.slice(-MAX_ROWS);
  state.lastRequest = state.requests.reduce((m, r) => Math.max(m, r.id), 0);
  window.addEventListener("hashchange", route);
  await route();
  state.source = events(state.lastRequest, { request: onRequest, toolcall: onToolCall }, setLive);
  // The capability table is live too: refreshed while the overview is shown.
  setInterval(async () => {
    const old = document.getElementById("status");
    if (old && !document.hidden) old.replaceWith(await statusSection());
  }, 10000);
}

start();
