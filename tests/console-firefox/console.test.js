// The web console (internal/ui) in headless Firefox: Debian's firefox-esr driven by puppeteer-core over WebDriver
// BiDi, against a real server (scripts/test-console-firefox starts one with scripts/with-test-server, which exports
// RAMIFY_API_URL and RAMIFY_API_KEY). It signs in by a #key= link, filters the sandbox list by metadata, opens the
// fork tree of a family forked through the API and sees its nodes, sees a later fork appear live, opens a node and
// runs a cell from the page. Any console error or warning or uncaught page exception fails it. Screenshots go to
// $RAMIFY_TEST_ARTIFACTS/console-firefox, else to a temporary directory. The Chromium test is tests/console (Go).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import puppeteer from "puppeteer-core";

const url = process.env.RAMIFY_API_URL;
const key = process.env.RAMIFY_API_KEY;
const firefox = process.env.RAMIFY_FIREFOX || "/usr/bin/firefox-esr";
if (!url || !key) throw new Error("RAMIFY_API_URL and RAMIFY_API_KEY must name a running server (scripts/with-test-server)");

const created = [];
after(async () => {
  // The server is torn down by with-test-server; delete ours anyway, so nothing runs longer than the test.
  for (const id of created.reverse()) await api("DELETE", `/v1/sandboxes/${id}`).catch(() => {});
});

async function api(method, route, body) {
  const res = await fetch(url + route, {
    method,
    headers: { Authorization: `Bearer ${key}`, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${route}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

function artifacts() {
  const base = process.env.RAMIFY_TEST_ARTIFACTS;
  const dir = base ? path.join(base, "console-firefox") : fs.mkdtempSync(path.join(os.tmpdir(), "console-firefox-"));
  fs.mkdirSync(dir, { recursive: true });
  return dir;
}

// shot saves the page once it has settled (the tree's transitions ended).
async function shot(page, dir, name) {
  await page.waitForFunction(() => document.getAnimations().length === 0);
  const file = path.join(dir, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  console.log(`screenshot ${file}`);
}

const node = (id) => `svg.tree g.node[data-id="${id}"]`;

test("the console works in Firefox", { timeout: 5 * 60_000 }, async (t) => {
  const parent = await api("POST", "/v1/sandboxes", { metadata: { suite: "console-firefox" } });
  created.push(parent.id);

  const browser = await puppeteer.launch({
    browser: "firefox",
    executablePath: firefox,
    headless: true,
    defaultViewport: { width: 1366, height: 900 },
  });
  t.after(() => browser.close());
  t.diagnostic(`browser ${await browser.version()} (${firefox})`);
  const page = await browser.newPage();
  page.setDefaultTimeout(60_000); // a real server's fork takes well under that
  const problems = [];
  page.on("console", (msg) => {
    if (msg.type() === "error" || msg.type() === "warn") problems.push(`console.${msg.type()}: ${msg.text()}`);
  });
  page.on("pageerror", (err) => problems.push(`exception: ${err.message ?? err}`));
  const dir = artifacts();

  // Signed in by the link: the list shows the sandbox, and the key leaves the address bar.
  const row = `tr[data-id="${parent.id}"]`;
  await page.goto(`${url}/ui/#key=${key}`);
  await page.waitForSelector(row, { visible: true });
  await page.waitForSelector("#live.on", { visible: true });
  assert.ok(!page.url().includes(key), `the key stayed in the URL: ${page.url()}`);
  await shot(page, dir, "sandboxes");

  // The filter takes the metadata.
  await page.type("#filter", "suite=other");
  await page.waitForSelector(row, { hidden: true });
  await page.$eval("#filter", (el) => { el.value = ""; });
  await page.type("#filter", "suite=console-firefox");
  await page.waitForSelector(row, { visible: true });

  // A fork made through the API, then the family column opens the tree: the parent and both children as SVG nodes.
  // The list redraws on the fork's events and every few seconds; the parent's row stays the same element, so a
  // click on it is not lost to a redraw.
  const before = await page.$(row);
  const { children } = await api("POST", `/v1/sandboxes/${parent.id}/fork`, { n: 2 });
  created.push(...children);
  for (const id of children) await page.waitForSelector(`tr[data-id="${id}"]`, { visible: true });
  await page.waitForFunction((id) => document.querySelector(`tr[data-id="${id}"] td.num`).textContent !== "–", {}, children[0]);
  assert.ok(await before.evaluate((el) => el.isConnected), "the list rebuilt the parent's row on a redraw");
  await page.click(`${row} a[href="#/tree/${parent.family_id}"]`);
  for (const id of [parent.id, ...children]) await page.waitForSelector(node(id), { visible: true });
  const drawn = await page.$$eval("svg.tree g.node", (gs) => gs.map((g) => g.dataset.id).sort());
  assert.deepEqual(drawn, [parent.id, ...children].sort());
  // The tree follows the event stream (fetch streaming): a child's own fork fans out live, under that child.
  const { children: [grandchild] } = await api("POST", `/v1/sandboxes/${children[1]}/fork`, { n: 1 });
  created.push(grandchild);
  await page.waitForSelector(node(grandchild), { visible: true });
  await shot(page, dir, "tree");

  // A node opens its sandbox; a cell run from the page shows its output and its value.
  await page.click(node(children[0]));
  await page.waitForSelector("#code", { visible: true });
  await page.type("#code", "x = 41\nprint('hello from firefox')\nx + 1");
  await page.click("#run");
  await page.waitForSelector("#code-out pre.value", { visible: true });
  assert.equal(await page.$eval("#code-out pre.value", (el) => el.textContent), "42");
  assert.match(await page.$eval("#code-out pre.stdout", (el) => el.textContent), /hello from firefox/);
  await shot(page, dir, "sandbox");

  assert.deepEqual(problems, [], `the console logged errors:\n  ${problems.join("\n  ")}`);
});
