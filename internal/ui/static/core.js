// ramify console: a plain client of the API (no build step, no dependencies). Routes live in the URL's hash:
// #/ sandboxes, #/tree/<family>, #/sb/<id>, #/diff/<a>/<b>. The API key is kept in sessionStorage and sent in the
// Authorization header of every call, the event stream included (read with fetch streaming, not EventSource,
// which cannot send headers). This file is loaded first; list.js, tree.js, sandbox.js and diff.js are the views,
// app.js the routing. They share the page's global scope (plain scripts, no modules and no build step).
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

// File names are bytes. The API gives a name that is not UTF-8 as a display form plus its base64 (path_b64);
// pathQuery names a file by the base64 when there is one. shownName makes control characters visible (a name
// may hold ESC or newlines): "\x1b" is shown as "\x1b", never passed on raw.
function pathQuery(path, b64) {
  return b64 ? "path_b64=" + encodeURIComponent(b64) : "path=" + encodeURIComponent(path);
}

function shownName(s) {
  return String(s).replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
}

// parentBytes is the parent directory of a path held as a binary string (one char per byte); utf8 tells whether
// such bytes are UTF-8, and decodeShown decodes them for display (U+FFFD for what is not).
function parentBytes(bin) {
  return bin.replace(/\/[^/]+\/?$/, "") || "/";
}

function utf8(bin) {
  try { new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))); return true; } catch (e) { return false; }
}

function decodeShown(bin) {
  return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
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
  // A POST carries an idempotency key: when the browser cuts a call (its network changed: a host making sandboxes
  // adds interfaces, a fork's own children's among them), the call is tried once more with the same key, and the
  // server answers what the first one did (or does it, if it never got it) rather than forking twice.
  if (method === "POST") headers["Idempotency-Key"] = idemKey();
  const again = ["GET", "POST", "DELETE"].includes(method); // not a PUT: an upload's body is a stream
  let r;
  try {
    r = await fetch(path, { method, headers, body, signal: opts.signal });
  } catch (e) {
    if (!again || (opts.signal && opts.signal.aborted)) throw e;
    r = await fetch(path, { method, headers, body, signal: opts.signal });
    // A DELETE the server did before its answer was cut finds nothing the second time: it is done.
    if (method === "DELETE" && r.status === 404) return null;
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

// idemKey is a new random idempotency key (crypto.randomUUID needs a secure context; the console may be served
// over plain HTTP from another host).
function idemKey() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return "console-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
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
