// Unit tests against a stub server on node:http (no real ramify needed).
import { test, describe, before, after, beforeEach } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import {
  Sandbox,
  RamifyError,
  AuthError,
  InvalidRequest,
  NotFound,
  SandboxNotFound,
  FileNotFound,
  Conflict,
  ServerError,
  TimeoutError,
  ServerUnreachable,
  SandboxDefunct,
  SandboxErrorState,
  PauseFailed,
  ResumeFailed,
  retryPolicy,
  diffPaths,
} from "../dist/index.js";
import { startStub, sendJson, json, info, sleep, ID, ID2, ID3 } from "./helpers/stub.js";

const KEY = "test-key";
let stub;
let opts;

before(async () => {
  stub = await startStub(() => {});
  opts = { apiUrl: stub.url, apiKey: KEY };
  retryPolicy.baseDelayMs = 5;
});
after(async () => {
  await stub.close();
});
beforeEach(() => {
  stub.requests.length = 0;
  stub.handler = (rec, res) => sendJson(res, 500, { error: "no handler" });
});

/** Route table helper: "METHOD /path" -> fn(rec, res). */
function routes(table) {
  return (rec, res) => {
    const fn = table[`${rec.method} ${rec.path}`];
    if (!fn) return sendJson(res, 404, { error: `no such route: ${rec.method} ${rec.path}` });
    return fn(rec, res);
  };
}

async function connected() {
  stub.handler = (rec, res) => sendJson(res, 200, info());
  const sb = await Sandbox.connect(ID, opts);
  stub.requests.length = 0;
  return sb;
}

describe("config and sandboxes", () => {
  test("create sends a snake_case body with the bearer key", async () => {
    stub.handler = routes({ "POST /v1/sandboxes": (rec, res) => sendJson(res, 201, info(ID, "running", { vcpu: 2 })) });
    const sb = await Sandbox.create({
      ...opts,
      vcpu: 2,
      memMib: 512,
      maxProcs: 64,
      timeoutS: 60,
      onTimeout: "pause",
      env: { A: "1" },
      cwd: "/tmp",
      metadata: { k: "v" },
    });
    assert.equal(sb.id, ID);
    assert.equal(sb.info.vcpu, 2);
    const [r] = stub.requests;
    assert.equal(r.headers.authorization, `Bearer ${KEY}`);
    assert.equal(r.headers["content-type"], "application/json");
    assert.match(r.headers["user-agent"], /^ramify-typescript\//);
    assert.deepEqual(json(r), {
      vcpu: 2,
      mem_mib: 512,
      max_procs: 64,
      timeout_s: 60,
      on_timeout: "pause",
      env: { A: "1" },
      cwd: "/tmp",
      metadata: { k: "v" },
    });
  });

  test("create with no options sends an empty object", async () => {
    stub.handler = (rec, res) => sendJson(res, 201, info());
    await Sandbox.create(opts);
    assert.deepEqual(json(stub.requests[0]), {});
  });

  test("create waits while the sandbox is creating", async () => {
    // The server's wait answers at its timeout with the status then; the SDK asks again.
    let waits = 0;
    stub.handler = routes({
      "POST /v1/sandboxes": (rec, res) => sendJson(res, 201, info(ID, "creating"), { "X-Poll-After": "0.01" }),
      [`GET /v1/sandboxes/${ID}/wait`]: (rec, res) => sendJson(res, 200, info(ID, ++waits < 2 ? "creating" : "running")),
    });
    const sb = await Sandbox.create(opts);
    assert.equal(sb.info.status, "running");
    assert.equal(waits, 2);
    assert.equal(stub.requests[1].query.get("status"), "running");
  });

  test("RAMIFY_API_URL and RAMIFY_API_KEY from the environment", async () => {
    const saved = { url: process.env.RAMIFY_API_URL, key: process.env.RAMIFY_API_KEY };
    process.env.RAMIFY_API_URL = stub.url + "/";
    process.env.RAMIFY_API_KEY = "env-key";
    try {
      stub.handler = (rec, res) => sendJson(res, 200, { sandboxes: [info(ID), info(ID2)] });
      const list = await Sandbox.list({ metadata: { team: "a b" }, status: "running" });
      assert.deepEqual(list.map((s) => s.id), [ID, ID2]);
      const [r] = stub.requests;
      assert.equal(r.headers.authorization, "Bearer env-key");
      assert.equal(r.path, "/v1/sandboxes");
      assert.equal(r.query.get("metadata.team"), "a b");
      assert.equal(r.query.get("status"), "running");
    } finally {
      for (const [k, v] of [["RAMIFY_API_URL", saved.url], ["RAMIFY_API_KEY", saved.key]]) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  test("connect, refresh, status, close (idempotent, 404 ignored)", async () => {
    const sb = await connected();
    stub.handler = routes({
      [`GET /v1/sandboxes/${ID}`]: (rec, res) => sendJson(res, 200, info(ID, "paused")),
      [`DELETE /v1/sandboxes/${ID}`]: (rec, res) => sendJson(res, 404, { error: "sandbox not found" }),
    });
    assert.equal(await sb.status(), "paused");
    await sb.close();
    await sb.close();
    assert.equal(stub.requests.filter((r) => r.method === "DELETE").length, 1);
    assert.equal(sb.closed, true);
    await assert.rejects(sb.runCode("1"), SandboxNotFound);
  });
});

describe("errors", () => {
  const cases = [
    [401, "invalid api key", AuthError],
    [400, "n must be between 1 and 32", InvalidRequest],
    [413, "request body too large", InvalidRequest],
    [404, "sandbox not found", SandboxNotFound],
    [409, "sandbox is not running", Conflict],
    [500, "snapshot failed", ServerError],
    [503, "unavailable", ServerError],
    [418, "teapot", RamifyError],
  ];
  for (const [status, message, cls] of cases) {
    test(`${status} -> ${cls.name}`, async () => {
      stub.handler = (rec, res) => sendJson(res, status, { error: message });
      const err = await Sandbox.connect(ID, opts).then(
        () => assert.fail("no error"),
        (e) => e,
      );
      assert.ok(err instanceof cls, `${err} is not ${cls.name}`);
      assert.ok(err instanceof RamifyError);
      assert.equal(err.name, cls.name);
      assert.equal(err.message, message);
      assert.equal(err.status, status);
      assert.deepEqual(err.body, { error: message });
    });
  }

  test("404 on a file route is FileNotFound, unless the sandbox is missing", async () => {
    const sb = await connected();
    stub.handler = (rec, res) => sendJson(res, 404, { error: "no such file: /x" });
    const e = await sb.files.read("/x").catch((e) => e);
    assert.ok(e instanceof FileNotFound && e instanceof NotFound && !(e instanceof SandboxNotFound));
    assert.equal(e.code, "ENOENT");
    assert.equal(await sb.files.exists("/x"), false);
    stub.handler = (rec, res) => sendJson(res, 404, { error: "sandbox not found" });
    await assert.rejects(sb.files.read("/x"), SandboxNotFound);
    // An id the server retired: a deleted one is SandboxNotFound, a merged winner SandboxDefunct (a
    // SandboxNotFound too), on file routes as elsewhere.
    const wid = "sbx_" + "b".repeat(32), pid = "sbx_" + "a".repeat(32);
    stub.handler = (rec, res) => sendJson(res, 404, { error: `sandbox ${wid} was deleted at 2026-11-23T13:05:00Z` });
    await assert.rejects(sb.files.read("/x"), (e) => e instanceof SandboxNotFound && !(e instanceof SandboxDefunct));
    stub.handler = (rec, res) =>
      sendJson(res, 404, { error: `sandbox ${wid} was merged into ${pid} at 2026-11-23T13:05:00Z; use id ${pid}` });
    await assert.rejects(sb.files.read("/x"), (e) => e instanceof SandboxDefunct && e instanceof SandboxNotFound);
    await assert.rejects(sb.runCode("1"), SandboxDefunct);
  });

  test("non-JSON error body keeps the text", async () => {
    stub.handler = (rec, res) => {
      res.writeHead(502, { "Content-Type": "text/plain" });
      res.end("bad gateway\n");
    };
    await assert.rejects(Sandbox.connect(ID, opts), (e) => e instanceof ServerError && e.message === "bad gateway" && e.status === 502);
  });
});

describe("run_code and exec", () => {
  test("runCode sends code and timeout_s and maps the result", async () => {
    const sb = await connected();
    stub.handler = (rec, res) =>
      sendJson(res, 200, {
        stdout: "hi\n",
        stderr: "",
        value: null,
        error: { name: "ZeroDivisionError", value: "division by zero", traceback: "Traceback..." },
        execution_count: 3,
      });
    const r = await sb.runCode("print('hi'); 1/0", { timeoutS: 5 });
    const [req] = stub.requests;
    assert.equal(req.method, "POST");
    assert.equal(req.path, `/v1/sandboxes/${ID}/run_code`);
    assert.deepEqual(json(req), { code: "print('hi'); 1/0", timeout_s: 5 });
    assert.deepEqual(r, {
      stdout: "hi\n",
      stderr: "",
      value: null,
      error: { name: "ZeroDivisionError", value: "division by zero", traceback: "Traceback..." },
      executionCount: 3,
      interrupted: false,
      results: [],
    });
  });

  test("streaming: events are handled as they arrive, callbacks before the result", async () => {
    const sb = await connected();
    let sawFirst;
    const firstSeen = new Promise((r) => (sawFirst = r));
    stub.handler = async (rec, res) => {
      res.writeHead(200, { "Content-Type": "application/x-ndjson" });
      res.write('{"type": "stdout", "data": "a\\n"}\n');
      // The rest is sent only once the client has handled the first event.
      await Promise.race([firstSeen, sleep(3000)]);
      res.write('{"type": "stderr", "data": "warn\\n"}\n{"type": "std');
      await sleep(20);
      res.write('out", "data": "b\\n"}\n\n');
      res.end('{"type": "result", "stdout": "a\\nb\\n", "stderr": "warn\\n", "value": "2", "error": null, "execution_count": 7}\n');
    };
    const events = [];
    const r = await sb.runCode("...", {
      onStdout: (d) => {
        events.push(["out", d]);
        sawFirst();
      },
      onStderr: (d) => events.push(["err", d]),
    });
    events.push(["result", r.value]);
    assert.deepEqual(events, [["out", "a\n"], ["err", "warn\n"], ["out", "b\n"], ["result", "2"]]);
    assert.equal(r.executionCount, 7);
    const req = stub.requests[0];
    assert.equal(json(req).stream, true);
    assert.equal(req.headers.accept, "application/x-ndjson");
  });

  test("streaming: an error event becomes ServerError; a missing result is an error", async () => {
    const sb = await connected();
    stub.handler = (rec, res) => {
      res.writeHead(200, { "Content-Type": "application/x-ndjson" });
      res.end('{"type": "stdout", "data": "x"}\n{"type": "error", "error": "agent died"}\n');
    };
    await assert.rejects(sb.runCode("x", { onStdout: () => {} }), (e) => e instanceof ServerError && e.message === "agent died");
    stub.handler = (rec, res) => {
      res.writeHead(200, { "Content-Type": "application/x-ndjson" });
      res.end('{"type": "stdout", "data": "x"}\n');
    };
    await assert.rejects(sb.runCode("x", { onStdout: () => {} }), /without a result/);
  });

  test("streaming: a plain JSON answer still calls the callbacks", async () => {
    const sb = await connected();
    stub.handler = (rec, res) => sendJson(res, 200, { exit_code: 0, stdout: "o", stderr: "e", timed_out: false });
    const got = [];
    const r = await sb.exec("x", { onStdout: (d) => got.push(d), onStderr: (d) => got.push(d) });
    assert.deepEqual(got, ["o", "e"]);
    assert.equal(r.exitCode, 0);
  });

  test("exec: string cmd, argv, env, cwd, stdin, timeout", async () => {
    const sb = await connected();
    stub.handler = (rec, res) => sendJson(res, 200, { exit_code: 3, stdout: "out", stderr: "err", timed_out: true });
    const r = await sb.exec("echo hi", { env: { A: "1" }, cwd: "/tmp", timeoutS: 2, stdin: "in" });
    assert.deepEqual(r, { exitCode: 3, stdout: "out", stderr: "err", timedOut: true, interrupted: false });
    await sb.exec(["ls", "-l", "/"], { stdin: new TextEncoder().encode("bytes") });
    assert.deepEqual(json(stub.requests[0]), { cmd: "echo hi", env: { A: "1" }, cwd: "/tmp", timeout_s: 2, stdin: "in" });
    assert.deepEqual(json(stub.requests[1]), { argv: ["ls", "-l", "/"], stdin: "bytes" });
    assert.equal(stub.requests[1].path, `/v1/sandboxes/${ID}/exec`);
    await assert.rejects(sb.exec([]), TypeError);
  });

  test("exec streaming ends with the exit event", async () => {
    const sb = await connected();
    stub.handler = (rec, res) => {
      res.writeHead(200, { "Content-Type": "application/x-ndjson" });
      res.end('{"type":"stdout","data":"1"}\n{"type":"stdout","data":"2"}\n{"type":"exit","exit_code":42,"stdout":"12","stderr":"","timed_out":false}\n');
    };
    const out = [];
    const r = await sb.exec("x", { onStdout: (d) => out.push(d) });
    assert.deepEqual(out, ["1", "2"]);
    assert.deepEqual(r, { exitCode: 42, stdout: "12", stderr: "", timedOut: false, interrupted: false });
  });
});

describe("files", () => {
  test("read returns bytes; readText decodes", async () => {
    const sb = await connected();
    const bytes = Buffer.from([0, 1, 2, 255, 254, 0x68, 0x69]);
    stub.handler = (rec, res) => {
      res.writeHead(200, { "Content-Type": "application/octet-stream" });
      res.end(rec.query.get("path") === "/t.txt" ? Buffer.from("héllo") : bytes);
    };
    const got = await sb.files.read("/root/a b.bin");
    assert.ok(got instanceof Uint8Array);
    assert.deepEqual(Buffer.from(got), bytes);
    assert.equal(stub.requests[0].query.get("path"), "/root/a b.bin");
    assert.equal(stub.requests[0].path, `/v1/sandboxes/${ID}/files`);
    assert.equal(await sb.files.readText("/t.txt"), "héllo");
    const chunks = [];
    for await (const c of await sb.files.readStream("/x")) chunks.push(c);
    assert.deepEqual(Buffer.concat(chunks), bytes);
  });

  test("write: string, bytes with mode, and a ReadableStream", async () => {
    const sb = await connected();
    stub.handler = (rec, res) => sendJson(res, 200, { path: rec.query.get("path"), size: rec.body.length });
    assert.deepEqual(await sb.files.write("/a.txt", "hé"), { path: "/a.txt", size: 3 });
    const bytes = new Uint8Array([0, 255, 10, 13]);
    assert.deepEqual(await sb.files.write("/b", bytes, { mode: 0o755 }), { path: "/b", size: 4 });
    const stream = new ReadableStream({
      start(c) {
        c.enqueue(new TextEncoder().encode("chunk1-"));
        c.enqueue(new TextEncoder().encode("chunk2"));
        c.close();
      },
    });
    assert.deepEqual(await sb.files.write("/c", stream, { mode: "0600" }), { path: "/c", size: 13 });
    const [a, b, c] = stub.requests;
    assert.equal(a.method, "PUT");
    assert.equal(a.body.toString(), "hé");
    assert.equal(a.query.get("mode"), null);
    assert.equal(a.headers["content-type"], "application/octet-stream");
    assert.deepEqual([...b.body], [0, 255, 10, 13]);
    assert.equal(b.query.get("mode"), "0755");
    assert.equal(c.body.toString(), "chunk1-chunk2");
    assert.equal(c.query.get("mode"), "0600");
    assert.equal(c.headers["transfer-encoding"], "chunked");
  });

  test("names that are not UTF-8: bytes paths go as path_b64, entries carry the raw bytes", async () => {
    const sb = await connected();
    const latin = { name: "caf\ufffd", name_b64: "Y2Fm6Q==", path: "/root/caf\ufffd", path_b64: "L3Jvb3QvY2Fm6Q==", type: "file",
      size: 1, mode: "0644", mtime: "2026-01-01T00:00:00Z", link_target: "" };
    const utf8 = { name: "café", path: "/root/café", type: "file", size: 1, mode: "0644", mtime: "2026-01-01T00:00:00Z", link_target: "" };
    stub.handler = routes({
      [`GET /v1/sandboxes/${ID}/files/list`]: (rec, res) => sendJson(res, 200, { entries: [utf8, latin] }),
      [`GET /v1/sandboxes/${ID}/files`]: (rec, res) => {
        res.writeHead(200, { "Content-Type": "application/octet-stream" });
        res.end("x");
      },
      [`PUT /v1/sandboxes/${ID}/files`]: (rec, res) => sendJson(res, 200, { path: "/root/caf\ufffd", path_b64: rec.query.get("path_b64"), size: 2 }),
      [`POST /v1/sandboxes/${ID}/files/mkdir`]: (rec, res) => sendJson(res, 200, latin),
      [`GET /v1/sandboxes/${ID}/diff/${ID2}`]: (rec, res) =>
        sendJson(res, 200, { added: ["/root/caf\ufffd", "/root/café"], added_b64: ["L3Jvb3QvY2Fm6Q==", null], removed: [], modified: [] }),
    });
    const [u, l] = await sb.files.list("/root");
    assert.equal(u.pathBytes, undefined);
    assert.deepEqual([...l.nameBytes], [0x63, 0x61, 0x66, 0xe9]);
    await sb.files.read(l.pathBytes ?? l.path);
    await sb.files.read(new TextEncoder().encode("/root/café"));
    const w = await sb.files.write(l.pathBytes, "hi");
    assert.deepEqual([...w.pathBytes], [...new TextEncoder().encode("/root/"), 0x63, 0x61, 0x66, 0xe9]);
    await sb.files.mkdir(new Uint8Array([0x2f, 0x64, 0xe9]));
    const d = await sb.diff(ID2, { paths: ["/root", new Uint8Array([0x2f, 0x64, 0xe9])] });
    const added = diffPaths(d, "added");
    assert.ok(added[0] instanceof Uint8Array && added[0].at(-1) === 0xe9);
    assert.equal(added[1], "/root/café");
    const [, r1, r2, pw, mk, df] = stub.requests;
    assert.equal(r1.query.get("path_b64"), "L3Jvb3QvY2Fm6Q==");
    assert.equal(r1.query.get("path"), null);
    assert.equal(r2.query.get("path"), "/root/café");
    assert.equal(pw.query.get("path_b64"), "L3Jvb3QvY2Fm6Q==");
    assert.deepEqual(JSON.parse(mk.body.toString()), { path_b64: "L2Tp", parents: true });
    assert.deepEqual(df.query.getAll("paths_b64"), ["L3Jvb3Q=", "L2Tp"]);
    assert.deepEqual(df.query.getAll("paths"), []);
  });

  test("list, stat, mkdir, remove", async () => {
    const sb = await connected();
    const entry = { name: "a", path: "/root/a", type: "dir", size: 4096, mode: "0755", mtime: "2026-01-01T00:00:00Z", link_target: "" };
    stub.handler = routes({
      [`GET /v1/sandboxes/${ID}/files/list`]: (rec, res) => sendJson(res, 200, { entries: [entry] }),
      [`GET /v1/sandboxes/${ID}/files/stat`]: (rec, res) => sendJson(res, 200, entry),
      [`POST /v1/sandboxes/${ID}/files/mkdir`]: (rec, res) => sendJson(res, 200, entry),
      [`DELETE /v1/sandboxes/${ID}/files`]: (rec, res) => {
        res.writeHead(204);
        res.end();
      },
    });
    const expected = { name: "a", path: "/root/a", type: "dir", size: 4096, mode: "0755", mtime: "2026-01-01T00:00:00Z", linkTarget: "" };
    assert.deepEqual(await sb.files.list("/root"), [expected]);
    assert.deepEqual(await sb.files.stat("/root/a"), expected);
    assert.deepEqual(await sb.files.mkdir("/root/a"), expected);
    await sb.files.mkdir("/root/b", { parents: false });
    await sb.files.remove("/root/a", { recursive: true });
    await sb.files.remove("/root/f");
    const r = stub.requests;
    assert.equal(r[0].query.get("path"), "/root");
    assert.deepEqual(json(r[2]), { path: "/root/a", parents: true });
    assert.deepEqual(json(r[3]), { path: "/root/b", parents: false });
    assert.equal(r[4].query.get("recursive"), "true");
    assert.equal(r[5].query.get("recursive"), null);
  });
});

describe("fork, merge, diff", () => {
  test("fork returns child sandboxes; mergeInto retires the winner", async () => {
    const sb = await connected();
    stub.handler = routes({
      [`POST /v1/sandboxes/${ID}/fork`]: (rec, res) => sendJson(res, 200, { children: [ID2, ID3], parent_pause_ms: 3 }),
      [`POST /v1/sandboxes/${ID}/merge_into/${ID2}`]: (rec, res) => {
        res.writeHead(204);
        res.end();
      },
      [`GET /v1/sandboxes/${ID}`]: (rec, res) => sendJson(res, 200, info(ID, "running", { ip: "10.0.0.9" })),
      [`DELETE /v1/sandboxes/${ID3}`]: (rec, res) => {
        res.writeHead(204);
        res.end();
      },
    });
    const kids = await sb.fork({ n: 2 });
    assert.deepEqual(json(stub.requests[0]), { n: 2 });
    assert.deepEqual(kids.map((k) => k.id), [ID2, ID3]);
    assert.ok(kids[0] instanceof Sandbox);
    await sb.mergeInto(kids[0]);
    assert.equal(sb.info.ip, "10.0.0.9");
    assert.equal(kids[0].defunct, true);
    const before = stub.requests.length;
    await kids[0].close(); // no-op
    assert.equal(stub.requests.length, before);
    await assert.rejects(kids[0].runCode("1"), SandboxDefunct);
    await assert.rejects(sb.mergeInto(kids[0]), SandboxDefunct);
    await kids[1].close();
    assert.equal(stub.requests.at(-1).method, "DELETE");
    assert.equal(stub.requests.at(-1).path, `/v1/sandboxes/${ID3}`);
  });

  test("fork defaults to n=1; diff passes repeated paths", async () => {
    const sb = await connected();
    stub.handler = routes({
      [`POST /v1/sandboxes/${ID}/fork`]: (rec, res) => sendJson(res, 200, { children: [ID2] }),
      [`GET /v1/sandboxes/${ID}/diff/${ID2}`]: (rec, res) => sendJson(res, 200, { added: ["/root/b"], removed: [], modified: ["/tmp/m"] }),
    });
    const [kid] = await sb.fork();
    assert.deepEqual(json(stub.requests[0]), { n: 1 });
    const d = await sb.diff(kid, { paths: ["/root", "/tmp"] });
    assert.deepEqual(d, { added: ["/root/b"], removed: [], modified: ["/tmp/m"] });
    assert.deepEqual(stub.requests[1].query.getAll("paths"), ["/root", "/tmp"]);
    await sb.diff(ID2);
    assert.deepEqual(stub.requests[2].query.getAll("paths"), []);
  });
});

describe("pause and resume", () => {
  test("pause waits on the server until paused, without sleeping out X-Poll-After", async () => {
    const sb = await connected();
    stub.handler = routes({
      [`POST /v1/sandboxes/${ID}/pause`]: (rec, res) => sendJson(res, 202, info(ID, "pausing"), { "X-Poll-After": "1" }),
      [`GET /v1/sandboxes/${ID}/wait`]: (rec, res) => sendJson(res, 200, info(ID, "paused", { pause: { snapshot_bytes: 10 } })),
    });
    const t0 = Date.now();
    const r = await sb.pause();
    assert.equal(r.status, "paused");
    assert.equal(sb.info.status, "paused");
    assert.ok(Date.now() - t0 < 500, `pause took ${Date.now() - t0}ms`);
    assert.equal(stub.requests.length, 2);
    assert.equal(stub.requests[1].path, `/v1/sandboxes/${ID}/wait`);
    assert.equal(stub.requests[1].query.get("status"), "paused");
    assert.ok(Number(stub.requests[1].query.get("timeout_s")) <= 20);
  });

  test("resume with wait:false returns the 202 body; 200 already-running needs no poll", async () => {
    const sb = await connected();
    stub.handler = (rec, res) => sendJson(res, 202, info(ID, "resuming"), { "X-Poll-After": "1" });
    const r = await sb.resume({ wait: false });
    assert.equal(r.status, "resuming");
    assert.equal(stub.requests.length, 1);
    stub.handler = (rec, res) => sendJson(res, 200, info(ID, "running"));
    await sb.resume();
    assert.equal(stub.requests.length, 2);
    assert.equal(stub.requests[1].path, `/v1/sandboxes/${ID}/resume`);
  });

  test("error status while waiting -> SandboxErrorState; too slow -> TimeoutError", async () => {
    const sb = await connected();
    stub.handler = routes({
      [`POST /v1/sandboxes/${ID}/resume`]: (rec, res) => sendJson(res, 202, info(ID, "resuming"), { "X-Poll-After": "0" }),
      [`GET /v1/sandboxes/${ID}/wait`]: (rec, res) => sendJson(res, 200, info(ID, "error", { error: "snapshot corrupt" })),
    });
    await assert.rejects(sb.resume(), (e) => e instanceof SandboxErrorState && /snapshot corrupt/.test(e.message));
    stub.handler = routes({
      [`POST /v1/sandboxes/${ID}/pause`]: (rec, res) => sendJson(res, 202, info(ID, "pausing"), { "X-Poll-After": "0.05" }),
      [`GET /v1/sandboxes/${ID}/wait`]: (rec, res) =>
        setTimeout(() => sendJson(res, 200, info(ID, "pausing")), Number(rec.query.get("timeout_s")) * 1000),
    });
    await assert.rejects(sb.pause({ pollTimeoutS: 0.3 }), TimeoutError);
  });

  test("a failed pause -> PauseFailed at once, the sandbox running", async () => {
    const sb = await connected();
    stub.handler = routes({
      [`POST /v1/sandboxes/${ID}/pause`]: (rec, res) => sendJson(res, 202, info(ID, "pausing")),
      [`GET /v1/sandboxes/${ID}/wait`]: (rec, res) =>
        sendJson(res, 200, info(ID, "running", { pause: { error: "pause failed: its state is lost" } })),
    });
    const t0 = Date.now();
    await assert.rejects(sb.pause({ pollTimeoutS: 30 }), (e) => e instanceof PauseFailed && /state is lost/.test(e.message));
    assert.ok(Date.now() - t0 < 2000, `the failure took ${Date.now() - t0}ms`);
    assert.equal(sb.info.status, "running");
    assert.equal(stub.requests.length, 2);
  });

  test("a failed resume -> ResumeFailed at once, the sandbox paused again", async () => {
    const sb = await connected();
    stub.handler = routes({
      [`POST /v1/sandboxes/${ID}/resume`]: (rec, res) => sendJson(res, 202, info(ID, "resuming")),
      [`GET /v1/sandboxes/${ID}/wait`]: (rec, res) =>
        sendJson(res, 200, info(ID, "paused", { pause: { error: "resume failed: the store did not answer" } })),
    });
    const t0 = Date.now();
    await assert.rejects(sb.resume({ pollTimeoutS: 30 }), (e) => e instanceof ResumeFailed && /did not answer/.test(e.message));
    assert.ok(Date.now() - t0 < 2000, `the failure took ${Date.now() - t0}ms`);
    assert.equal(sb.info.status, "paused");
    assert.equal(stub.requests.length, 2);
  });

  test("onProgress hears how far a pause has got while it waits", async () => {
    const sb = await connected();
    let waits = 0;
    stub.handler = routes({
      [`POST /v1/sandboxes/${ID}/pause`]: (rec, res) => sendJson(res, 202, info(ID, "pausing")),
      [`GET /v1/sandboxes/${ID}/wait`]: (rec, res) => {
        waits++;
        if (waits < 3) {
          sendJson(res, 200, info(ID, "pausing", { progress: { phase: "session", bytes: waits << 20, elapsed_ms: waits * 500 } }));
        } else {
          sendJson(res, 200, info(ID, "paused"));
        }
      },
    });
    const seen = [];
    const got = await sb.pause({ onProgress: (p) => seen.push(p) });
    assert.equal(got.status, "paused");
    assert.deepEqual(seen.map((p) => p.bytes), [1 << 20, 2 << 20]);
    assert.ok(stub.requests.filter((r) => r.url.includes("/wait")).every((r) => r.url.includes("timeout_s=0.500")));
  });

  test("pause of a running-only state: 409 is Conflict", async () => {
    const sb = await connected();
    stub.handler = (rec, res) => sendJson(res, 409, { error: "sandbox is not running" });
    await assert.rejects(sb.pause(), (e) => e instanceof Conflict && e.message === "sandbox is not running" && e.status === 409);
  });
});

describe("retries and timeouts", () => {
  test("GET is retried after connection errors", async () => {
    let n = 0;
    stub.handler = (rec, res, req) => {
      if (++n <= 2) return req.socket.destroy();
      sendJson(res, 200, info());
    };
    const sb = await Sandbox.connect(ID, opts);
    assert.equal(sb.id, ID);
    assert.equal(n, 3);
  });

  test("DELETE is retried; a POST is retried with its Idempotency-Key", async () => {
    const sb = await connected();
    let n = 0;
    stub.handler = (rec, res, req) => {
      if (++n <= 1) return req.socket.destroy();
      res.writeHead(204);
      res.end();
    };
    await sb.close();
    assert.equal(n, 2);
    // The server took the fork, then the connection broke: the retry carries the same key, so the server
    // answers with the fork it made instead of forking again.
    const sb2 = await connected();
    const keys = [];
    stub.handler = (rec, res, req) => {
      if (req.method !== "POST") return sendJson(res, 200, info(ID2));
      keys.push(req.headers["idempotency-key"]);
      if (keys.length === 1) return req.socket.destroy();
      sendJson(res, 200, { children: [ID2] });
    };
    const kids = await sb2.fork(1);
    assert.deepEqual(kids.map((k) => k.id), [ID2]);
    assert.equal(keys.length, 2);
    assert.ok(keys[0] && keys[0] === keys[1], String(keys));
    // Every call its own key.
    keys.length = 0;
    stub.handler = (rec, res, req) => {
      if (req.method === "POST") keys.push(req.headers["idempotency-key"]);
      sendJson(res, 200, { children: [ID2] });
    };
    await sb2.fork(1);
    await sb2.fork(1);
    assert.equal(new Set(keys).size, 2);
  });

  test("gives up after retryPolicy.maxTries on a refused connection", async () => {
    const port = await new Promise((resolve) => {
      const s = net.createServer();
      s.listen(0, "127.0.0.1", () => {
        const p = s.address().port;
        s.close(() => resolve(p));
      });
    });
    const t0 = Date.now();
    const e = await Sandbox.list({ apiUrl: `http://127.0.0.1:${port}`, apiKey: KEY }).catch((e) => e);
    assert.ok(e instanceof ServerUnreachable, String(e));
    assert.match(e.message, /after 4 tries/);
    assert.ok(Date.now() - t0 >= 5 + 10 + 20);
  });

  test("a request that takes too long is a TimeoutError", async () => {
    stub.handler = async (rec, res) => {
      await sleep(1000);
      sendJson(res, 200, info());
    };
    await assert.rejects(Sandbox.connect(ID, { ...opts, requestTimeoutS: 0.2 }), TimeoutError);
  });
});
