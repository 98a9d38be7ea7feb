// ramify console: the fork tree of a family (#/tree/<family>), live from the event stream.
"use strict";

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
