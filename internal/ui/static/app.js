// ramify console: a plain client of the API (no build step, no dependencies). Routes live in the URL's hash:
// #/ sandboxes, #/tree/<family>, #/sb/<id>, #/diff/<a>/<b>. The API key is kept in sessionStorage and sent in the
// Authorization header of every call, the event stream included (read with fetch streaming, not EventSource,
// which cannot send headers).
"use strict";

const KEY = "ramify.key";
const main = document.getElementById("main");
let view = null; // the current view's cleanup function
let keyCache = sessionStorage.getItem(KEY) || "";

// ---- small helpers ----

function h(tag, attrs, ...kids) {
  const svg = ["svg", "g", "path", "rect", "text", "circle", "title", "line"].includes(tag);
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) if (k !== null && k !== undefined && k !== false) el.append(k);
  return el;
}

function toast(msg, bad) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.className = bad ? "show bad" : "show";
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.className = ""; }, bad ? 6000 : 2500);
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

function fmtAge(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return Math.floor(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d";
}

const short = (id) => (id || "").replace(/^(sbx_|fam_)/, "").slice(0, 8);

// ---- the API ----

class APIError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

async function api(path, opts = {}) {
  const headers = Object.assign({ Authorization: "Bearer " + keyCache }, opts.headers || {});
  let body = opts.body;
  if (opts.json !== undefined) {
    body = JSON.stringify(opts.json);
    headers["Content-Type"] = "application/json";
  }
  const method = opts.method || "GET";
  let r;
  try {
    r = await fetch(path, { method, headers, body, signal: opts.signal });
  } catch (e) {
    // A GET cut by the browser (its network changed: a host making sandboxes adds interfaces) is tried once more.
    if (method !== "GET" || (opts.signal && opts.signal.aborted)) throw e;
    r = await fetch(path, { method, headers, signal: opts.signal });
  }
  if (r.status === 401) { signOut("The API key was refused: sign in again."); throw new APIError(401, "invalid api key"); }
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
    throw new APIError(r.status, msg);
  }
  if (opts.raw) return r;
  if (r.status === 204) return null;
  return r.json();
}

const sbPath = (id, rest = "") => "/v1/sandboxes/" + encodeURIComponent(id) + rest;

// ---- the event stream: one shared connection, resumed with Last-Event-ID ----

const events = {
  listeners: new Set(),
  recent: [], // the last events seen since sign-in, for views opened later
  last: "",
  ctl: null,
  on(fn) { this.listeners.add(fn); return () => this.listeners.delete(fn); },
  setLive(ok) {
    const el = document.getElementById("live");
    el.textContent = ok ? "live" : "reconnecting";
    el.className = ok ? "live on" : "live off";
  },
  stop() { if (this.ctl) this.ctl.abort(); this.ctl = null; },
  async start() {
    this.stop();
    const ctl = new AbortController();
    this.ctl = ctl;
    while (!ctl.signal.aborted) {
      try {
        const headers = { Authorization: "Bearer " + keyCache, Accept: "text/event-stream" };
        if (this.last) headers["Last-Event-ID"] = this.last;
        const r = await fetch("/v1/events", { headers, signal: ctl.signal, cache: "no-store" });
        if (r.status === 401) { signOut("The API key was refused: sign in again."); return; }
        if (!r.ok || !r.body) throw new Error("events: " + r.status);
        this.setLive(true);
        await this.read(r.body.getReader(), ctl.signal);
      } catch (e) {
        if (ctl.signal.aborted) return;
      }
      this.setLive(false);
      await new Promise((res) => setTimeout(res, 1000));
    }
  },
  async read(reader, signal) {
    const dec = new TextDecoder();
    let buf = "";
    while (!signal.aborted) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        this.dispatch(block);
      }
    }
  },
  dispatch(block) {
    let data = "", id = "";
    for (const line of block.split("\n")) {
      if (line.startsWith("data:")) data += line.slice(5).trim();
      else if (line.startsWith("id:")) id = line.slice(3).trim();
    }
    if (id) this.last = id;
    if (!data) return;
    let ev;
    try { ev = JSON.parse(data); } catch (e) { return; }
    this.recent.push(ev);
    if (this.recent.length > 500) this.recent.shift();
    for (const fn of this.listeners) fn(ev);
  },
};

// mentions says whether an event concerns any of the ids (as subject, child, winner or diff side).
function mentions(ev, ids) {
  const all = [ev.sandbox, ev.winner, ev.other, ...(ev.children || [])];
  return all.some((x) => x && ids.has(x));
}

// ---- sign in and out ----

function signOut(msg) {
  keyCache = "";
  sessionStorage.removeItem(KEY);
  events.stop();
  events.recent = [];
  events.last = "";
  document.getElementById("signout").hidden = true;
  document.getElementById("live").className = "live off";
  document.getElementById("live").textContent = "offline";
  if (msg) toast(msg, true);
  route();
}

function signIn() {
  const input = h("input", { type: "password", id: "key", name: "key", autocomplete: "current-password", placeholder: "rfy_...", required: true });
  const err = h("p", { class: "error", role: "alert" });
  const form = h("form", {
    class: "card signin", id: "signin",
    onsubmit: async (e) => {
      e.preventDefault();
      keyCache = input.value.trim();
      try {
        await fetchCheck();
      } catch (ex) {
        keyCache = "";
        err.textContent = ex.message;
        return;
      }
      sessionStorage.setItem(KEY, keyCache);
      started();
      route();
    },
  },
  h("h1", { text: "Sign in" }),
  h("p", { text: "The API key ramify serve printed (or $(cat /var/lib/ramify/api-key)). It stays in this browser tab's session." }),
  h("label", { for: "key", text: "API key" }), input, h("button", { type: "submit", text: "Sign in" }), err);
  main.replaceChildren(form);
  input.focus();
  return null;
}

async function fetchCheck() {
  const r = await fetch("/v1/sandboxes?status=running", { headers: { Authorization: "Bearer " + keyCache } });
  if (r.status === 401) throw new Error("That key was refused.");
  if (!r.ok) throw new Error("The server answered " + r.status + ".");
}

function started() {
  document.getElementById("signout").hidden = false;
  events.start();
}

// ---- the sandbox list ----

function statusBadge(st) {
  return h("span", { class: "badge st-" + st, text: st });
}

function parseFilter(text) {
  const q = new URLSearchParams();
  for (const part of text.split(/[\s,]+/).filter(Boolean)) {
    const [k, ...v] = part.split("=");
    if (k === "status") q.append("status", v.join("="));
    else q.append("metadata[" + k + "]", v.join("="));
  }
  return q;
}

function listView() {
  const filter = h("input", { id: "filter", type: "search", placeholder: "metadata filter: team=ml run=7  (or status=paused)", "aria-label": "filter", value: sessionStorage.getItem("ramify.filter") || "" });
  const body = h("tbody");
  const note = h("p", { class: "muted" });
  const usage = new Map();
  let list = [];
  let alive = true;

  function row(sb) {
    const u = usage.get(sb.id);
    const meta = Object.entries(sb.metadata || {}).map(([k, v]) => h("span", { class: "tag", text: k + "=" + v }));
    return h("tr", { "data-id": sb.id },
      h("td", {}, h("a", { href: "#/sb/" + sb.id, class: "mono", text: sb.id })),
      h("td", {}, statusBadge(sb.status)),
      h("td", { class: "mono", text: sb.shape }),
      h("td", { text: fmtAge(sb.created_at) }),
      h("td", { class: "num", text: u ? fmtBytes(u.mem_bytes) : "–" }),
      h("td", { class: "num", text: u ? u.cpu_seconds.toFixed(2) + " s" : "–" }),
      h("td", {}, h("a", { href: "#/tree/" + sb.family_id, class: "mono", title: "fork tree of " + sb.family_id, text: short(sb.family_id) })),
      h("td", { class: "mono" }, sb.parent_id ? h("a", { href: "#/sb/" + sb.parent_id, text: short(sb.parent_id) }) : "–"),
      h("td", {}, meta));
  }
  function draw() {
    body.replaceChildren(...list.map(row));
    note.textContent = list.length ? list.length + " sandbox" + (list.length > 1 ? "es" : "") : "No sandboxes match.";
  }
  async function load() {
    try {
      sessionStorage.setItem("ramify.filter", filter.value);
      list = (await api("/v1/sandboxes?" + parseFilter(filter.value))).sandboxes;
      draw();
    } catch (e) {
      if (e.status !== 401) note.textContent = e.message;
    }
  }
  async function loadUsage() {
    const running = list.filter((s) => s.status === "running").slice(0, 50);
    await Promise.all(running.map(async (s) => {
      try { usage.set(s.id, (await api(sbPath(s.id))).usage); } catch (e) { usage.delete(s.id); }
    }));
    if (alive) draw();
  }
  let deb;
  filter.addEventListener("input", () => { clearTimeout(deb); deb = setTimeout(load, 250); });
  const off = events.on(() => { clearTimeout(deb); deb = setTimeout(load, 150); });
  const tick = setInterval(async () => { await load(); await loadUsage(); }, 3000);
  main.replaceChildren(h("section", { class: "card" },
    h("div", { class: "bar" }, h("h1", { text: "Sandboxes" }),
      h("button", { type: "button", onclick: async () => {
        try { const sb = await api("/v1/sandboxes", { method: "POST", json: {} }); location.hash = "#/sb/" + sb.id; } catch (e) { toast(e.message, true); }
      }, text: "New sandbox" })),
    filter, note,
    h("table", { class: "list" }, h("thead", {}, h("tr", {},
      ...["id", "status", "shape", "age", "memory", "CPU", "family", "parent", "metadata"].map((c) => h("th", { scope: "col", text: c })))), body)));
  load().then(loadUsage);
  return () => { alive = false; off(); clearInterval(tick); clearTimeout(deb); };
}

// ---- the fork tree ----

// layout places a family's sandboxes as a tree: leaves side by side, each parent above the middle of its children.
// A sandbox whose parent is gone (deleted, or the family's root) is a root.
function layout(list) {
  const byId = new Map(list.map((s) => [s.id, s]));
  const kids = new Map();
  const roots = [];
  for (const s of list) {
    const p = s.parent_id && byId.has(s.parent_id) ? s.parent_id : null;
    if (p) { if (!kids.has(p)) kids.set(p, []); kids.get(p).push(s); } else roots.push(s);
  }
  const pos = new Map();
  let next = 0;
  const dx = 150, dy = 90;
  function place(s, depth) {
    const cs = kids.get(s.id) || [];
    let x;
    if (!cs.length) x = next++;
    else { const xs = cs.map((c) => place(c, depth + 1)); x = (xs[0] + xs[xs.length - 1]) / 2; }
    pos.set(s.id, { x: 70 + x * dx, y: 36 + depth * dy, parent: byId.has(s.parent_id) ? s.parent_id : null });
    return x;
  }
  roots.forEach((r) => place(r, 0));
  let w = 0, hgt = 0;
  for (const p of pos.values()) { w = Math.max(w, p.x + 70); hgt = Math.max(hgt, p.y + 36); }
  return { pos, w, h: hgt };
}

function treeView(fam) {
  const svg = h("svg", { class: "tree", role: "group", "aria-label": "fork tree of " + fam });
  const edges = h("g", { class: "edges" });
  const nodesG = h("g", { class: "nodes" });
  svg.append(edges, nodesG);
  const log = h("ol", { class: "evlog", "aria-label": "family events" });
  const info = h("p", { class: "muted" });
  const nodes = new Map(); // id -> svg g
  let prev = new Map();
  let alive = true;

  function node(s) {
    const g = h("g", {
      class: "node st-" + s.status + (s.family_id !== fam ? " own-family" : ""), "data-id": s.id, tabindex: "0", role: "link",
      "aria-label": s.id + " " + s.status + (s.family_id !== fam ? " (family " + s.family_id + ")" : ""),
      onclick: () => { location.hash = "#/sb/" + s.id; },
      onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); location.hash = "#/sb/" + s.id; } },
    },
    h("title", { text: s.id + " (" + s.status + (s.family_id !== fam ? ", now in family " + s.family_id : "") + ")" }),
    h("rect", { x: -55, y: -20, width: 110, height: 40, rx: 8 }),
    h("text", { class: "id", x: 0, y: -3, text: short(s.id) }),
    h("text", { class: "stt", x: 0, y: 13, text: (s.status === "paused" ? "❚❚ " : "") + s.status }));
    return g;
  }
  function draw(list) {
    const { pos, w, h: hh } = layout(list);
    svg.setAttribute("viewBox", "0 0 " + Math.max(w, 300) + " " + Math.max(hh, 120));
    svg.setAttribute("width", Math.max(w, 300));
    svg.setAttribute("height", Math.max(hh, 120));
    const seen = new Set();
    for (const s of list) {
      seen.add(s.id);
      const p = pos.get(s.id);
      let g = nodes.get(s.id);
      if (!g) {
        // A new node starts where its parent is and moves out: forks fan out.
        g = node(s);
        const from = p.parent && prev.get(p.parent);
        if (from) g.style.transform = `translate(${from.x}px, ${from.y}px)`;
        else g.style.transform = `translate(${p.x}px, ${p.y}px)`;
        nodesG.append(g);
        nodes.set(s.id, g);
        g.getBoundingClientRect(); // start the transition from there
      } else {
        const fresh = node(s);
        g.className.baseVal = fresh.className.baseVal;
        g.setAttribute("aria-label", fresh.getAttribute("aria-label"));
        g.replaceChildren(...fresh.childNodes);
      }
      g.style.transform = `translate(${p.x}px, ${p.y}px)`;
    }
    for (const [id, g] of nodes) {
      if (seen.has(id)) continue;
      // Gone: a merged winner folds into its parent, a deleted sandbox fades where it was.
      nodes.delete(id);
      const into = g.dataset.foldInto && pos.get(g.dataset.foldInto);
      if (into) g.style.transform = `translate(${into.x}px, ${into.y}px)`;
      g.classList.add("gone");
      g.removeAttribute("data-id");
      setTimeout(() => g.remove(), 600);
    }
    edges.replaceChildren(...[...pos].filter(([, p]) => p.parent).map(([id, p]) => {
      const q = pos.get(p.parent);
      const my = (q.y + p.y) / 2;
      return h("path", { "data-edge": p.parent + ">" + id, d: `M${q.x},${q.y + 20} C${q.x},${my} ${p.x},${my} ${p.x},${p.y - 20}` });
    }));
    prev = pos;
    info.textContent = list.length + " sandbox" + (list.length === 1 ? "" : "es") + " in the tree of family " + fam + ". Click a node to open it.";
  }
  // The tree is the family and every sandbox descended from it by parent_id: a resumed sandbox, or a child of a
  // paused one, runs in a family of its own but stays in its parent's tree.
  async function load() {
    try {
      const all = (await api("/v1/sandboxes")).sandboxes;
      const ids = new Set(all.filter((s) => s.family_id === fam).map((s) => s.id));
      for (let grew = true; grew;) {
        grew = false;
        for (const s of all) if (!ids.has(s.id) && ids.has(s.parent_id)) { ids.add(s.id); grew = true; }
      }
      if (alive) draw(all.filter((s) => ids.has(s.id)));
    } catch (e) { info.textContent = e.message; }
  }
  function describe(ev) {
    const bits = [ev.type, short(ev.sandbox)];
    if (ev.reason) bits.push("(" + ev.reason + ")");
    if (ev.children) bits.push("→ " + ev.children.map(short).join(", "));
    if (ev.winner) bits.push("← " + short(ev.winner));
    if (ev.ms !== undefined) bits.push(ev.ms.toFixed(1) + " ms");
    return new Date(ev.time).toLocaleTimeString() + "  " + bits.join(" ");
  }
  let deb;
  const logEvent = (ev) => {
    log.prepend(h("li", { text: describe(ev) }));
    while (log.children.length > 30) log.lastChild.remove();
  };
  events.recent.filter((ev) => ev.family === fam).forEach(logEvent);
  const ours = (ev) => ev.family === fam || mentions(ev, new Set(nodes.keys()));
  const off = events.on((ev) => {
    if (!ours(ev) && ev.type !== "missed") return;
    if (ev.type === "merged" && ev.winner && nodes.has(ev.winner)) nodes.get(ev.winner).dataset.foldInto = ev.sandbox;
    if (ev.type !== "missed") logEvent(ev);
    clearTimeout(deb);
    deb = setTimeout(load, 50);
  });
  main.replaceChildren(h("section", { class: "card" },
    h("div", { class: "bar" }, h("h1", { text: "Fork tree" }), h("span", { class: "mono muted", text: fam })),
    info,
    h("div", { class: "treebox" }, svg),
    h("div", { class: "legend" }, h("span", { class: "badge st-running", text: "running" }), h("span", { class: "badge st-paused", text: "❚❚ paused" }), h("span", { class: "badge st-error", text: "error" })),
    h("h2", { text: "Events" }), log));
  load();
  return () => { alive = false; off(); clearTimeout(deb); };
}

// ---- a sandbox ----

function renderResults(results) {
  return (results || []).map((r) => {
    const d = r.data || {};
    const box = h("div", { class: "result", "data-type": r.type });
    if (d["image/png"]) box.append(h("img", { src: "data:image/png;base64," + d["image/png"], alt: d["text/plain"] || "image" }));
    else if (d["image/jpeg"]) box.append(h("img", { src: "data:image/jpeg;base64," + d["image/jpeg"], alt: d["text/plain"] || "image" }));
    else if (d["image/svg+xml"]) box.append(h("img", { src: "data:image/svg+xml;base64," + btoa(unescape(encodeURIComponent(d["image/svg+xml"]))), alt: d["text/plain"] || "image" }));
    else if (d["text/html"]) box.append(h("iframe", { sandbox: "", srcdoc: d["text/html"], title: "HTML result", class: "html" }));
    else box.append(h("pre", { text: d["text/plain"] || JSON.stringify(d) }));
    return box;
  });
}

function renderRun(r) {
  const out = [];
  if (r.stdout) out.push(h("pre", { class: "stdout", text: r.stdout }));
  if (r.stderr) out.push(h("pre", { class: "stderr", text: r.stderr }));
  const rich = (r.results || []).filter((x) => x.type !== "execute_result" || Object.keys(x.data || {}).some((k) => k !== "text/plain"));
  out.push(...renderResults(rich));
  if (r.value !== null && r.value !== undefined && !rich.some((x) => x.type === "execute_result")) out.push(h("pre", { class: "value", text: r.value }));
  if (r.error) out.push(h("pre", { class: "stderr err", text: r.error.traceback || r.error.name + ": " + r.error.value }));
  if (!out.length) out.push(h("p", { class: "muted", text: "(no output)" }));
  return out;
}

function sandboxView(id) {
  let sb = null;
  let alive = true;
  const head = h("div", { class: "bar" });
  const facts = h("dl", { class: "facts" });
  const actions = h("div", { class: "actions" });
  const usageEl = h("dl", { class: "facts" });

  // code cell
  const code = h("textarea", { id: "code", rows: 5, spellcheck: "false", "aria-label": "Python code", placeholder: "x = 41\nx + 1      (Ctrl+Enter runs)" });
  const codeOut = h("div", { class: "out", id: "code-out", "aria-live": "polite" });
  const runBtn = h("button", { type: "button", id: "run", text: "Run ▶" });
  async function runCell() {
    runBtn.disabled = true;
    codeOut.replaceChildren(h("p", { class: "muted", text: "running…" }));
    try {
      const r = await api(sbPath(id, "/run_code"), { method: "POST", json: { code: code.value } });
      codeOut.replaceChildren(h("p", { class: "muted", text: "[" + r.execution_count + "]" }), ...renderRun(r));
    } catch (e) { codeOut.replaceChildren(h("pre", { class: "stderr err", text: e.message })); }
    runBtn.disabled = false;
  }
  runBtn.addEventListener("click", runCell);
  code.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); runCell(); } });

  // exec
  const cmd = h("input", { id: "cmd", type: "text", spellcheck: "false", "aria-label": "shell command", placeholder: "ls -l /root" });
  const cmdOut = h("div", { class: "out", id: "cmd-out" });
  const cmdForm = h("form", { class: "row", onsubmit: async (e) => {
    e.preventDefault();
    cmdOut.replaceChildren(h("p", { class: "muted", text: "running…" }));
    try {
      const r = await api(sbPath(id, "/exec"), { method: "POST", json: { cmd: cmd.value } });
      cmdOut.replaceChildren(h("p", { class: "muted", text: "exit " + r.exit_code + (r.timed_out ? " (timed out)" : "") }),
        r.stdout ? h("pre", { class: "stdout", text: r.stdout }) : "", r.stderr ? h("pre", { class: "stderr", text: r.stderr }) : "");
    } catch (ex) { cmdOut.replaceChildren(h("pre", { class: "stderr err", text: ex.message })); }
  } }, h("span", { class: "prompt", text: "$" }), cmd, h("button", { type: "submit", text: "Exec" }));

  // files
  const dir = h("input", { id: "dir", type: "text", value: "/root", "aria-label": "directory" });
  const filesBody = h("tbody");
  const upload = h("input", { type: "file", id: "upload", multiple: true, "aria-label": "upload files" });
  async function listDir() {
    try {
      const r = await api(sbPath(id, "/files/list?path=" + encodeURIComponent(dir.value)));
      const up = dir.value.replace(/\/[^/]+\/?$/, "") || "/";
      const rows = r.entries.map((e) => h("tr", {},
        h("td", {}, e.type === "dir"
          ? h("button", { type: "button", class: "link", onclick: () => { dir.value = e.path; listDir(); }, text: e.name + "/" })
          : h("span", { class: "mono", text: e.name + (e.type === "symlink" ? " → " + e.link_target : "") })),
        h("td", { class: "num", text: e.type === "file" ? fmtBytes(e.size) : e.type }),
        h("td", { class: "mono", text: e.mode }),
        h("td", { text: new Date(e.mtime).toLocaleString() }),
        h("td", {}, e.type === "file" ? h("button", { type: "button", class: "link", onclick: () => download(e.path, e.name), text: "download" }) : "")));
      if (dir.value !== "/") rows.unshift(h("tr", {}, h("td", { colspan: 5 }, h("button", { type: "button", class: "link", onclick: () => { dir.value = up; listDir(); }, text: "../" }))));
      filesBody.replaceChildren(...rows);
    } catch (e) { filesBody.replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "error", text: e.message }))); }
  }
  async function download(path, name) {
    try {
      const r = await api(sbPath(id, "/files?path=" + encodeURIComponent(path)), { raw: true });
      const url = URL.createObjectURL(await r.blob());
      const a = h("a", { href: url, download: name });
      document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) { toast(e.message, true); }
  }
  upload.addEventListener("change", async () => {
    for (const f of upload.files) {
      const path = dir.value.replace(/\/$/, "") + "/" + f.name;
      try { await api(sbPath(id, "/files?path=" + encodeURIComponent(path)), { method: "PUT", body: f }); toast("uploaded " + path); } catch (e) { toast(e.message, true); }
    }
    upload.value = "";
    listDir();
  });

  // logs
  const logs = h("pre", { class: "logs", id: "logs" });
  async function loadLogs() {
    try {
      const r = await api(sbPath(id, "/logs"));
      logs.textContent = r.lines.length ? r.lines.map((l) => new Date(l.time).toLocaleTimeString() + " [" + l.source + "] " + l.text).join("\n") : "(no log lines)";
    } catch (e) { logs.textContent = e.message; }
  }

  function act(label, fn, attrs = {}) {
    return h("button", Object.assign({ type: "button", onclick: async (e) => {
      e.target.disabled = true;
      try { await fn(); } catch (ex) { toast(ex.message, true); }
      e.target.disabled = false;
      if (alive) load();
    } }, attrs), label);
  }
  function drawActions(family) {
    const kids = family.filter((s) => s.parent_id === id && s.status === "running");
    const n = h("input", { type: "number", min: 1, max: 32, value: 2, id: "fork-n", "aria-label": "children", class: "n" });
    const pick = h("select", { id: "merge-child", "aria-label": "child to merge" }, ...kids.map((k) => h("option", { value: k.id, text: short(k.id) })));
    const run = sb.status === "running";
    const del = h("button", { type: "button", class: "danger", id: "delete", onclick: async () => {
      if (del.dataset.armed !== "1") { del.dataset.armed = "1"; del.textContent = "Really delete?"; return; }
      try { await api(sbPath(id), { method: "DELETE" }); toast("deleted " + id); location.hash = sb.parent_id ? "#/sb/" + sb.parent_id : "#/"; } catch (ex) { toast(ex.message, true); }
    }, text: "Delete" });
    actions.replaceChildren(
      run ? act("Pause", () => api(sbPath(id, "/pause"), { method: "POST" }), { id: "pause" }) : "",
      sb.status === "paused" ? act("Resume", () => api(sbPath(id, "/resume"), { method: "POST" }), { id: "resume" }) : "",
      h("span", { class: "group" }, act("Fork", async () => {
        const r = await api(sbPath(id, "/fork"), { method: "POST", json: { n: Number(n.value) } });
        toast("forked: " + r.children.map(short).join(", "));
      }, { id: "fork", disabled: !(run || sb.status === "paused") }), "×", n),
      sb.parent_id && run ? act("Merge into parent", async () => {
        await api(sbPath(sb.parent_id, "/merge_into/" + encodeURIComponent(id)), { method: "POST" });
        toast("merged into " + sb.parent_id);
        location.hash = "#/sb/" + sb.parent_id;
      }, { id: "merge-up", title: "the parent " + sb.parent_id + " takes this sandbox's state; this id is retired" }) : "",
      kids.length && run ? h("span", { class: "group" }, act("Merge child in", async () => {
        await api(sbPath(id, "/merge_into/" + encodeURIComponent(pick.value)), { method: "POST" });
        toast("merged " + pick.value);
      }, { id: "merge-in" }), pick) : "",
      h("a", { class: "button", href: "#/tree/" + sb.family_id, text: "Fork tree" }),
      h("a", { class: "button", href: "#/diff/" + id + "/" + (sb.parent_id || ""), text: "Diff…" }),
      del);
  }
  async function load() {
    if (!alive || location.hash !== "#/sb/" + id) return; // leaving (a merge retires this id): no stale GET
    try {
      sb = await api(sbPath(id));
    } catch (e) {
      if (!alive) return;
      head.replaceChildren(h("h1", { text: "Sandbox " + id }));
      facts.replaceChildren(h("p", { class: "error", text: e.message }));
      actions.replaceChildren();
      return;
    }
    if (!alive) return;
    head.replaceChildren(h("h1", { class: "mono", text: sb.id }), statusBadge(sb.status));
    const f = [["shape", sb.shape], ["age", fmtAge(sb.created_at)], ["ip", sb.ip], ["family", h("a", { href: "#/tree/" + sb.family_id, text: sb.family_id })],
      ["parent", sb.parent_id ? h("a", { href: "#/sb/" + sb.parent_id, text: sb.parent_id }) : "–"],
      ["timeout", sb.timeout_s ? sb.timeout_s + " s" : "none"], ["metadata", Object.entries(sb.metadata || {}).map(([k, v]) => k + "=" + v).join(" ") || "–"]];
    if (sb.error) f.push(["error", sb.error]);
    facts.replaceChildren(...f.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", {}, v)]));
    const u = sb.usage;
    usageEl.replaceChildren(...(u ? [["memory", fmtBytes(u.mem_bytes) + " of " + sb.mem_mib + " MiB"], ["CPU", u.cpu_seconds.toFixed(2) + " s"], ["processes", u.pids + " of " + sb.max_procs], ["disk", u.disk_bytes === null ? "–" : fmtBytes(u.disk_bytes)], ["OOM kills", u.oom_kills]] : [["usage", "only while running"]]).flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: String(v) })]));
    let family = [];
    try { family = (await api("/v1/sandboxes")).sandboxes.filter((s) => s.family_id === sb.family_id); } catch (e) { /* the actions need no family */ }
    if (alive) drawActions(family);
  }
  let deb;
  const off = events.on((ev) => {
    if (ev.sandbox === id || (ev.children || []).includes(id) || ev.winner === id || (sb && ev.family === sb.family_id)) {
      clearTimeout(deb); deb = setTimeout(load, 100);
    }
  });
  const tick = setInterval(load, 4000);
  main.replaceChildren(
    h("section", { class: "card" }, head, facts, actions),
    h("div", { class: "cols" },
      h("section", { class: "card" }, h("h2", { text: "Python" }), code, h("div", { class: "row" }, runBtn, h("span", { class: "muted", text: "Ctrl+Enter" })), codeOut),
      h("section", { class: "card" }, h("h2", { text: "Usage" }), usageEl, h("h2", { text: "Shell" }), cmdForm, cmdOut)),
    h("section", { class: "card" }, h("div", { class: "bar" }, h("h2", { text: "Files" }),
      h("form", { class: "row", onsubmit: (e) => { e.preventDefault(); listDir(); } }, dir, h("button", { type: "submit", text: "List" })),
      h("label", { class: "button", for: "upload", tabindex: "0", onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); upload.click(); } }, text: "Upload…" }), upload),
    h("table", { class: "list" }, h("thead", {}, h("tr", {}, ...["name", "size", "mode", "modified", ""].map((c) => h("th", { scope: "col", text: c })))), filesBody)),
    h("section", { class: "card" }, h("div", { class: "bar" }, h("h2", { text: "Logs" }), h("button", { type: "button", onclick: loadLogs, text: "Refresh" })), logs));
  load().then(() => { if (sb && sb.status === "running") listDir(); });
  loadLogs();
  return () => { alive = false; off(); clearInterval(tick); clearTimeout(deb); };
}

// ---- diff ----

// lineDiff returns the edit script between two arrays of lines as [op, line] pairs (op " ", "-" or "+"): the
// longest common subsequence after the common head and tail are set aside, or null when too large to compute.
function lineDiff(a, b) {
  let pre = 0;
  while (pre < a.length && pre < b.length && a[pre] === b[pre]) pre++;
  let suf = 0;
  while (suf < a.length - pre && suf < b.length - pre && a[a.length - 1 - suf] === b[b.length - 1 - suf]) suf++;
  const A = a.slice(pre, a.length - suf), B = b.slice(pre, b.length - suf);
  const n = A.length, m = B.length;
  if (n * m > 4e6) return null;
  const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = A[i] === B[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = a.slice(0, pre).map((l) => [" ", l]);
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && A[i] === B[j]) { out.push([" ", A[i]]); i++; j++; } else if (i < n && (j === m || L[i + 1][j] >= L[i][j + 1])) { out.push(["-", A[i]]); i++; } else { out.push(["+", B[j]]); j++; }
  }
  return out.concat(a.slice(a.length - suf).map((l) => [" ", l]));
}

// hunks keeps the changed lines and 3 lines of context around them.
function hunks(script) {
  const keep = new Array(script.length).fill(false);
  script.forEach(([op], k) => { if (op !== " ") for (let d = -3; d <= 3; d++) if (script[k + d]) keep[k + d] = true; });
  const out = [];
  script.forEach((x, k) => {
    if (keep[k]) out.push(x);
    else if (out.length && out[out.length - 1][0] !== "…") out.push(["…", ""]);
  });
  return out;
}

async function fileText(id, path) {
  const r = await api(sbPath(id, "/files?path=" + encodeURIComponent(path)), { raw: true });
  const buf = new Uint8Array(await r.arrayBuffer());
  if (buf.length > 2 << 20 || buf.includes(0)) return null;
  try { return new TextDecoder("utf-8", { fatal: true }).decode(buf); } catch (e) { return null; }
}

function diffView(a, b) {
  const ia = h("input", { id: "diff-a", list: "sbs", value: a || "", "aria-label": "sandbox a", placeholder: "sbx_… (a)" });
  const ib = h("input", { id: "diff-b", list: "sbs", value: b || "", "aria-label": "sandbox b", placeholder: "sbx_… (b)" });
  const paths = h("input", { id: "diff-paths", value: "/root /tmp", "aria-label": "paths" });
  const dl = h("datalist", { id: "sbs" });
  const res = h("div", { id: "diff-result" });
  const fileBox = h("div", { id: "file-diff" });
  api("/v1/sandboxes?status=running").then((r) => dl.replaceChildren(...r.sandboxes.map((s) => h("option", { value: s.id })))).catch(() => {});

  async function showFile(kind, path) {
    fileBox.replaceChildren(h("p", { class: "muted", text: "loading " + path + "…" }));
    try {
      const [ta, tb] = await Promise.all([kind === "added" ? "" : fileText(ia.value, path), kind === "removed" ? "" : fileText(ib.value, path)]);
      if (ta === null || tb === null) { fileBox.replaceChildren(h("h3", { class: "mono", text: path }), h("p", { class: "muted", text: "binary or larger than 2 MiB: no line diff" })); return; }
      const split = (t) => (t === "" ? [] : t.replace(/\n$/, "").split("\n"));
      const script = lineDiff(split(ta), split(tb));
      if (!script) { fileBox.replaceChildren(h("p", { class: "muted", text: "too many changed lines to diff here" })); return; }
      const lines = hunks(script);
      fileBox.replaceChildren(h("h3", { class: "mono", text: path }),
        h("pre", { class: "linediff" }, ...lines.map(([op, l]) => h("span", { class: op === "+" ? "add" : op === "-" ? "del" : op === "…" ? "gap" : "ctx", text: (op === "…" ? "…" : op + " " + l) + "\n" }))));
    } catch (e) { fileBox.replaceChildren(h("p", { class: "error", text: e.message })); }
  }
  async function run(e) {
    if (e) e.preventDefault();
    if (!ia.value || !ib.value) return;
    const want = "#/diff/" + ia.value + "/" + ib.value;
    if (location.hash !== want) history.replaceState(null, "", want);
    res.replaceChildren(h("p", { class: "muted", text: "comparing…" }));
    fileBox.replaceChildren();
    try {
      const q = new URLSearchParams();
      paths.value.split(/\s+/).filter(Boolean).forEach((p) => q.append("paths", p));
      const d = await api(sbPath(ia.value, "/diff/" + encodeURIComponent(ib.value) + "?" + q));
      const col = (kind, sign) => h("div", { class: "dcol " + kind }, h("h3", { text: kind + " (" + d[kind].length + ")" }),
        h("ul", {}, ...d[kind].map((p) => h("li", {}, h("button", { type: "button", class: "link mono", "data-path": p, "data-kind": kind, onclick: () => showFile(kind, p), text: sign + " " + p })))));
      res.replaceChildren(h("div", { class: "cols3" }, col("added", "+"), col("removed", "−"), col("modified", "M")), d.truncated ? h("p", { class: "muted", text: "truncated: narrow the paths" }) : "");
      if (!d.added.length && !d.removed.length && !d.modified.length) res.append(h("p", { class: "muted", text: "No differences." }));
    } catch (ex) { res.replaceChildren(h("p", { class: "error", text: ex.message })); }
  }
  main.replaceChildren(h("section", { class: "card" }, h("h1", { text: "Diff" }),
    h("p", { class: "muted", text: "What b has that a has not (added), what only a has (removed), and what differs (modified). Pick a file for its line diff." }),
    h("form", { class: "row", id: "diff-form", onsubmit: run }, ia, h("span", { text: "→" }), ib, paths, h("button", { type: "submit", text: "Compare" }), dl),
    res, fileBox));
  if (a && b) run();
  return null;
}

// ---- routing ----

function route() {
  if (view) { view(); view = null; }
  const hash = location.hash;
  const m = /(?:^#|&)key=([^&]+)/.exec(hash);
  if (m) {
    keyCache = decodeURIComponent(m[1]);
    sessionStorage.setItem(KEY, keyCache);
    history.replaceState(null, "", location.pathname + "#/");
    started();
  }
  if (!keyCache) { view = signIn(); return; }
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  document.querySelectorAll("nav a").forEach((a) => a.removeAttribute("aria-current"));
  switch (parts[0]) {
    case "sb": view = sandboxView(parts[1]); break;
    case "tree": view = treeView(parts[1]); break;
    case "diff": view = diffView(parts[1], parts[2]); document.getElementById("nav-diff").setAttribute("aria-current", "page"); break;
    default: view = listView(); document.getElementById("nav-list").setAttribute("aria-current", "page");
  }
  main.focus({ preventScroll: true });
}

document.getElementById("signout").addEventListener("click", () => signOut(""));
window.addEventListener("hashchange", route);
if (keyCache && !/key=/.test(location.hash)) started();
route();
