// The Vigil console: every call goes to the public API (docs/service.md) with the bearer
// token the user signed in with, kept in this tab's sessionStorage. Data from the server is
// put on the page as text (textContent), never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { token: sessionStorage.getItem("vigil-token"), scope: null, rows: [],
                sort: { key: "name", dir: 1 }, stream: null, cursor: null, checkTimer: null,
                checkSeq: 0 };

// ------------------------------------------------------------------ the API

async function api(method, path, { body, type, raw } = {}) {
  const headers = { Authorization: "Bearer " + state.token };
  if (body !== undefined) headers["Content-Type"] = type || "text/plain; charset=utf-8";
  const answer = await fetch(path, { method, headers, body });
  if (answer.status === 401) { signOut("The token is unknown or revoked."); }
  if (raw) return answer;
  const data = await answer.json().catch(() => ({}));
  if (!answer.ok) {
    const error = new Error(data.detail || data.title || answer.statusText);
    error.problem = data;
    error.status = answer.status;
    throw error;
  }
  return data;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function say(node, text, ok) {
  node.textContent = text;
  node.className = ok ? "ok" : "error";
}

// ------------------------------------------------------------------ signing in

async function signIn(token) {
  state.token = token;
  const status = await api("GET", "/status");
  state.scope = status.scope;
  sessionStorage.setItem("vigil-token", token);
  $("who").textContent = `${status.token} (${status.scope}) · registry v${status.registry_version}`;
  $("login").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = false;
  await refresh();
  follow();
}

function signOut(message) {
  sessionStorage.removeItem("vigil-token");
  state.token = null;
  if (state.stream) state.stream.abort();
  state.cursor = null;  // the next sign-in starts the list again
  $("matches").replaceChildren();
  $("app").hidden = true;
  $("signout").hidden = true;
  $("login").hidden = false;
  $("who").textContent = "";
  $("login-error").textContent = message || "";
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    await signIn($("token").value.trim());
    $("token").value = "";
  } catch (error) {
    signOut(error.status === 401 ? "The token is unknown or revoked." : error.message);
  }
});
$("signout").addEventListener("click", () => signOut());
$("alerts-refresh").addEventListener("click", () => loadAlerts());

// ------------------------------------------------------------------ tabs

const tabs = [...document.querySelectorAll("[role=tab]")];
function showTab(tab) {
  for (const t of tabs) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute("aria-controls")).hidden = !on;
  }
  tab.focus();
  if (tab.id === "tab-alerts") loadAlerts();
  if (tab.id === "tab-queries") refresh();
}
tabs.forEach((tab, i) => {
  tab.addEventListener("click", () => showTab(tab));
  tab.addEventListener("keydown", (event) => {
    const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
    if (step) showTab(tabs[(i + step + tabs.length) % tabs.length]);
    if (event.key === "Home") showTab(tabs[0]);
    if (event.key === "End") showTab(tabs[tabs.length - 1]);
  });
});

// ------------------------------------------------------------------ standing queries

async function refresh() {
  const data = await api("GET", "/overview");
  state.rows = data.queries;
  $("as-of").textContent = data.as_of ? `(matches counted back from ${data.as_of})` : "";
  drawTable();
  drawCharts(state.rows.filter((r) => r.kind === "metric"));
}

function cell(value) {
  if (Array.isArray(value)) return value.join(", ");
  return value === null || value === undefined ? "" : String(value);
}

function drawTable() {
  const needle = $("filter").value.trim().toLowerCase();
  const { key, dir } = state.sort;
  const rows = state.rows
    .filter((r) => !needle || [r.name, r.kind, cell(r.streams), r.severity, cell(r.notify)]
      .some((v) => v.toLowerCase().includes(needle)))
    .sort((a, b) => {
      const x = cell(a[key]), y = cell(b[key]);
      const n = typeof a[key] === "number" ? a[key] - b[key] : x.localeCompare(y);
      return n * dir;
    });
  const body = $("query-table").tBodies[0];
  body.replaceChildren(...rows.map((r) => el("tr", { "data-name": r.name },
    el("td", {}, el("button", { type: "button", text: r.name, "aria-label": `Edit ${r.name}`,
                               onclick: () => openEditor(r.name) })),
    el("td", { text: r.kind }), el("td", { text: cell(r.streams) }),
    el("td", { text: cell(r.version) }), el("td", { text: cell(r.matches_hour) }),
    el("td", { text: cell(r.matches_day) }), el("td", { text: cell(r.last_match) }),
    el("td", { text: r.severity, class: "sev-" + r.severity }),
    el("td", { text: cell(r.notify) }))));
  for (const th of document.querySelectorAll("#query-table th")) {
    th.setAttribute("aria-sort", th.dataset.key === key
      ? (dir > 0 ? "ascending" : "descending") : "none");
  }
}

$("filter").addEventListener("input", drawTable);
$("refresh").addEventListener("click", refresh);
for (const th of document.querySelectorAll("#query-table th")) {
  th.querySelector("button").addEventListener("click", () => {
    const key = th.dataset.key;
    state.sort = { key, dir: state.sort.key === key ? -state.sort.dir : 1 };
    drawTable();
  });
}
$("new-query").addEventListener("click", () => openEditor(null));

// A small time-series chart per metric and numeric value (up to four): each window's value
// at the window's end, over the metric's newest windows; a keyed metric draws a line per key
// (the four keys with the most windows). A window reported again (a correction) counts once,
// with its last value.
const CHART_FIELDS = 4, CHART_KEYS = 4, CHART_WINDOWS = 200;
const CHART_COLOURS = ["#0b5cad", "#b3261e", "#1e6b34", "#7b2a9a"];

async function drawCharts(metrics) {
  const figures = [];
  for (const metric of metrics) {
    const page = await api("GET", `/matches/newest?name=${encodeURIComponent(metric.name)}` +
                                  "&limit=1000");
    const windows = new Map();
    for (const m of page.matches) {
      windows.set(JSON.stringify([m.key || {}, m.window ? m.window.start : m.start]), m);
    }
    const fields = new Map();  // field -> key label -> points
    for (const m of windows.values()) {
      const label = keyLabel(m.key);
      for (const [field, value] of Object.entries(m.values || {})) {
        if (typeof value !== "number" || !Number.isFinite(value)) continue;
        if (!fields.has(field)) {
          if (fields.size >= CHART_FIELDS) continue;
          fields.set(field, new Map());
        }
        const lines = fields.get(field);
        if (!lines.has(label)) lines.set(label, []);
        lines.get(label).push({ t: Date.parse(m.end), v: value, end: m.end });
      }
    }
    for (const [field, lines] of fields) {
      const chosen = [...lines.entries()].sort((a, b) => b[1].length - a[1].length)
        .slice(0, CHART_KEYS)
        .map(([label, points]) => [label, points.sort((p, q) => p.t - q.t).slice(-CHART_WINDOWS)]);
      figures.push(chart(metric.name, field, chosen));
    }
  }
  $("charts").replaceChildren(...(figures.length ? figures
    : [el("p", { class: "help", text: "No metric has reported a window yet." })]));
}

function keyLabel(key) {
  return Object.entries(key || {}).map(([k, v]) => `${k}=${cell(v)}`).join(", ");
}

function short(value) {
  return Number(value.toPrecision(4)).toLocaleString("en");
}

function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function chart(name, field, lines) {
  const W = 360, H = 140, P = 24, L = 48;
  const points = lines.flatMap(([, pts]) => pts);
  const ts = points.map((p) => p.t), vs = points.map((p) => p.v);
  const t0 = Math.min(...ts), t1 = Math.max(...ts), v0 = Math.min(0, ...vs), v1 = Math.max(...vs);
  const x = (t) => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5) * (W - L - P);
  const y = (v) => H - P - (v1 > v0 ? (v - v0) / (v1 - v0) : 0.5) * (H - 2 * P);
  const windows = Math.max(...lines.map(([, pts]) => pts.length));
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
  svg.append(svgEl("title", {}, `${name}: ${field} over ${windows} window(s)` +
    (lines.length > 1 ? ` for ${lines.length} keys` : "") + `, from ${short(v0)} to ${short(v1)}`));
  svg.append(svgEl("path", { d: `M${L} ${P / 2}V${H - P}H${W - P / 2}`, stroke: "#5a6270",
                             fill: "none" }));
  lines.forEach(([label, pts], i) => {
    svg.append(svgEl("polyline", {
      points: pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" "),
      fill: "none", stroke: CHART_COLOURS[i % CHART_COLOURS.length], "stroke-width": 2,
      "data-key": label }));
    if (pts.length === 1) {
      svg.append(svgEl("circle", { cx: x(pts[0].t).toFixed(1), cy: y(pts[0].v).toFixed(1), r: 3,
                                   fill: CHART_COLOURS[i % CHART_COLOURS.length] }));
    }
  });
  for (const [v, at] of [[v1, y(v1)], [v0, y(v0)]]) {
    svg.append(svgEl("text", { x: L - 4, y: at + 4, "font-size": 10, "text-anchor": "end" },
                     short(v)));
  }
  const first = points.find((p) => p.t === t0), last = points.find((p) => p.t === t1);
  svg.append(svgEl("text", { x: L, y: H - 6, "font-size": 10 }, clock(first.end)));
  svg.append(svgEl("text", { x: W - P / 2, y: H - 6, "font-size": 10, "text-anchor": "end" },
                   clock(last.end)));
  let legend = null;
  if (lines.length > 1 || lines[0][0]) {
    legend = el("ul", { class: "legend", "aria-label": "Keys" });
    lines.forEach(([label], i) => {
      const item = el("li", { text: label || "(no key)" });
      // A CSSOM property, not a style attribute: the page's policy refuses inline styles.
      item.style.setProperty("--swatch", CHART_COLOURS[i % CHART_COLOURS.length]);
      legend.append(item);
    });
  }
  return el("figure", { "data-metric": name, "data-field": field }, svg,
    el("figcaption", { text: `${name} · ${field} · ${windows} window(s) to ${last.end}` }),
    legend);
}

// An ISO time as the chart's axis shows it: the day and the minute, or the second within it.
function clock(iso) {
  const [day, time] = iso.split("T");
  return `${day.slice(5)} ${time.slice(0, time.endsWith(":00.000Z") ? 5 : 8)}`;
}

// ------------------------------------------------------------------ the editor

const source = $("source");

async function openEditor(name) {
  showTab($("tab-editor"));
  $("history").hidden = true;
  $("automaton").hidden = true;
  $("save-result").textContent = "";
  $("try-result").replaceChildren();
  describeRecent();
  if (name) {
    const one = await api("GET", `/queries/${encodeURIComponent(name)}`);
    $("name").value = one.name;
    source.value = one.text || "";
  } else {
    $("name").value = "";
    source.value = "";
  }
  redraw(new Map());
  scheduleCheck();
  (name ? source : $("name")).focus();
}

function redraw(bad) {
  vigilHighlight($("highlight"), source.value, bad);
  syncScroll();
}
function syncScroll() {
  $("highlight").scrollTop = source.scrollTop;
  $("highlight").scrollLeft = source.scrollLeft;
}
source.addEventListener("scroll", syncScroll);
source.addEventListener("input", () => { redraw(state.bad || new Map()); scheduleCheck(); });

function scheduleCheck() {
  clearTimeout(state.checkTimer);
  state.checkTimer = setTimeout(check, 250);
}

async function check() {
  const seq = ++state.checkSeq;
  const text = source.value;
  const list = $("problems");
  if (!text.trim()) { list.replaceChildren(); state.bad = new Map(); redraw(state.bad); return; }
  let errors = [];
  try {
    await api("POST", "/check", { body: text });
  } catch (error) {
    errors = (error.problem && error.problem.errors) || [{ message: error.message }];
  }
  if (seq !== state.checkSeq) return;  // a newer check is on its way
  state.bad = new Map();
  for (const e of errors) {
    if (e.line && !state.bad.has(e.line)) state.bad.set(e.line, e);  // the first of a line
  }
  list.replaceChildren(...errors.map((e) => el("li", {
    text: e.line ? `line ${e.line}, column ${e.column}: ${e.message}` : e.message })));
  if (!errors.length) list.append(el("li", { class: "ok", text: "No problems." }));
  redraw(state.bad);
}

$("save").addEventListener("click", async () => {
  const name = $("name").value.trim();
  const out = $("save-result");
  if (!name) { say(out, "Give the name it defines.", false); $("name").focus(); return; }
  try {
    const answer = await api("PUT", `/queries/${encodeURIComponent(name)}`,
                             { body: source.value });
    say(out, `Saved ${answer.name}: ${answer.status}, version ${answer.version}.`, true);
    await refresh();
  } catch (error) {
    const where = ((error.problem && error.problem.errors) || [])
      .map((e) => ` line ${e.line}, column ${e.column}: ${e.message}`).join(";");
    say(out, `Not saved (${error.status}): ${error.message}${where ? " —" + where : ""}`, false);
  }
});

// ------------------------------------------------------------------ history and diff

$("show-history").addEventListener("click", async () => {
  const name = $("name").value.trim();
  const section = $("history");
  section.hidden = false;
  try {
    const data = await api("GET", `/queries/${encodeURIComponent(name)}/history`);
    state.history = data.history;
  } catch (error) {
    state.history = [];
    $("versions").replaceChildren(el("li", { class: "error", text: error.message }));
    return;
  }
  $("versions").replaceChildren(...state.history.map((h) => el("li", {
    text: `v${h.version} · ${h.at} · ${h.author} · ${h.removed ? "removed" : h.summary}` })));
  for (const id of ["diff-from", "diff-to"]) {
    $(id).replaceChildren(...state.history.map((h) => el("option", {
      value: String(h.version), text: `v${h.version}` })));
  }
  const n = state.history.length;
  $("diff-from").selectedIndex = Math.max(0, n - 2);
  $("diff-to").selectedIndex = n - 1;
  drawDiff();
  section.querySelector("h2").scrollIntoView();
});
$("diff-from").addEventListener("change", drawDiff);
$("diff-to").addEventListener("change", drawDiff);

function drawDiff() {
  const pick = (id) => state.history.find((h) => String(h.version) === $(id).value);
  const a = pick("diff-from"), b = pick("diff-to");
  if (!a || !b) return;
  const lines = diffLines((a.text || "").split("\n"), (b.text || "").split("\n"));
  $("diff").replaceChildren(...lines.map(([sign, text]) => el("span", {
    class: sign === "+" ? "add" : sign === "-" ? "del" : "",
    text: `${sign} ${text}\n` })));
}

// Line diff by longest common subsequence (programs are small).
function diffLines(a, b) {
  const n = a.length, m = b.length;
  const L = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      L[i][j] = a[i] === b[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    }
  }
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { out.push([" ", a[i]]); i++; j++; }
    else if (L[i + 1][j] >= L[i][j + 1]) out.push(["-", a[i++]]);
    else out.push(["+", b[j++]]);
  }
  while (i < n) out.push(["-", a[i++]]);
  while (j < m) out.push(["+", b[j++]]);
  return out;
}

// ------------------------------------------------------------------ the automaton

$("show-automaton").addEventListener("click", async () => {
  const name = $("name").value.trim();
  const section = $("automaton"), img = $("automaton-img"), error = $("automaton-error");
  section.hidden = false;
  error.textContent = "";
  img.hidden = true;
  const answer = await api("GET", `/queries/${encodeURIComponent(name)}/automaton.svg`,
                           { raw: true });
  if (!answer.ok) {
    const problem = await answer.json().catch(() => ({}));
    error.textContent = `${problem.title || answer.statusText}: ${problem.detail || ""}`;
    return;
  }
  const blob = await answer.blob();
  if (img.src) URL.revokeObjectURL(img.src);
  img.src = URL.createObjectURL(blob);
  img.alt = `The compiled automaton of rule ${name}: states and the conditions between them`;
  img.hidden = false;
  section.querySelector("h2").scrollIntoView();
});

// ------------------------------------------------------------------ try it

$("try-events").addEventListener("input", () => { $("try-pasted").checked = true; });

$("try-run").addEventListener("click", async () => {
  const out = $("try-result");
  const pasted = $("try-pasted").checked;
  const spec = { text: source.value, last: Number($("try-last").value || 0),
                 events: pasted ? $("try-events").value : null,
                 stream: pasted && $("try-stream").value.trim() ? $("try-stream").value.trim()
                   : null };
  out.replaceChildren(el("p", { text: "Running…" }));
  let data;
  try {
    data = await api("POST", "/try", { body: JSON.stringify(spec), type: "application/json" });
  } catch (error) {
    const where = ((error.problem && error.problem.errors) || [])
      .map((e) => `line ${e.line}, column ${e.column}: ${e.message}`);
    out.replaceChildren(el("p", { class: "error", text: error.message }),
                        ...where.map((w) => el("p", { class: "error", text: w })));
    return;
  }
  const parts = [el("p", { text: `${data.matches.length} match(es) over ${data.events} ` +
    `${data.source} event(s); ${data.dead_letters.length} dead letter(s).` })];
  if (data.matches.length) {
    parts.push(el("ol", { class: "try-matches" }, ...data.matches.map((m) => el("li", {},
      el("details", {}, el("summary", { text: `${m.name} · ${m.end}` +
        (m.values ? " · " + JSON.stringify(m.values) : "") }),
      el("pre", { text: JSON.stringify(m, null, 2) }))))));
  }
  for (const x of data.explain) {
    parts.push(el("div", { class: "explain" },
      el("h3", { text: `Query ${x.query} on event ${x.event + 1}: ` +
        (x.matched ? "matches" : "no match") }),
      fieldList(x.document, x.highlights || {}, "The document, highlights marked"),
      el("pre", { text: x.error || x.explain })));
  }
  const note = data.recent ? emptyRecent(data.recent) : null;
  if (note) parts.splice(1, 0, el("p", { class: "notice", text: note }));
  out.replaceChildren(...parts);
});

// Why a trial over the recent events had none of a stream, or null when each had some.
function emptyRecent(recent) {
  if (!recent.size) return "This service keeps no recent events: paste events to try the text.";
  const names = Object.keys(recent.streams);
  if (!names.length) return "The text reads no stream: there are no recent events to try it on.";
  const empty = names.filter((name) => !recent.streams[name]);
  if (!empty.length) return null;
  const them = empty.length > 1 ? "them" : "it";
  return `No recent events of ${empty.join(", ")}: ` + (recent.persistent
    ? `none has been posted to ${them} through this service (it keeps the last ${recent.size} ` +
      "events of each stream in its state directory, across restarts)."
    : `none has been posted to ${them} since the service started (it keeps the last ` +
      `${recent.size} events of each stream in memory only: a restart empties them).`) +
    " Post events to the stream, or paste some here.";
}

// What the service keeps to try a text on, said next to the choice.
async function describeRecent() {
  const out = $("try-kept");
  let info;
  try {
    info = await api("GET", "/events/recent");
  } catch (error) {
    out.textContent = error.message;
    return;
  }
  const counts = Object.entries(info.streams).map(([name, n]) => `${name} ${n}`);
  if (!info.size) {
    out.textContent = "This service keeps no recent events: paste some to try a text.";
  } else if (!counts.length) {
    out.textContent = "The service keeps no recent events yet: none has been posted " +
      (info.persistent ? "through it." : "since it started (it keeps them in memory only).");
  } else {
    out.textContent = `Kept by the service (the last ${info.size} of each stream` +
      (info.persistent ? ", across restarts" : ", in memory only") +
      (info.restored ? `; ${info.restored} read back when it started` : "") +
      `): ${counts.join(", ")}.`;
  }
}

// An event's or a document's fields, one a line, the highlighted spans of each marked
// (highlights: field -> [start, end) character ranges of its value).
function fieldList(doc, highlights, label) {
  const box = el("div", { class: "doc", role: "group", "aria-label": label });
  for (const [field, value] of Object.entries(doc)) {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    const line = el("div", { "data-field": field }, el("strong", { text: field + ": " }));
    let at = 0;
    const spans = (highlights[field] || []).slice().sort((p, q) => p[0] - q[0]);
    for (const [start, end] of spans) {
      if (start < at) continue;
      line.append(text.slice(at, start), el("mark", { text: text.slice(start, end) }));
      at = end;
    }
    line.append(text.slice(at));
    box.append(line);
  }
  return box;
}

// ------------------------------------------------------------------ live matches

const LIVE_FIRST = 20;  // matches shown on connecting, before those that come
const LIVE_KEPT = 500;  // matches the list keeps

// EventSource cannot send the Authorization header: the stream is read with fetch.
async function follow() {
  if (state.stream) state.stream.abort();
  const control = new AbortController();
  state.stream = control;
  const label = $("live-state");
  while (!control.signal.aborted && state.token) {
    try {
      if (state.cursor === null) {  // first the newest ones, then what comes after them
        const page = await api("GET", `/matches/newest?limit=${LIVE_FIRST}`);
        page.matches.forEach(showMatch);
        state.cursor = page.next;
      }
      const answer = await fetch(`/matches/stream?after=${state.cursor}`, {
        headers: { Authorization: "Bearer " + state.token, Accept: "text/event-stream" },
        signal: control.signal });
      if (!answer.ok) throw new Error(`${answer.status} ${answer.statusText}`);
      label.textContent = "Following matches as they happen.";
      label.dataset.connected = "true";
      const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          onEvent(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
    } catch (error) {
      if (control.signal.aborted) return;
      label.textContent = `Disconnected (${error.message}); trying again.`;
    }
    label.dataset.connected = "false";
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

function onEvent(block) {
  const fields = {};
  for (const line of block.split("\n")) {
    const at = line.indexOf(":");
    if (at <= 0) continue;
    fields[line.slice(0, at)] = (fields[line.slice(0, at)] || "") + line.slice(at + 1).trim();
  }
  if (fields.event !== "match" || !fields.data) return;
  const match = JSON.parse(fields.data);
  state.cursor = match.cursor;
  showMatch(match);
  // The table's counts and the metric charts follow, while they are on the screen.
  if (!$("queries").hidden) {
    clearTimeout(state.refreshTimer);
    state.refreshTimer = setTimeout(() => { if (state.token) refresh(); }, 1500);
  }
}

function showMatch(match) {
  const body = el("div", { class: "match-body" });
  const details = el("details", {},
    el("summary", { text: `${match.name} (${match.kind}) · ${match.end} · severity ` +
      `${match.severity}` + summaryOf(match) }),
    body);
  details.addEventListener("toggle", () => {
    if (details.open && !body.dataset.loaded) expandMatch(match, body);
  });
  const list = $("matches");
  list.prepend(el("li", { "data-name": match.name, "data-kind": match.kind || "" }, details));
  while (list.children.length > LIVE_KEPT) list.lastElementChild.remove();
}

function summaryOf(match) {
  if (match.values) return " · " + JSON.stringify(match.values);
  if (match.kind === "query") return ` · document ${match.document_id} of ${match.stream}`;
  return "";
}

// What a match is about, readable: a query's document with its matched terms marked, a
// rule's events by pattern variable, a metric's window and values; then the whole record.
async function expandMatch(match, box) {
  box.dataset.loaded = "true";
  if (match.kind === "query") {
    await showDocument(match, box);
  } else if (match.events) {
    const events = el("ol", { class: "match-events", "aria-label": "The match's events" });
    box.append(events);
    await loadMatchEvents(match.events, events);
  } else if (match.values) {
    const span = match.window ? { window: `${match.window.start} to ${match.window.end}` } : {};
    box.append(fieldList({ ...span, ...(match.key || {}), ...match.values }, {},
                         "The window's values"));
  }
  box.append(el("details", { class: "raw" },
    el("summary", { text: "The match record (JSON)" }),
    el("pre", { text: JSON.stringify(match, null, 2) })));
}

// A query's match carries the document it matched (the service's match log keeps it with
// the match); one too large to copy is looked up among the events the service keeps.
async function showDocument(match, box) {
  let doc = match.document;
  if (doc === undefined && match.document_position !== undefined) {
    try {
      const data = await api("GET", `/events/recent?positions=${match.document_position}`);
      if (data.events.length) doc = data.events[0].event;
    } catch (error) {
      box.append(el("p", { class: "error", text: error.message }));
    }
  }
  if (doc === undefined) {
    box.append(el("p", { class: "help", text: match.document_position !== undefined
      ? "The document was too large to keep with the match, and the service no longer keeps it."
      : "The match record holds no document (it was logged before the service kept them)." }));
    return;
  }
  const marked = Object.keys(match.highlights || {});
  box.append(el("p", { class: "help", text: `Document ${match.document_id} of stream ` +
    `${match.stream}` + (marked.length ? `; what matched is marked in ${marked.join(", ")}.`
      : ".") }), fieldList(doc, match.highlights || {}, "The document, what matched marked"));
}

// A rule match names its events by variable and arrival position; the service keeps the
// last events of each stream (GET /events/recent), older ones are said to be gone.
async function loadMatchEvents(byVariable, box) {
  const wanted = Object.entries(byVariable).flatMap(([v, at]) => at.map((p) => [v, p]));
  const positions = [...new Set(wanted.map(([, p]) => p))];
  const found = {};
  try {
    for (let i = 0; i < positions.length; i += 1000) {  // a page of positions at a time
      const data = await api("GET", "/events/recent?positions=" +
                                    positions.slice(i, i + 1000).join(","));
      for (const e of data.events) found[e.position] = e;
    }
  } catch (error) {
    box.append(el("li", { class: "error", text: error.message }));
  }
  for (const [variable, position] of wanted) {
    const kept = found[position];
    box.append(el("li", { "data-position": String(position) },
      el("strong", { text: `${variable} #${position}` + (kept ? ` (${kept.stream})` : "") }),
      kept ? fieldList(kept.event, {}, `Event ${position}`)
        : el("span", { class: "help", text: ": no longer kept by the service" })));
  }
}

// ------------------------------------------------------------------ alerts

async function loadAlerts() {
  const data = await api("GET", "/alerts");
  $("alert-totals").textContent = `(enqueued ${data.enqueued}, throttled ${data.throttled}, ` +
    `unsent ${data.unsent})`;
  $("alert-secrets").textContent = data.secrets_not_set.length
    ? `The service's environment lacks the secret of ${data.secrets_not_set.join(", ")}: ` +
      "their alerts are counted, not delivered." : "";
  $("alert-table").tBodies[0].replaceChildren(...data.endpoints.map((e) => el("tr", {
    "data-endpoint": e.endpoint },
    el("td", { text: e.endpoint + (e.endpoint_disabled ? " (disabled)" : "") }),
    el("td", { text: e.url }), el("td", { text: e.pending }),
    el("td", { text: e.delivered }), el("td", { text: e.failed }),
    el("td", { text: e.disabled }),
    // No breaker yet: nothing was sent to the endpoint since the service started.
    el("td", { text: e.breaker || "none yet", class: "breaker-" + (e.breaker || "none") }),
    el("td", {}, el("button", { type: "button", text: "Replay",
      "aria-label": `Replay the alerts of ${e.endpoint}`,
      onclick: () => replay(e.endpoint) })))));
}

async function replay(endpoint) {
  try {
    const answer = await api("POST", `/alerts/replay?endpoint=${encodeURIComponent(endpoint)}`);
    say($("alert-result"), `${answer.replayed} alert(s) of ${endpoint} queued again.`, true);
  } catch (error) {
    say($("alert-result"), `Not replayed (${error.status}): ${error.message}`, false);
  }
  loadAlerts();
}

// ------------------------------------------------------------------ start

if (state.token) signIn(state.token).catch(() => signOut());
