// ramify console: the diff of two sandboxes (#/diff/<a>/<b>), with a line diff computed here.
"use strict";

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

async function fileText(id, path, b64) {
  const r = await api(sbPath(id, "/files?" + pathQuery(path, b64)), { raw: true });
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

  async function showFile(kind, rawPath, b64) {
    const path = shownName(rawPath);
    fileBox.replaceChildren(h("p", { class: "muted", text: "loading " + path + "…" }));
    try {
      const [ta, tb] = await Promise.all([kind === "added" ? "" : fileText(ia.value, rawPath, b64), kind === "removed" ? "" : fileText(ib.value, rawPath, b64)]);
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
        h("ul", {}, ...d[kind].map((p, i) => {
          const b64 = (d[kind + "_b64"] || [])[i] || null; // the path is not UTF-8: p is a display form
          return h("li", {}, h("button", { type: "button", class: "link mono", "data-path": p, "data-kind": kind, onclick: () => showFile(kind, p, b64), text: sign + " " + shownName(p) }));
        })));
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
