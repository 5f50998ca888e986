// voltgate status page and playground (docs/status-page.md). No dependencies, no build step.
// Every value from the gateway is inserted as text (textContent / createTextNode), never as HTML.
"use strict";

const KEY_STORE = "voltgate.key";
const POLL_MS = 2000;
const GIB = 1024 ** 3;
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
let timer = null;
let lastModels = [];
let conversation = [];
let controller = null;
let needsKey = false;  // the gateway answered 401: keys are configured
let rendered = {};  // section -> the JSON it was last drawn from: redraw only what changed

function changed(section, data) {
  const json = JSON.stringify(data);
  if (rendered[section] === json) return false;
  rendered[section] = json;
  return true;
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function key() { return sessionStorage.getItem(KEY_STORE); }

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const k = key();
  if (k) h["Authorization"] = "Bearer " + k;
  return h;
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.error) return `${response.status} ${body.error.code || body.error.type}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `HTTP ${response.status}`;
}

const gib = (n) => (n === null || n === undefined ? "–" : (n / GIB).toFixed(2) + " GiB");
const num = (n, digits) => (n === null || n === undefined ? "–" : Number(n).toFixed(digits));
const pct = (r) => (r === null || r === undefined ? "–" : (r * 100).toFixed(0) + " %");
const ms = (s) => (s === null || s === undefined ? "–" : (s * 1000).toFixed(0) + " ms");

// -- access ------------------------------------------------------------------------------------------
function showLogin(message) {
  $("main").hidden = true;
  clearData();
  $("login").hidden = false;
  if (message !== undefined) $("login-error").textContent = message;
  $("signout").hidden = !key();
  $("who").textContent = "";
}

function clearData() {
  for (const id of ["models", "errors"]) $(id).querySelector("tbody").replaceChildren();
  for (const id of ["pools", "refused", "pg-model", "chart-toks", "chart-ttft"]) $(id).replaceChildren();
  lastModels = [];
  rendered = {};
}

async function refresh() {
  if (needsKey && !key()) return;  // no polling while the page waits for a key
  let response;
  try {
    response = await fetch("/ui/api/status", { headers: headers(), cache: "no-store" });
  } catch (err) {
    $("health").textContent = "gateway unreachable";
    return;
  }
  if (response.status === 401) {
    needsKey = true;
    const why = key() ? "That key was refused: " + (await errorText(response)) : undefined;
    if (key()) sessionStorage.removeItem(KEY_STORE);
    showLogin(why);
    return;
  }
  if (!response.ok) { $("health").textContent = await errorText(response); return; }
  render(await response.json());
}

function render(status) {
  $("login").hidden = true;
  $("main").hidden = false;
  $("signout").hidden = status.open_mode;
  $("health").textContent = `gateway ok · v${status.version}` + (status.accepting ? "" : " · shutting down");
  $("who").textContent = status.open_mode ? "open mode (no keys configured)" : `key ${status.key_id}` + (status.admin ? " (admin)" : "");
  document.body.classList.toggle("admin", status.admin);
  changed("models", [status.models, status.refused, status.admin]) && renderModels(status);
  changed("pools", status.pools) && renderPools(status.pools);
  renderChart($("chart-toks"), status.speed, (b) => b.tok_s, "line-toks", 1);
  renderChart($("chart-ttft"), status.speed, (b) => (b.ttft_p50_s === null ? null : b.ttft_p50_s * 1000), "line-ttft", 0);
  $("history-min").textContent = String(Math.round((status.speed.length * status.speed_bin_s) / 60));
  changed("errors", status.errors) && renderErrors(status.errors);
  renderModelChoice(status.models);
}

// -- models ------------------------------------------------------------------------------------------
// A reasoning model's first answer token comes after its thinking: predicted for its default budget.
function ttftCell(m) {
  const td = el("td", "", `${ms(m.predicted_ttft_s)} / ${ms(m.measured_ttft_s)}`);
  if (m.predicted_answer_s !== null) {
    td.append(el("span", "aliases", `answer after ${ms(m.predicted_answer_s)} (${m.thinking_tokens} thinking tokens)`));
  }
  return td;
}

function renderModels(status) {
  const body = $("models").querySelector("tbody");
  const rows = status.models.map((m) => {
    const tr = el("tr");
    tr.dataset.model = m.name;
    const name = el("td", "name", m.name);
    if (m.aliases.length) name.append(el("span", "aliases", "aka " + m.aliases.join(", ")));
    if (m.replica_of) name.append(el("span", "aliases", "a replica of " + m.replica_of));
    const state = el("td");
    state.append(el("span", "state state-" + m.state, m.state));
    if (m.progress) state.append(el("span", "aliases", m.progress));
    if (m.reason) state.append(el("span", "reason", m.reason));
    const where = (m.gpus.length ? "GPU " + m.gpus.join(", ") : "CPU") + (m.cluster_host ? " on host " + m.cluster_host : "");
    const memory = m.memory.map((p) => `${p.pool}: ${gib(p.estimated_bytes)} / ${gib(p.measured_bytes)}`).join("\n");
    const cells = [
      name, state, el("td", "", m.engine), el("td", "", m.quant || "–"),
      el("td", "", m.host === "local" ? where : m.host), el("td", "mem", memory || "–"),
      el("td", "", `${m.in_flight} / ${m.queued}`),
      el("td", "", `${num(m.predicted_tok_s, 1)} / ${num(m.measured_tok_s, 1)}`),
      ttftCell(m),
      el("td", "", `${pct(m.prefix_hit_share)} / ${num(m.prefill_saved_s, 1)} s`),
    ];
    const admin = el("td", "admin-only");
    if (status.admin && m.host === "local") {
      for (const action of ["load", "unload"]) {
        const button = el("button", "action-" + action, action === "load" ? "Load" : "Unload");
        button.type = "button";
        button.addEventListener("click", () => adminAction(m.name, action, button));
        admin.append(button);
      }
    }
    tr.append(...cells, admin);
    return tr;
  });
  body.replaceChildren(...rows);
  const refused = status.refused.map((r) => {
    const p = el("p");
    p.append(el("span", "state state-refused", "refused "), el("strong", "", r.name), document.createTextNode(": " + r.reason));
    return p;
  });
  $("refused").replaceChildren(...refused);
}

async function adminAction(model, action, button) {
  button.disabled = true;
  $("admin-msg").textContent = `${action} ${model}…`;
  try {
    const response = await fetch(`/admin/models/${encodeURIComponent(model)}/${action}`, { method: "POST", headers: headers() });
    $("admin-msg").textContent = response.ok ? `${action} ${model}: done` : `${action} ${model}: ${await errorText(response)}`;
  } catch (err) {
    $("admin-msg").textContent = `${action} ${model}: ${err}`;
  } finally {
    button.disabled = false;
    refresh();
  }
}

// -- memory bars -------------------------------------------------------------------------------------
function renderPools(pools) {
  const colours = new Map();
  const nodes = pools.map((pool) => {
    const box = el("div", "pool");
    box.dataset.pool = pool.pool;
    const label = el("div", "pool-label");
    const used = pool.used.reduce((sum, u) => sum + u.bytes, 0);
    label.append(el("span", "", pool.label + (pool.simulated ? " (simulated)" : "")),
      el("span", "muted", `${gib(used)} used · ${gib(pool.free_bytes)} free · ${gib(pool.total_bytes)} total`));
    const bar = el("div", "bar");
    const legend = el("div", "legend");
    const segment = (cls, bytes, title) => {
      const seg = el("div", "seg " + cls);
      seg.style.width = (pool.total_bytes ? (100 * bytes) / pool.total_bytes : 0) + "%";
      seg.title = title;
      return seg;
    };
    if (pool.reserved_bytes) bar.append(segment("seg-reserved", pool.reserved_bytes, `reserved ${gib(pool.reserved_bytes)}`));
    for (const u of pool.used) {
      if (!colours.has(u.model)) colours.set(u.model, colours.size % 8);
      const cls = "seg-" + colours.get(u.model);
      const seg = segment(cls, u.bytes, `${u.model}: ${gib(u.bytes)} ${u.measured ? "measured" : "estimated"}`);
      seg.dataset.model = u.model;
      bar.append(seg);
      const item = el("span");
      item.append(el("span", "swatch " + cls), document.createTextNode(`${u.model} ${gib(u.bytes)}${u.measured ? "" : " (est.)"}`));
      legend.append(item);
    }
    bar.append(segment("seg-free", pool.free_bytes, `free ${gib(pool.free_bytes)}`));
    box.append(label, bar, legend);
    return box;
  });
  if (!nodes.length) nodes.push(el("p", "muted", "No GPUs and no host memory budget to show."));
  $("pools").replaceChildren(...nodes);
}

// -- charts ------------------------------------------------------------------------------------------
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function renderChart(target, bins, value, cls, digits) {
  const width = Math.max(120, target.clientWidth || 300), height = 110, top = 12, bottom = 98;
  target.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const values = bins.map(value);
  const max = Math.max(1e-9, ...values.filter((v) => v !== null));
  const x = (i) => (bins.length > 1 ? (i * width) / (bins.length - 1) : 0);
  const y = (v) => bottom - ((bottom - top) * v) / max;
  const points = values.map((v, i) => (v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`)).filter((p) => p);
  const nodes = [
    svg("line", { x1: 0, y1: bottom, x2: width, y2: bottom, stroke: "#d9dde3" }),
    svg("text", { x: 2, y: top - 1 }, "max " + (values.some((v) => v !== null && v > 0) ? max.toFixed(digits) : "0")),
    svg("text", { x: 2, y: height - 1 }, `-${Math.round((bins.length ? bins[0].age_s : 0) / 60)} min`),
    svg("text", { x: width - 18, y: height - 1 }, "now"),
  ];
  if (points.length) nodes.push(svg("polyline", { class: cls, points: points.join(" ") }));
  values.forEach((v, i) => { if (v !== null && v > 0) nodes.push(svg("circle", { class: cls, cx: x(i), cy: y(v), r: 2 })); });
  target.replaceChildren(...nodes);
}

// -- recent errors -----------------------------------------------------------------------------------
function renderErrors(errors) {
  const rows = errors.map((e) => {
    const tr = el("tr");
    for (const text of [e.at.replace("T", " ").replace("Z", ""), e.status, e.code || "–", e.model, e.endpoint, e.key_id || "–", e.message || ""]) {
      tr.append(el("td", "", text));
    }
    return tr;
  });
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", "muted", "none");
    td.colSpan = 7;
    tr.append(td);
    rows.push(tr);
  }
  $("errors").querySelector("tbody").replaceChildren(...rows);
}

// -- playground --------------------------------------------------------------------------------------
function renderModelChoice(models) {
  const usable = models.filter((m) => m.task === "generate" && !m.replica_of).map((m) => m.name);
  if (usable.join("\n") === lastModels.join("\n")) return;
  lastModels = usable;
  const select = $("pg-model");
  const chosen = select.value;
  select.replaceChildren(...usable.map((name) => { const o = el("option", "", name); o.value = name; return o; }));
  if (usable.includes(chosen)) select.value = chosen;
}

function logMessage(role, text) {
  const node = el("div", "msg msg-" + role, text);
  $("pg-log").append(node);
  node.scrollIntoView({ block: "nearest" });
  return node;
}

async function send() {
  const prompt = $("pg-prompt").value.trim();
  const model = $("pg-model").value;
  if (!prompt || !model || controller) return;
  $("pg-prompt").value = "";
  conversation.push({ role: "user", content: prompt });
  logMessage("user", prompt);
  const reply = logMessage("assistant", "");
  $("pg-stats").textContent = "waiting…";
  controller = new AbortController();
  $("pg-send").disabled = true;
  $("pg-stop").disabled = false;
  const started = performance.now();
  const run = { text: "", first: null, last: null, chunks: 0, finish: null, usage: null, error: null };
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ model, messages: conversation, stream: true, stream_options: { include_usage: true },
        max_tokens: Number($("pg-max").value) || 64 }),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readStream(response, run, reply);
  } catch (err) {
    run.error = err.name === "AbortError" ? "stopped" : String(err.message || err);
  } finally {
    controller = null;
    $("pg-send").disabled = false;
    $("pg-stop").disabled = true;
  }
  if (run.text) conversation.push({ role: "assistant", content: run.text });
  if (run.error) { reply.classList.add("msg-error"); if (!run.text) reply.textContent = run.error; }
  $("pg-stats").textContent = stats(run, started);
}

async function readStream(response, run, reply) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of frame.split("\n")) {
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        onChunk(JSON.parse(line.slice(6)), run, reply);
      }
    }
  }
}

function onChunk(chunk, run, reply) {
  if (chunk.error) { run.error = `${chunk.error.code || chunk.error.type}: ${chunk.error.message}`; return; }
  if (chunk.usage) run.usage = chunk.usage;
  for (const choice of chunk.choices || []) {
    const piece = choice.delta && choice.delta.content;
    if (piece) {
      const now = performance.now();
      if (run.first === null) run.first = now;
      run.last = now;
      run.chunks += 1;
      run.text += piece;
      reply.textContent = run.text;
    }
    if (choice.finish_reason) run.finish = choice.finish_reason;
  }
}

function stats(run, started) {
  const tokens = run.usage ? run.usage.completion_tokens : run.chunks;
  const parts = [`finish: ${run.finish || "none"}`, `${tokens} tokens`];
  if (run.first !== null && run.last > run.first && tokens > 1) {
    parts.push(`${((tokens - 1) / ((run.last - run.first) / 1000)).toFixed(1)} tok/s`);
  }
  if (run.first !== null) parts.push(`TTFT ${((run.first - started) / 1000).toFixed(2)} s`);
  if (run.error) parts.push("error: " + run.error);
  return parts.join(" · ");
}

// -- start -------------------------------------------------------------------------------------------
function useKey() {
  const value = $("key-input").value.trim();
  if (!value) return;
  sessionStorage.setItem(KEY_STORE, value);
  $("key-input").value = "";
  refresh();
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-submit").addEventListener("click", useKey);
  $("key-input").addEventListener("keydown", (e) => { if (e.key === "Enter") useKey(); });
  $("signout").addEventListener("click", () => { sessionStorage.removeItem(KEY_STORE); showLogin(""); });
  $("pg-send").addEventListener("click", send);
  $("pg-prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); } });
  $("pg-stop").addEventListener("click", () => controller && controller.abort());
  $("pg-clear").addEventListener("click", () => { conversation = []; $("pg-log").replaceChildren(); $("pg-stats").textContent = ""; });
  fetch("/health").then((r) => { $("health").textContent = r.ok ? "gateway ok" : `health ${r.status}`; }).catch(() => {});
  refresh();
  timer = setInterval(refresh, POLL_MS);
});
