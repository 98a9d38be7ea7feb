// ramify console: a sandbox's page (#/sb/<id>).
"use strict";

// renderResults shows a cell's rich results (run_code's results): images as images, HTML in a sandboxed frame
// without scripts (code in the sandbox must not act with the key), anything else as its text.
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

// renderRun shows a run_code answer: stdout, stderr, rich results, the value (unless a richer form of it was
// shown), the error's traceback.
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

// codeCell is the Python cell: run_code on Run or Ctrl+Enter, its output below.
function codeCell(id) {
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

  return h("section", { class: "card" }, h("h2", { text: "Python" }), code,
    h("div", { class: "row" }, runBtn, h("span", { class: "muted", text: "Ctrl+Enter" })), codeOut);
}

// shellBox is the command box: exec with /bin/sh -c, its exit code and output below.
function shellBox(id) {
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

  return [cmdForm, cmdOut];
}

// filesCard is the file browser: list a directory, go into one, download a file, upload into the directory shown.
// Its list function shows the directory.
function filesCard(id) {
  const dir = h("input", { id: "dir", type: "text", value: "/root", "aria-label": "directory" });
  const filesBody = h("tbody");
  const upload = h("input", { type: "file", id: "upload", multiple: true, "aria-label": "upload files" });
  // dirB64: the directory shown, as the API's path_b64, when its name is not UTF-8 (dir.value then holds a
  // display form, which names no file); typing in the box drops it.
  let dirB64 = null;
  dir.addEventListener("input", () => { dirB64 = null; });
  async function listDir() {
    try {
      const r = await api(sbPath(id, "/files/list?" + pathQuery(dir.value, dirB64)));
      const upRaw = (dirB64 ? atob(dirB64) : null);
      const up = dir.value.replace(/\/[^/]+\/?$/, "") || "/";
      const upB64 = upRaw && !utf8(parentBytes(upRaw)) ? btoa(parentBytes(upRaw)) : null;
      const rows = r.entries.map((e) => h("tr", {},
        h("td", {}, e.type === "dir"
          ? h("button", { type: "button", class: "link", onclick: () => { dir.value = e.path; dirB64 = e.path_b64 || (/[\r\n]/.test(e.path) ? btoa(String.fromCharCode(...new TextEncoder().encode(e.path))) : null); listDir(); }, text: shownName(e.name) + "/" })
          : h("span", { class: "mono", text: shownName(e.name) + (e.type === "symlink" ? " → " + shownName(e.link_target) : "") })),
        h("td", { class: "num", text: e.type === "file" ? fmtBytes(e.size) : e.type }),
        h("td", { class: "mono", text: e.mode }),
        h("td", { text: new Date(e.mtime).toLocaleString() }),
        h("td", {}, e.type === "file" ? h("button", { type: "button", class: "link", onclick: () => download(e.path, e.name, e.path_b64), text: "download" }) : "")));
      if (dir.value !== "/") rows.unshift(h("tr", {}, h("td", { colspan: 5 }, h("button", { type: "button", class: "link", onclick: () => { dir.value = upRaw ? decodeShown(parentBytes(upRaw)) : up; dirB64 = upB64; listDir(); }, text: "../" }))));
      filesBody.replaceChildren(...rows);
    } catch (e) { filesBody.replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "error", text: e.message }))); }
  }
  async function download(path, name, b64) {
    try {
      const r = await api(sbPath(id, "/files?" + pathQuery(path, b64)), { raw: true });
      const url = URL.createObjectURL(await r.blob());
      const a = h("a", { href: url, download: name });
      document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) { toast(e.message, true); }
  }
  upload.addEventListener("change", async () => {
    for (const f of upload.files) {
      const path = dir.value.replace(/\/$/, "") + "/" + f.name;
      // Below a directory whose name is not UTF-8: the file's path as bytes (the directory's, then the name's UTF-8).
      const b64 = dirB64 ? btoa(atob(dirB64).replace(/\/$/, "") + "/" + String.fromCharCode(...new TextEncoder().encode(f.name))) : null;
      try { await api(sbPath(id, "/files?" + pathQuery(path, b64)), { method: "PUT", body: f }); toast("uploaded " + shownName(path)); } catch (e) { toast(e.message, true); }
    }
    upload.value = "";
    listDir();
  });

  const el = h("section", { class: "card" }, h("div", { class: "bar" }, h("h2", { text: "Files" }),
    h("form", { class: "row", onsubmit: (e) => { e.preventDefault(); listDir(); } }, dir, h("button", { type: "submit", text: "List" })),
    h("label", { class: "button", for: "upload", tabindex: "0", onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); upload.click(); } }, text: "Upload…" }), upload),
  h("table", { class: "list" }, h("thead", {}, h("tr", {}, ...["name", "size", "mode", "modified", ""].map((c) => h("th", { scope: "col", text: c })))), filesBody));
  return { el, list: listDir };
}

// logsCard shows the sandbox's agent log; its load function fetches it again.
function logsCard(id) {
  const logs = h("pre", { class: "logs", id: "logs" });
  async function loadLogs() {
    try {
      const r = await api(sbPath(id, "/logs"));
      logs.textContent = r.lines.length ? r.lines.map((l) => new Date(l.time).toLocaleTimeString() + " [" + l.source + "] " + l.text).join("\n") : "(no log lines)";
    } catch (e) { logs.textContent = e.message; }
  }

  const el = h("section", { class: "card" }, h("div", { class: "bar" }, h("h2", { text: "Logs" }), h("button", { type: "button", onclick: loadLogs, text: "Refresh" })), logs);
  return { el, load: loadLogs };
}

// sandboxView is a sandbox's page: its facts and buttons (refreshed by its events and every 4 s), usage, the cell,
// the shell, files and logs.
function sandboxView(id) {
  let sb = null;
  let alive = true;
  const head = h("div", { class: "bar" });
  const facts = h("dl", { class: "facts" });
  const actions = h("div", { class: "actions" });
  const usageEl = h("dl", { class: "facts" });

  function act(label, fn, attrs = {}) {
    return h("button", Object.assign({ type: "button", onclick: async (e) => {
      e.target.disabled = true;
      try { await fn(); } catch (ex) { toast(ex.message, true); }
      e.target.disabled = false;
      if (alive) load();
    } }, attrs), label);
  }
  // The actions are redrawn only when what they offer changes (the view reloads every few seconds and on events):
  // a redraw would reset the fork count being typed, the child picked, an armed delete or a click in flight.
  // The fork count's field is the same element throughout.
  const n = h("input", { type: "number", min: 1, max: 32, value: 2, id: "fork-n", "aria-label": "children", class: "n" });
  let drawn = "";
  function drawActions(family) {
    const kids = family.filter((s) => s.parent_id === id && s.status === "running");
    const key = JSON.stringify([sb.status, sb.parent_id, sb.family_id, kids.map((k) => k.id)]);
    if (key === drawn) return;
    drawn = key;
    const picked = actions.querySelector("#merge-child")?.value;
    const pick = h("select", { id: "merge-child", "aria-label": "child to merge" }, ...kids.map((k) => h("option", { value: k.id, text: short(k.id), selected: k.id === picked })));
    const run = sb.status === "running";
    const del = h("button", { type: "button", class: "danger", id: "delete", onclick: async () => {
      if (del.dataset.armed !== "1") {
        del.dataset.armed = "1"; del.textContent = "Really delete?";
        setTimeout(() => { del.dataset.armed = ""; del.textContent = "Delete"; }, 5000); // not armed for ever
        return;
      }
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
      drawn = "";
      return;
    }
    if (!alive) return;
    head.replaceChildren(h("h1", { class: "mono", text: sb.id }), statusBadge(sb.status));
    const f = [["shape", sb.shape], ["image", sb.image || "default"], ["age", fmtAge(sb.created_at)], ["ip", sb.ip], ["family", h("a", { href: "#/tree/" + sb.family_id, text: sb.family_id })],
      ["parent", sb.parent_id ? h("a", { href: "#/sb/" + sb.parent_id, text: sb.parent_id }) : "–"],
      ["timeout", sb.timeout_s ? sb.timeout_s + " s" : "none"], ["metadata", Object.entries(sb.metadata || {}).map(([k, v]) => k + "=" + v).join(" ") || "–"]];
    if (sb.error) f.push(["error", sb.error]);
    if (sb.progress) f.push(["progress", progressText(sb.progress)]);
    facts.replaceChildren(...f.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", {}, v)]));
    const u = sb.usage;
    usageEl.replaceChildren(...(u ? [["memory", fmtBytes(u.mem_bytes) + " of " + sb.mem_mib + " MiB"], ["CPU", u.cpu_seconds.toFixed(2) + " s"], ["processes", u.pids + " of " + sb.max_procs], ["disk", u.disk_bytes === null ? "–" : fmtBytes(u.disk_bytes)], ["OOM kills", u.oom_kills]] : [["usage", "only while running"]]).flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: String(v) })]));
    let family = [];
    try { family = (await api("/v1/sandboxes")).sandboxes.filter((s) => s.family_id === sb.family_id); } catch (e) { /* the actions need no family */ }
    if (alive) drawActions(family);
    // A pause or resume in flight: its progress every half second until it is over (its event redraws then).
    clearTimeout(soon);
    if (alive && (sb.status === "pausing" || sb.status === "resuming")) soon = setTimeout(load, 500);
  }
  let soon;
  let deb;
  const off = events.on((ev) => {
    if (ev.sandbox === id || (ev.children || []).includes(id) || ev.winner === id || (sb && ev.family === sb.family_id)) {
      clearTimeout(deb); deb = setTimeout(load, 100);
    }
  });
  const tick = setInterval(load, 4000);
  const files = filesCard(id);
  const logs = logsCard(id);
  main.replaceChildren(
    h("section", { class: "card" }, head, facts, actions),
    h("div", { class: "cols" }, codeCell(id),
      h("section", { class: "card" }, h("h2", { text: "Usage" }), usageEl, h("h2", { text: "Shell" }), ...shellBox(id))),
    files.el, logs.el);
  load().then(() => { if (sb && sb.status === "running") files.list(); });
  logs.load();
  return () => { alive = false; off(); clearInterval(tick); clearTimeout(deb); clearTimeout(soon); };
}

// progressText renders a pause's or resume's progress: "session: 412.0 MiB (1.8 s)", "files: 12.0 MiB of 1.0 GiB (1%)".
function progressText(p) {
  const moved = p.total_bytes ? fmtBytes(p.bytes) + " of " + fmtBytes(p.total_bytes) + " (" + Math.floor(p.bytes * 100 / p.total_bytes) + "%)" : fmtBytes(p.bytes);
  return p.phase + ": " + moved + " (" + (p.elapsed_ms / 1000).toFixed(1) + " s)";
}
