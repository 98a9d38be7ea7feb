// ramify console: routing (the hash names the view); loaded last, after the views.
"use strict";

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
