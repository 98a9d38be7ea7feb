// `ramify mcp` driven by tools nobody on the project wrote: the official MCP TypeScript client
// (@modelcontextprotocol/sdk, which also checks every structured result against the tool's output schema) and the
// MCP inspector's CLI (whose --strict check finds schemas that not every client can read). Needs a real server: RAMIFY_API_URL and RAMIFY_API_KEY (scripts/test-ts starts one), and
// the binary at RAMIFY_TEST_BINARY (default bin/ramify).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";

const here = new URL(".", import.meta.url).pathname;
const bin = process.env.RAMIFY_TEST_BINARY || resolve(here, "../../bin/ramify");
const apiUrl = process.env.RAMIFY_API_URL;
const apiKey = process.env.RAMIFY_API_KEY;
if (!apiUrl || !apiKey) throw new Error("set RAMIFY_API_URL and RAMIFY_API_KEY (run through scripts/test-ts)");

const MAX_TEXT = 32 << 10; // mcpserver.MaxTextBytes

const ALL_TOOLS = ["create_sandbox", "list_sandboxes", "get_sandbox", "destroy_sandbox", "run_code", "exec",
  "read_file", "write_file", "list_files", "fork", "merge_into", "diff", "pause", "resume", "set_timeout",
  "interrupt", "save_template", "list_templates", "delete_template"].sort();

// connect starts `ramify mcp` as a subprocess speaking stdio, with env added to the default environment.
async function connect(env) {
  const transport = new StdioClientTransport({
    command: bin, args: ["mcp"], stderr: "pipe",
    env: { ...getDefaultEnvironment(), RAMIFY_API_URL: apiUrl, RAMIFY_API_KEY: apiKey, ...env },
  });
  let stderr = "";
  transport.stderr?.on("data", (d) => { stderr += d; });
  const client = new Client({ name: "ramify-mcp-test", version: "0" });
  await client.connect(transport);
  return { client, stderr: () => stderr };
}

let session;
const created = new Set(); // sandboxes to destroy whatever happens

before(async () => { session = await connect({}); });

after(async () => {
  for (const id of created) {
    await fetch(`${apiUrl}/v1/sandboxes/${id}`, { method: "DELETE", headers: { Authorization: `Bearer ${apiKey}` } });
  }
  await session?.client.close();
});

// call calls a tool that must succeed and returns its structured result (the client has checked it against the
// tool's output schema); the text content must carry the same JSON.
async function call(name, args) {
  const res = await session.client.callTool({ name, arguments: args });
  const text = res.content.map((c) => c.text ?? "").join("");
  assert.ok(!res.isError, `${name}(${JSON.stringify(args)}) failed: ${text}\nramify mcp stderr: ${session.stderr()}`);
  // The first content is the JSON (run_code's rich results follow it as image and text content).
  assert.deepEqual(JSON.parse(res.content[0].text), res.structuredContent, `${name}: text and structured content differ`);
  return res.structuredContent;
}

// callErr calls a tool that must fail with a tool error (not a protocol error) and returns its message.
async function callErr(name, args, client = session.client) {
  const res = await client.callTool({ name, arguments: args });
  const text = res.content.map((c) => c.text ?? "").join("");
  assert.ok(res.isError, `${name}(${JSON.stringify(args)}) should fail, got ${text}`);
  return text;
}

test("tools/list: every tool, with annotations and the API's enums and bounds", async () => {
  const { tools } = await session.client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), ALL_TOOLS);
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  for (const t of tools) {
    assert.ok(t.description && t.title, `${t.name}: description and title`);
    assert.equal(t.inputSchema.type, "object", `${t.name}: input schema`);
    assert.equal(t.outputSchema?.type, "object", `${t.name}: output schema`);
    const a = t.annotations;
    assert.equal(typeof a?.readOnlyHint, "boolean", `${t.name}: readOnlyHint`);
    assert.equal(typeof a.openWorldHint, "boolean", `${t.name}: openWorldHint`);
    if (!a.readOnlyHint) assert.equal(typeof a.destructiveHint, "boolean", `${t.name}: destructiveHint`);
  }
  for (const name of ["list_sandboxes", "get_sandbox", "read_file", "list_files", "diff"]) {
    assert.deepEqual([byName[name].annotations.readOnlyHint, byName[name].annotations.idempotentHint], [true, true], name);
  }
  const hints = (name) => {
    const a = byName[name].annotations;
    return { destructive: a.destructiveHint, idempotent: a.idempotentHint, openWorld: a.openWorldHint };
  };
  assert.deepEqual(hints("create_sandbox"), { destructive: false, idempotent: false, openWorld: false });
  assert.deepEqual(hints("fork"), { destructive: false, idempotent: false, openWorld: false });
  assert.deepEqual(hints("run_code"), { destructive: true, idempotent: false, openWorld: true });
  assert.deepEqual(hints("exec"), { destructive: true, idempotent: false, openWorld: true });
  assert.deepEqual(hints("merge_into"), { destructive: true, idempotent: false, openWorld: false });
  assert.deepEqual(hints("destroy_sandbox"), { destructive: true, idempotent: true, openWorld: false });

  const prop = (tool, p) => byName[tool].inputSchema.properties[p];
  assert.deepEqual(prop("create_sandbox", "on_timeout").enum, ["destroy", "pause"]);
  assert.deepEqual(prop("list_sandboxes", "status").enum, ["creating", "running", "pausing", "paused", "resuming", "error"]);
  assert.deepEqual([prop("fork", "n").minimum, prop("fork", "n").maximum, prop("fork", "n").default], [1, 32, 1]);
  for (const tool of ["run_code", "exec"]) {
    assert.deepEqual([prop(tool, "timeout_s").minimum, prop(tool, "timeout_s").maximum], [0, 86400], tool);
  }
  assert.equal(prop("pause", "wait").default, true);
  assert.equal(prop("resume", "wait").default, true);
  assert.deepEqual(byName.run_code.inputSchema.required.sort(), ["code", "id"]);
});

test("a session: create, run_code, files (relative and absolute), exec, fork, diff, merge, pause, resume, delete", async () => {
  const sb = await call("create_sandbox", { metadata: { suite: "mcp-node" } });
  created.add(sb.id);
  assert.equal(sb.status, "running");
  assert.equal(sb.cwd, "/root");
  const id = sb.id;

  // run_code: the interpreter persists.
  assert.equal((await call("run_code", { id, code: "x = 21\nprint('set')" })).stdout, "set\n");
  const r = await call("run_code", { id, code: "x * 2", timeout_s: 30 });
  assert.equal(r.value, "42");
  assert.equal(r.error, null);
  assert.equal((await call("run_code", { id, code: "1/0" })).error.name, "ZeroDivisionError");
  // Rich results: a chart comes back as image content, a Markdown display as text.
  const chart = await session.client.callTool({ name: "run_code", arguments: { id,
    code: "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nfrom IPython.display import Markdown\ndisplay(Markdown('*md*'))" } });
  assert.deepEqual(chart.content.map((c) => c.type), ["text", "image", "text"]);
  assert.equal(chart.content[1].mimeType, "image/png");
  assert.equal(Buffer.from(chart.content[1].data, "base64").subarray(1, 4).toString(), "PNG");
  assert.equal(chart.content[2].text, "*md*");
  assert.deepEqual(chart.structuredContent.results.map((x) => x.type), ["display_data", "display_data"]);

  // Files: a relative path is relative to the sandbox's cwd (/root), as exec and the interpreter see it.
  let w = await call("write_file", { id, path: "notes/a.txt", content: "relative\n" });
  assert.deepEqual(w, { path: "/root/notes/a.txt", size: 9 });
  w = await call("write_file", { id, path: "/tmp/b.txt", content: "absolute\n" });
  assert.equal(w.path, "/tmp/b.txt");
  let rf = await call("read_file", { id, path: "/root/notes/a.txt" });
  assert.equal(rf.content, "relative\n");
  rf = await call("read_file", { id, path: "./notes/../notes/a.txt" });
  assert.deepEqual([rf.path, rf.content, rf.base64, rf.size], ["/root/notes/a.txt", "relative\n", false, 9]);
  assert.equal((await call("read_file", { id, path: "/tmp/b.txt" })).content, "absolute\n");
  assert.equal((await call("run_code", { id, code: "open('notes/a.txt').read()" })).value, "'relative\\n'");
  assert.deepEqual((await call("list_files", { id, path: "notes" })).entries.map((e) => e.name), ["a.txt"]);
  const cwdList = await call("list_files", { id });
  assert.equal(cwdList.path, "/root");
  assert.ok(cwdList.entries.some((e) => e.name === "notes" && e.type === "dir"));
  assert.match(await callErr("read_file", { id, path: "notes/missing.txt" }), /not found|no such/i);

  // exec: cmd with env, argv, and a cwd relative to the sandbox's.
  let ex = await call("exec", { id, cmd: "echo $GREETING; echo oops >&2; exit 3", env: { GREETING: "hi" } });
  assert.deepEqual([ex.exit_code, ex.stdout, ex.stderr], [3, "hi\n", "oops\n"]);
  ex = await call("exec", { id, argv: ["pwd"], cwd: "notes" });
  assert.equal(ex.stdout, "/root/notes\n");
  assert.match(await callErr("exec", { id }), /cmd/);

  // Large outputs are cut, with a note saying how much and where the whole output is.
  ex = await call("exec", { id, cmd: "python3 -c \"import sys; sys.stdout.write(''.join('%07d\\n' % i for i in range(25000)))\"" });
  assert.equal(ex.exit_code, 0);
  assert.ok(ex.stdout.length < MAX_TEXT + 1024, `exec stdout is ${ex.stdout.length} bytes`);
  assert.ok(ex.stdout.startsWith("0000000\n") && ex.stdout.endsWith("0024999\n"), "keeps the start and the end");
  assert.equal(ex.truncated.length, 1);
  const cut = ex.truncated[0];
  assert.equal(cut.field, "stdout");
  assert.equal(cut.bytes, 200000);
  assert.match(ex.stdout, new RegExp(`${cut.cut} bytes were cut.*read_file`));
  // ... and the rest is read with read_file's offset and limit.
  rf = await call("read_file", { id, path: cut.saved_to, offset: 80000, limit: 16 });
  assert.deepEqual([rf.content, rf.size, rf.next_offset], ["0010000\n0010001\n", 200000, 80016]);
  let whole = "";
  for (let off = 0; off !== undefined;) {
    const part = await call("read_file", { id, path: cut.saved_to, offset: off, limit: 65536 });
    whole += part.content;
    off = part.next_offset;
  }
  assert.equal(whole.length, 200000);
  assert.ok(whole.endsWith("0024999\n"));
  // A read without a limit returns at most MaxTextBytes, and says where to go on.
  rf = await call("read_file", { id, path: cut.saved_to });
  assert.deepEqual([rf.length, rf.next_offset], [MAX_TEXT, MAX_TEXT]);
  const big = await call("run_code", { id, code: "print('y' * 200000)\n'z' * 100000" });
  assert.deepEqual(big.truncated.map((t) => t.field).sort(), ["stdout", "value"]);
  assert.ok(big.stdout.length < MAX_TEXT + 1024 && big.value.length < MAX_TEXT + 1024);
  // The saved outputs are outside the directories diff compares by default.
  assert.ok(big.truncated.every((t) => t.saved_to.startsWith("/var/tmp/")));

  // fork, change the children, diff them, merge one back.
  const { children } = await call("fork", { id, n: 2 });
  assert.equal(children.length, 2);
  children.forEach((c) => created.add(c));
  const [c1, c2] = children;
  await call("run_code", { id: c1, code: "x = 1\nopen('/root/one.txt', 'w').write('1')" });
  await call("run_code", { id: c2, code: "x = 2\nopen('/root/two.txt', 'w').write('2')" });
  await call("write_file", { id: c2, path: "notes/a.txt", content: "changed\n" });
  const d = await call("diff", { a: c1, b: c2 });
  assert.deepEqual(d, { added: ["/root/two.txt"], removed: ["/root/one.txt"], modified: ["/root/notes/a.txt"] });
  assert.deepEqual(await call("merge_into", { parent: id, winner: c2 }), { parent: id, winner: c2, merged: true });
  assert.equal((await call("run_code", { id, code: "(x, open('two.txt').read())" })).value, "(2, '2')");
  // The winner's id is retired: the error says where its state went.
  const msg = await callErr("get_sandbox", { id: c2 });
  assert.match(msg, new RegExp(`${c2} was merged into ${id}`));
  assert.match(await callErr("run_code", { id: c2, code: "x" }), new RegExp(`use id ${id}`));
  await call("destroy_sandbox", { id: c1 });

  // pause and resume wait by default; wait=false returns at once.
  assert.equal((await call("pause", { id })).status, "paused");
  assert.equal((await call("get_sandbox", { id })).status, "paused");
  const resuming = await call("resume", { id, wait: false });
  assert.ok(["resuming", "running"].includes(resuming.status), resuming.status);
  assert.equal((await call("resume", { id })).status, "running");
  assert.equal((await call("run_code", { id, code: "x" })).value, "2");

  // run_code env is for that call only; set_timeout moves the deadline; interrupt stops a cell in flight.
  assert.equal((await call("run_code", { id, code: "import os; os.environ['E']", env: { E: "e" } })).value, "'e'");
  assert.equal((await call("run_code", { id, code: "os.environ.get('E')" })).value, null);
  const kept = await call("set_timeout", { id, timeout_s: 3600 });
  assert.equal(kept.timeout_s, 3600);
  assert.ok(kept.expires_at, "set_timeout sets expires_at");
  assert.equal((await call("set_timeout", { id, timeout_s: 0 })).expires_at, null);
  const stuck = call("run_code", { id, code: "import time\nwhile True: time.sleep(0.05)" });
  let stopped = { run_code: 0, exec: 0 };
  for (let i = 0; i < 500 && stopped.run_code === 0; i++) {
    stopped = await call("interrupt", { id, what: "run_code" }); // until the cell is in flight
  }
  assert.deepEqual(stopped, { run_code: 1, exec: 0 });
  assert.equal((await stuck).error.name, "KeyboardInterrupt");
  assert.equal((await call("run_code", { id, code: "x" })).value, "2");

  const ls = await call("list_sandboxes", { metadata: { suite: "mcp-node" }, status: "running" });
  assert.deepEqual(ls.sandboxes.map((s) => s.id), [id]);

  assert.deepEqual(await call("destroy_sandbox", { id }), { id, destroyed: true });
  assert.match(await callErr("get_sandbox", { id }), /was deleted at/);
});

test("errors a model can act on", async () => {
  // An id that never existed.
  const unknown = await callErr("run_code", { id: "sbx_nope", code: "1" });
  assert.match(unknown, /sandbox not found/);
  assert.match(unknown, /merge_into/);
  // Arguments outside the schema are refused by the server before any call.
  assert.match(await callErr("fork", { id: "sbx_nope", n: 33 }), /maximum|32/);
  assert.match(await callErr("list_sandboxes", { status: "bogus" }), /enum|status/);
  assert.match(await callErr("create_sandbox", { on_timeout: "explode" }), /enum|on_timeout/);
  assert.match(await callErr("run_code", { code: "1" }), /id/);
  // A server that is not there: say how to start one or point at one.
  const down = await connect({ RAMIFY_API_URL: "http://127.0.0.1:1" });
  try {
    const m = await callErr("list_sandboxes", {}, down.client);
    assert.match(m, /cannot reach the ramify server at http:\/\/127\.0\.0\.1:1/);
    assert.match(m, /ramify serve/);
    assert.match(m, /make run/);
    assert.match(m, /RAMIFY_API_URL/);
  } finally {
    await down.client.close();
  }
  // A wrong key.
  const wrong = await connect({ RAMIFY_API_KEY: "wrong" });
  try {
    assert.match(await callErr("list_sandboxes", {}, wrong.client), /RAMIFY_API_KEY/);
  } finally {
    await wrong.client.close();
  }
});

// The MCP inspector's CLI (headless) against the same server: it lists the tools with its schema portability check
// (--strict exits 6 on an error-severity problem and prints warnings) and calls tools. Its package declares
// Node >= 22.19, but the CLI runs on the build machines' Node 20 (this test would show it if it stopped).
test("the MCP inspector's CLI", async () => {
  const run = promisify(execFile);
  const inspector = resolve(here, "node_modules/.bin/mcp-inspector");
  const catalog = mkdtempSync(join(tmpdir(), "ramify-mcp-inspector-"));
  const env = { ...process.env, MCP_CATALOG_PATH: join(catalog, "mcp.json") };
  const target = ["-e", `RAMIFY_API_URL=${apiUrl}`, "-e", `RAMIFY_API_KEY=${apiKey}`, bin, "mcp"];
  try {
    const list = await run(inspector, ["--cli", "--method", "tools/list", "--strict", ...target], { env });
    assert.deepEqual(JSON.parse(list.stdout).tools.map((t) => t.name).sort(), ALL_TOOLS);
    // Quiet when every schema is portable: it prints "N errors, M warnings" otherwise.
    assert.doesNotMatch(list.stderr, /warning|error/i);
    const made = await run(inspector, ["--cli", "--method", "tools/call", "--tool-name", "create_sandbox",
      "--tool-arg", "cwd=/tmp", ...target], { env });
    const sb = JSON.parse(made.stdout).structuredContent;
    created.add(sb.id);
    assert.equal(sb.cwd, "/tmp");
    const destroyed = await run(inspector, ["--cli", "--method", "tools/call", "--tool-name", "destroy_sandbox",
      "--tool-arg", `id=${sb.id}`, ...target], { env });
    assert.equal(JSON.parse(destroyed.stdout).structuredContent.destroyed, true);
  } finally {
    rmSync(catalog, { recursive: true, force: true });
  }
});
