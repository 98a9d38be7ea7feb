// ramify console: the sandbox list (#/).
"use strict";

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
  // draw keeps each sandbox's row and replaces only the cells whose content changed: the list reloads every few
  // seconds and on every event, and a row rebuilt each time would drop a click, a hover or a selection on it.
  let rows = new Map(); // id -> tr
  function draw() {
    const kept = new Map();
    const trs = list.map((sb) => {
      const fresh = row(sb);
      const old = rows.get(sb.id);
      if (!old) { kept.set(sb.id, fresh); return fresh; }
      [...fresh.children].forEach((td, i) => { if (!old.children[i].isEqualNode(td)) old.children[i].replaceWith(td); });
      kept.set(sb.id, old);
      return old;
    });
    rows = kept;
    trs.forEach((tr, i) => { if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null); });
    while (body.children.length > trs.length) body.lastChild.remove();
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
