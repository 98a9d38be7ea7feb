// Integration tests against a real ramify server: run when RAMIFY_API_URL and RAMIFY_API_KEY are set
// (scripts/test-ts starts one), skipped otherwise. Fork/merge/diff tests also need RAMIFY_TEST_FORK=1
// and pause/resume tests RAMIFY_TEST_PAUSE=1 (scripts/test-ts sets both).
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, writeFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import http from "node:http";
import { createHash } from "node:crypto";
import {
  Sandbox,
  AuthError,
  Conflict,
  FileNotFound,
  InvalidRequest,
  NotFound,
  SandboxDefunct,
  SandboxNotFound,
} from "../dist/index.js";

const HAVE_SERVER = Boolean(process.env.RAMIFY_API_URL && process.env.RAMIFY_API_KEY);
const SKIP = HAVE_SERVER ? false : "set RAMIFY_API_URL and RAMIFY_API_KEY (scripts/test-ts does)";
const FORK = HAVE_SERVER && process.env.RAMIFY_TEST_FORK === "1" ? false : SKIP || "set RAMIFY_TEST_FORK=1";
const PAUSE = HAVE_SERVER && process.env.RAMIFY_TEST_PAUSE === "1" ? false : SKIP || "set RAMIFY_TEST_PAUSE=1";
const META = { suite: "ts-sdk-integration" };

/** An authorized_keys line for the ed25519 public key of 32 bytes `fill` (any 32 bytes make a parseable key). */
function ed25519Line(fill, comment) {
  const str = (b) => Buffer.concat([Buffer.from([0, 0, 0, b.length]), b]);
  const blob = Buffer.concat([str(Buffer.from("ssh-ed25519")), str(Buffer.alloc(32, fill))]);
  return `ssh-ed25519 ${blob.toString("base64")} ${comment}`;
}

/** The key's SHA256 fingerprint, as ssh-keygen -l prints it. */
function fingerprint(line) {
  const blob = Buffer.from(line.split(" ")[1], "base64");
  return "SHA256:" + createHash("sha256").update(blob).digest("base64").replace(/=+$/, "");
}

/** Run fn with a fresh sandbox, closing it afterwards. */
async function withSandbox(fn, opts = {}) {
  const sb = await Sandbox.create({ metadata: META, ...opts });
  try {
    return await fn(sb);
  } finally {
    await sb.close();
  }
}

describe("integration: sandboxes", { skip: SKIP }, () => {
  test("create and close", async () => {
    const sb = await Sandbox.create({ metadata: META, env: { GREETING: "hi" } });
    assert.match(sb.id, /^sbx_[0-9a-f]{32}$/);
    assert.equal(sb.info.status, "running");
    assert.deepEqual(sb.info.metadata, META);
    const listed = await Sandbox.list({ metadata: META });
    assert.ok(listed.some((s) => s.id === sb.id));
    const again = await Sandbox.connect(sb.id);
    assert.equal(again.info.ip, sb.info.ip);
    assert.equal((await sb.exec("echo $GREETING")).stdout, "hi\n");
    await sb.close();
    await sb.close(); // idempotent
    await assert.rejects(Sandbox.connect(sb.id), SandboxNotFound);
  });

  test("errors: bad key, unknown id, bad value", async () => {
    await assert.rejects(Sandbox.list({ apiKey: "wrong" }), (e) => e instanceof AuthError && e.status === 401 && e.message === "invalid api key");
    await assert.rejects(
      Sandbox.connect("sbx_00000000000000000000000000000000"),
      (e) => e instanceof SandboxNotFound && e.status === 404 && e.message === "sandbox not found",
    );
    await assert.rejects(Sandbox.connect("nope"), SandboxNotFound);
    await assert.rejects(Sandbox.create({ memMib: 1 }), (e) => e instanceof InvalidRequest && e.status === 400);
  });
});

describe("integration: run_code and exec", { skip: SKIP }, () => {
  test("runCode persistence, values, exceptions", () =>
    withSandbox(async (sb) => {
      await sb.runCode("x = 20\ndef f(y): return x + y");
      const r = await sb.runCode("f(22)");
      assert.equal(r.value, "42");
      assert.equal(r.error, null);
      assert.ok(r.executionCount >= 2);
      const p = await sb.runCode("print('out'); import sys; print('err', file=sys.stderr)");
      assert.equal(p.stdout, "out\n");
      assert.equal(p.stderr, "err\n");
      assert.equal(p.value, null);
      const e = await sb.runCode("1/0");
      assert.equal(e.error.name, "ZeroDivisionError");
      assert.equal(e.error.value, "division by zero");
      assert.match(e.error.traceback, /Traceback/);
      const t = await sb.runCode("import time\nwhile True: time.sleep(0.05)", { timeoutS: 1 });
      assert.equal(t.error.name, "TimeoutError");
      assert.equal((await sb.runCode("x")).value, "20");
    }));

  test("streaming callbacks arrive before the result, in order", () =>
    withSandbox(async (sb) => {
      const events = [];
      const t0 = Date.now();
      const r = await sb.runCode("import time, sys\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\nprint('e', file=sys.stderr, flush=True)\n'done'", {
        onStdout: (d) => events.push(["out", d, Date.now() - t0]),
        onStderr: (d) => events.push(["err", d, Date.now() - t0]),
      });
      const end = Date.now() - t0;
      assert.equal(r.value, "'done'");
      assert.equal(events.filter((e) => e[0] === "out").map((e) => e[1]).join(""), "0\n1\n2\n");
      assert.equal(events.filter((e) => e[0] === "err").map((e) => e[1]).join(""), "e\n");
      assert.equal(r.stdout, "0\n1\n2\n");
      // The first chunk was delivered well before the call finished (streamed, not buffered).
      assert.ok(events[0][2] < end - 400, `first event at ${events[0][2]}ms, end at ${end}ms`);
      const out = [];
      const x = await sb.exec("echo a; sleep 0.2; echo b >&2; exit 3", { onStdout: (d) => out.push(d), onStderr: (d) => out.push(d) });
      assert.equal(out.join(""), "a\nb\n");
      assert.equal(x.exitCode, 3);
    }));

  test("rich results: a chart saved as PNG, a DataFrame's HTML, display() streamed in order", () =>
    withSandbox(async (sb) => {
      const r = await sb.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()");
      assert.deepEqual(r.results.map((x) => x.type), ["display_data"]);
      const png = r.results[0].png;
      assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
      assert.ok(r.results[0].formats().includes("image/png"));
      const dir = await mkdtemp(join(tmpdir(), "ramify-rich-"));
      try {
        const path = await r.results[0].save(join(dir, "chart.png"));
        assert.deepEqual(new Uint8Array(await readFile(path)), png);
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
      const df = await sb.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})");
      assert.equal(df.results[0].type, "execute_result");
      assert.match(df.results[0].html, /<table/);
      assert.equal(df.results[0].text, df.value);
      assert.equal(df.results[0].png, undefined);
      const seen = [];
      const s = await sb.runCode("print('a')\ndisplay({'k': 1})\nfrom IPython.display import JSON\ndisplay(JSON([1]))\nprint('b')", {
        onStdout: (d) => seen.push(d),
        onResult: (x) => seen.push(x),
      });
      assert.deepEqual(seen.map((x) => (typeof x === "string" ? x : x.text ?? "")).join(""), "a\n{'k': 1}<IPython.core.display.JSON object>b\n");
      assert.deepEqual(seen.filter((x) => typeof x !== "string")[1].json, [1]);
      assert.equal(s.results.length, 2);
    }));

  test("runCode env is for that call only; tracebacks show the cell's lines", () =>
    withSandbox(async (sb) => {
      await sb.runCode("import os; os.environ['KEEP'] = 'before'");
      const r = await sb.runCode("import os; (os.environ['KEEP'], os.environ['ONLY'])", { env: { KEEP: "during", ONLY: "x" } });
      assert.equal(r.value, "('during', 'x')");
      assert.equal((await sb.runCode("import os; (os.environ['KEEP'], os.environ.get('ONLY'))")).value, "('before', None)");
      await sb.runCode("def half(v):\n    return v / 0\n");
      const e = await sb.runCode("half(4)");
      assert.match(e.error.traceback, /File "<cell \d+>", line 2, in half\n    return v \/ 0/);
      assert.doesNotMatch(e.error.traceback, /repl/);
    }));

  test("sshPubkeys at create, addSshKeys later", async () => {
    const k1 = ed25519Line(1, "one@test");
    const k2 = ed25519Line(2, "two@test");
    await assert.rejects(Sandbox.create({ metadata: META, sshPubkeys: ["ssh-ed25519 not-a-key"] }), InvalidRequest);
    await withSandbox(async (sb) => {
      assert.deepEqual(sb.info.ssh.keys.map((k) => k.fingerprint), [fingerprint(k1)]);
      assert.equal(sb.info.ssh.keys[0].comment, "one@test");
      // scripts/with-test-server runs the server with --ssh-listen
      assert.ok(sb.info.ssh.command.startsWith("ssh -p ") && sb.info.ssh.command.includes(`${sb.id}@`), sb.info.ssh.command);
      const info = await sb.addSshKeys([k2, k1]); // k1 again: skipped
      assert.deepEqual(info.ssh.keys.map((k) => k.fingerprint), [fingerprint(k1), fingerprint(k2)]);
      assert.equal((await sb.refresh()).ssh.keys.length, 2);
      await assert.rejects(sb.addSshKeys("nonsense"), InvalidRequest);
    }, { sshPubkeys: [k1] });
  });

  test("setTimeout keeps the sandbox alive from now", () =>
    withSandbox(async (sb) => {
      const first = sb.info.expires_at;
      const info = await sb.setTimeout(3600);
      assert.equal(info.timeout_s, 3600);
      assert.ok(Date.parse(info.expires_at) > Date.parse(first), `${info.expires_at} after ${first}`);
      assert.equal((await sb.refresh()).expires_at, info.expires_at);
      assert.equal((await sb.setTimeout(0)).expires_at, null);
      await assert.rejects(sb.setTimeout(-1), InvalidRequest);
      await assert.rejects(sb.setTimeout(1.5), TypeError);
    }, { timeoutS: 30 }));

  test("interrupt stops a running cell, keeping its variables, and a running exec", () =>
    withSandbox(async (sb) => {
      await sb.runCode("x = 'kept'");
      let started;
      const running = new Promise((resolve) => (started = resolve));
      const cell = sb.runCode("import time\nprint('started', flush=True)\nwhile True: time.sleep(0.05)", { onStdout: () => started() });
      await running;
      assert.deepEqual(await sb.interrupt("run_code"), { runCode: 1, exec: 0 });
      const r = await cell;
      assert.equal(r.error.name, "KeyboardInterrupt");
      assert.equal(r.interrupted, true);
      assert.equal((await sb.runCode("x")).value, "'kept'");
      let began;
      const execRunning = new Promise((resolve) => (began = resolve));
      const cmd = sb.exec("echo started; sleep 600", { onStdout: () => began() });
      await execRunning;
      assert.deepEqual(await sb.interrupt(), { runCode: 0, exec: 1 });
      const x = await cmd;
      assert.equal(x.interrupted, true);
      await assert.rejects(sb.interrupt("everything"), TypeError);
    }));

  test("exec: exit codes, argv, env, cwd, stdin, timeout", () =>
    withSandbox(async (sb) => {
      assert.deepEqual(await sb.exec("echo hi"), { exitCode: 0, stdout: "hi\n", stderr: "", timedOut: false, interrupted: false });
      assert.equal((await sb.exec("exit 7")).exitCode, 7);
      assert.equal((await sb.exec(["sh", "-c", "kill -9 $$"])).exitCode, 137);
      assert.equal((await sb.exec(["printf", "%s|", "a b", "c"])).stdout, "a b|c|");
      const r = await sb.exec("echo $FOO; pwd; cat", { env: { FOO: "bar" }, cwd: "/tmp", stdin: "input" });
      assert.equal(r.stdout, "bar\n/tmp\ninput");
      const t = await sb.exec("sleep 30", { timeoutS: 1 });
      assert.equal(t.timedOut, true);
    }));
});

describe("integration: ingress", { skip: SKIP }, () => {
  test("url and apiUrl reach a server inside the sandbox", () =>
    withSandbox(
      async (sb) => {
        assert.equal(sb.info.ingress.enabled, true);
        // Bound, then detached: the port listens when exec returns.
        const r = await sb.exec(
          "mkdir -p /srv && echo hi-from-sandbox > /srv/hello.txt && python3 -c \"import http.server, os, functools; " +
            "s = http.server.ThreadingHTTPServer(('0.0.0.0', 8000), functools.partial(http.server.SimpleHTTPRequestHandler, " +
            "directory='/srv')); os.fork() and os._exit(0); os.setsid(); s.serve_forever()\" </dev/null >/dev/null 2>&1",
        );
        assert.equal(r.exitCode, 0);
        const u = new URL(await sb.url(8000));
        assert.equal(u.hostname, `8000-${sb.id.slice(4)}.localhost`);
        // *.localhost is loopback; connect to 127.0.0.1 with the ingress Host (fetch cannot set Host).
        const body = await new Promise((resolve, reject) => {
          http
            .get({ host: "127.0.0.1", port: u.port, path: "/hello.txt", headers: { Host: u.host } }, (res) => {
              let b = "";
              res.on("data", (c) => (b += c));
              res.on("end", () => resolve(`${res.statusCode} ${b}`));
            })
            .on("error", reject);
        });
        assert.equal(body, "200 hi-from-sandbox\n");
        const res = await fetch((await sb.apiUrl(8000)) + "hello.txt", {
          headers: { Authorization: `Bearer ${process.env.RAMIFY_API_KEY}` },
        });
        assert.equal(`${res.status} ${await res.text()}`, "200 hi-from-sandbox\n");
      },
      { ingressEnabled: true },
    ));

  test("url of a sandbox without ingress throws", () =>
    withSandbox(async (sb) => {
      await assert.rejects(sb.url(8000), /without ingressEnabled/);
    }));
});

describe("integration: files", { skip: SKIP }, () => {
  test("binary round trip, text, streams, local files", () =>
    withSandbox(async (sb) => {
      const bytes = new Uint8Array(3 * 1024 * 1024 + 17);
      for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7 + (i >> 8)) & 0xff;
      const w = await sb.files.write("/root/data/blob.bin", bytes, { mode: 0o600 });
      assert.deepEqual(w, { path: "/root/data/blob.bin", size: bytes.length });
      const back = await sb.files.read("/root/data/blob.bin");
      assert.equal(back.length, bytes.length);
      assert.ok(Buffer.from(back).equals(Buffer.from(bytes)));
      assert.equal((await sb.files.stat("/root/data/blob.bin")).mode, "0600");
      assert.equal((await sb.runCode("len(open('/root/data/blob.bin','rb').read())")).value, String(bytes.length));

      await sb.files.write("/root/t.txt", "héllo ✓");
      assert.equal(await sb.files.readText("/root/t.txt"), "héllo ✓");

      const enc = new TextEncoder();
      const stream = new ReadableStream({
        start(c) {
          for (let i = 0; i < 5; i++) c.enqueue(enc.encode(`line ${i}\n`));
          c.close();
        },
      });
      await sb.files.write("/root/s.txt", stream);
      const chunks = [];
      for await (const c of await sb.files.readStream("/root/s.txt")) chunks.push(c);
      assert.equal(Buffer.concat(chunks).toString(), "line 0\nline 1\nline 2\nline 3\nline 4\n");

      const dir = await mkdtemp(join(tmpdir(), "ramify-ts-"));
      try {
        await writeFile(join(dir, "up.bin"), Buffer.from(bytes.subarray(0, 100000)));
        await sb.files.uploadFile(join(dir, "up.bin"), "/root/up.bin");
        assert.equal(await sb.files.downloadFile("/root/up.bin", join(dir, "down.bin")), 100000);
        assert.ok((await readFile(join(dir, "down.bin"))).equals(Buffer.from(bytes.subarray(0, 100000))));
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    }));

  test("list, stat, mkdir, remove, missing files", () =>
    withSandbox(async (sb) => {
      const d = await sb.files.mkdir("/root/d/e");
      assert.equal(d.type, "dir");
      await sb.files.write("/root/d/b.txt", "b");
      await sb.files.write("/root/d/a.txt", "aa");
      const names = (await sb.files.list("/root/d")).map((e) => [e.name, e.type]);
      assert.deepEqual(names, [["a.txt", "file"], ["b.txt", "file"], ["e", "dir"]]);
      const st = await sb.files.stat("/root/d/a.txt");
      assert.equal(st.size, 2);
      assert.equal(st.path, "/root/d/a.txt");
      assert.equal(await sb.files.exists("/root/d/a.txt"), true);
      await sb.files.remove("/root/d/a.txt");
      assert.equal(await sb.files.exists("/root/d/a.txt"), false);
      await assert.rejects(sb.files.read("/root/d/a.txt"), FileNotFound);
      await assert.rejects(sb.files.read("/root/d"), InvalidRequest);
      await assert.rejects(sb.files.read("relative"), InvalidRequest);
      await sb.files.remove("/root/d", { recursive: true });
      assert.equal(await sb.files.exists("/root/d"), false);
    }));
});

describe("integration: fork, diff, mergeInto", { skip: FORK }, () => {
  test("fork inherits memory and files, children are isolated", () =>
    withSandbox(async (parent) => {
      await parent.runCode("x = 42; import json");
      await parent.files.write("/root/base.txt", "base");
      const kids = await parent.fork({ n: 3 });
      try {
        assert.equal(new Set([parent.id, ...kids.map((k) => k.id)]).size, 4);
        for (const [i, k] of kids.entries()) {
          assert.equal((await k.runCode("x + 1")).value, "43");
          assert.equal(await k.files.readText("/root/base.txt"), "base");
          await k.runCode(`x = ${i}`);
          await k.files.write("/root/base.txt", `child ${i}`);
        }
        assert.equal((await parent.runCode("x")).value, "42");
        assert.equal(await parent.files.readText("/root/base.txt"), "base");
        const values = await Promise.all(kids.map(async (k) => (await k.runCode("x")).value));
        assert.deepEqual(values, ["0", "1", "2"]);
        assert.equal((await kids[0].refresh()).parent_id, parent.id);
        await assert.rejects(parent.fork({ n: 33 }), InvalidRequest);
      } finally {
        await Promise.all(kids.map((k) => k.close()));
      }
    }));

  test("fork children inherit SSH keys and get the fork's sshPubkeys", () =>
    withSandbox(async (parent) => {
      const [k1, k2] = [ed25519Line(4, "parent@test"), ed25519Line(5, "child@test")];
      await parent.addSshKeys(k1);
      const kids = await parent.fork({ sshPubkeys: [k2] });
      try {
        assert.deepEqual((await kids[0].refresh()).ssh.keys.map((k) => k.fingerprint), [fingerprint(k1), fingerprint(k2)]);
        assert.deepEqual((await parent.refresh()).ssh.keys.map((k) => k.fingerprint), [fingerprint(k1)]);
      } finally {
        await Promise.all(kids.map((k) => k.close()));
      }
    }));

  test("diff and mergeInto", () =>
    withSandbox(async (parent) => {
      await parent.runCode("v = 'parent'");
      await parent.files.write("/root/same.txt", "same");
      await parent.files.write("/root/mod.txt", "v1");
      const [a, b, c] = await parent.fork({ n: 3 });
      try {
        await a.runCode("open('/root/a.txt','w').write('from a')");
        await b.runCode("open('/root/b.txt','w').write('from b'); v = 'winner'");
        await b.files.write("/root/mod.txt", "v2");
        const d = await a.diff(b);
        assert.ok(d.added.includes("/root/b.txt"));
        assert.ok(d.removed.includes("/root/a.txt"));
        assert.ok(d.modified.includes("/root/mod.txt"));
        assert.ok(![...d.added, ...d.removed, ...d.modified].includes("/root/same.txt"));
        await b.files.write("/srv/x.txt", "x");
        assert.deepEqual((await a.diff(b, { paths: ["/srv"] })).added, ["/srv/x.txt"]);

        await parent.mergeInto(b);
        assert.equal((await parent.runCode("v")).value, "'winner'");
        assert.equal(await parent.files.readText("/root/b.txt"), "from b");
        assert.equal(b.defunct, true);
        await assert.rejects(b.runCode("1"), SandboxDefunct);
        await assert.rejects(Sandbox.connect(b.id), SandboxNotFound);
        await assert.rejects(parent.mergeInto(b.id), SandboxNotFound); // the winner id is retired
        await assert.rejects(parent.mergeInto(parent), InvalidRequest);
        assert.equal((await c.runCode("v")).value, "'parent'"); // siblings untouched
      } finally {
        for (const k of [a, b, c]) await k.close(); // a no-op for the defunct winner
      }
    }));
});

describe("integration: pause and resume", { skip: PAUSE }, () => {
  test("pause/resume round trip keeps variables and files", () =>
    withSandbox(async (sb) => {
      await sb.runCode("kept = [1, 2, 3]");
      await sb.files.write("/root/kept.txt", "kept");
      assert.equal((await sb.pause()).status, "paused");
      assert.equal(await sb.status(), "paused");
      assert.equal((await sb.pause()).status, "paused"); // already paused: 200
      await assert.rejects(sb.runCode("1"), Conflict);
      assert.equal((await sb.resume()).status, "running");
      assert.equal((await sb.resume()).status, "running");
      assert.equal((await sb.runCode("sum(kept)")).value, "6");
      assert.equal(await sb.files.readText("/root/kept.txt"), "kept");
    }));

  test("pause without waiting, then waitForStatus", () =>
    withSandbox(async (sb) => {
      const info = await sb.pause({ wait: false });
      assert.ok(["pausing", "paused"].includes(info.status), info.status);
      await sb.waitForStatus("paused", { timeoutS: 120 });
      await sb.resume();
      assert.equal((await sb.runCode("1 + 1")).value, "2");
    }));
});

describe("integration: templates", { skip: PAUSE }, () => {
  test("saveTemplate, create from it twice, list, delete", async () => {
    const name = `ts-${process.pid}-${Date.now()}`;
    await withSandbox(async (src) => {
      await src.runCode("rows = list(range(1000))");
      await src.files.write("/root/model.txt", "weights");
      const t = await src.saveTemplate(name);
      assert.equal(t.name, name);
      assert.equal(t.from, src.id);
      assert.ok(t.size > 0);
      await assert.rejects(src.saveTemplate(name), Conflict);
      assert.equal((await src.runCode("len(rows)")).value, "1000"); // still running
    });
    try {
      assert.ok((await Sandbox.listTemplates()).some((t) => t.name === name));
      assert.equal((await Sandbox.getTemplate(name)).name, name);
      await withSandbox(async (a) => {
        await withSandbox(async (b) => {
          assert.equal(a.info.template, name);
          assert.notEqual(a.id, b.id);
          assert.equal((await a.runCode("sum(rows)")).value, "499500");
          assert.equal(await a.files.readText("/root/model.txt"), "weights");
          await a.runCode("rows = []");
          assert.equal((await b.runCode("len(rows)")).value, "1000");
        }, { template: name });
      }, { template: name });
    } finally {
      await Sandbox.deleteTemplate(name);
    }
    await assert.rejects(Sandbox.getTemplate(name), (e) => e instanceof NotFound && !(e instanceof SandboxNotFound));
    await assert.rejects(Sandbox.create({ template: name, metadata: META }), NotFound);
  });
});

const IMAGES = HAVE_SERVER && process.env.RAMIFY_TEST_IMAGES === "1" ? false : SKIP || "set RAMIFY_TEST_IMAGES=1 (scripts/with-test-server does)";

describe("integration: images", { skip: IMAGES }, () => {
  test("buildImage with progress, create on it, list, delete", async () => {
    const name = `ts-${process.pid}-${Date.now()}`;
    await assert.rejects(Sandbox.buildImage("Bad Name", { apt: ["tree"] }), InvalidRequest);
    const lines = [];
    const img = await Sandbox.buildImage(name, { apt: ["tree"], onProgress: (l) => lines.push(l) });
    try {
      assert.equal(img.name, name);
      assert.deepEqual(img.apt, ["tree"]);
      assert.ok(lines.some((l) => l.includes("installing tree with apt-get")), lines.join("\n"));
      assert.ok((await Sandbox.listImages()).some((i) => i.name === name));
      await withSandbox(async (sb) => {
        assert.equal(sb.info.image, name);
        assert.equal((await sb.exec("tree -L 1 / > /dev/null && echo ok")).stdout, "ok\n");
        await assert.rejects(Sandbox.deleteImage(name), Conflict);
      }, { image: name });
    } finally {
      await Sandbox.deleteImage(name);
    }
    await assert.rejects(Sandbox.getImage(name), (e) => e instanceof NotFound && !(e instanceof SandboxNotFound));
    await assert.rejects(Sandbox.create({ image: name, metadata: META }), (e) => e instanceof NotFound && !(e instanceof SandboxNotFound));
  });
});
