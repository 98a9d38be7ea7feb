"""Unit tests of the SDK's own logic against an in-process HTTP stub (no ramify server needed).

Run: cd sdk/python && /usr/bin/python3 -m unittest discover -s tests -v
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import tarfile
import tempfile
import threading
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import ramify  # noqa: E402
from ramify import (  # noqa: E402
    AsyncSandbox,
    AuthError,
    CommandResult,
    Conflict,
    Entry,
    Execution,
    FileNotFound,
    InvalidRequest,
    PauseFailed,
    ResumeFailed,
    RamifyError,
    Sandbox,
    SandboxDefunct,
    SandboxErrorState,
    SandboxNotFound,
    ServerError,
    ServerUnreachable,
    Timeout,
)
from ramify import _http  # noqa: E402

from _stub import API_KEY, Reply, Stub, free_port, ndjson, sandbox_json  # noqa: E402

SBX = r"/v1/sandboxes/(sbx_[a-z0-9]+)"


class StubTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.stub = Stub().start()
        self.addCleanup(self.stub.stop)
        self.stub.on("POST", "/v1/sandboxes", Reply(201, sandbox_json("sbx_1")))
        self.stub.on("GET", SBX, lambda r: Reply(200, sandbox_json(r.match.group(1))))
        self.stub.on("DELETE", SBX, Reply(204))
        # Fast retries in tests.
        p = mock.patch.object(_http, "RETRY_BASE_DELAY", 0.05)
        p.start()
        self.addCleanup(p.stop)

    def kw(self, **extra):
        d = dict(api_url=self.stub.url, api_key=API_KEY)
        d.update(extra)
        return d

    def sandbox(self, **extra) -> Sandbox:
        sb = Sandbox(**self.kw(**extra))
        return sb


class TestCreateAndLifecycle(StubTestCase):
    def test_create_request_shape(self):
        sb = self.sandbox(vcpu=2, mem_mib=2048, env={"A": "1"}, metadata={"team": "x"}, cwd="/work")
        [req] = self.stub.reqs("POST", "/v1/sandboxes")
        self.assertEqual(req.headers["Authorization"], f"Bearer {API_KEY}")
        self.assertEqual(req.headers["Content-Type"], "application/json")
        self.assertEqual(req.json(), {"vcpu": 2, "mem_mib": 2048, "env": {"A": "1"},
                                      "metadata": {"team": "x"}, "cwd": "/work"})
        self.assertEqual(sb.id, "sbx_1")
        self.assertEqual(sb.info["status"], "running")
        self.assertEqual(sb.ip, "10.213.0.5")

    def test_create_empty_body(self):
        self.sandbox()
        [req] = self.stub.reqs("POST", "/v1/sandboxes")
        self.assertEqual(req.json(), {})

    def test_env_defaults(self):
        env = {"RAMIFY_API_URL": self.stub.url, "RAMIFY_API_KEY": API_KEY}
        with mock.patch.dict(os.environ, env):
            sb = Sandbox()
        self.assertEqual(sb.id, "sbx_1")

    def test_default_url(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            c = _http.HTTPClient()
        self.assertEqual(c.api_url, "http://127.0.0.1:7070")
        self.assertIsNone(c.api_key)

    def test_context_manager_closes_once(self):
        with self.sandbox() as sb:
            self.assertEqual(sb.status, "running")
        self.assertEqual(len(self.stub.reqs("DELETE", "/v1/sandboxes/sbx_1")), 1)
        sb.close()
        sb.close()
        self.assertEqual(len(self.stub.reqs("DELETE", "/v1/sandboxes/sbx_1")), 1)
        self.assertTrue(sb.closed)
        with self.assertRaises(SandboxNotFound):
            sb.run_code("1")

    def test_close_ignores_404(self):
        sb = self.sandbox()
        self.stub.on("DELETE", SBX, Reply(404, {"error": "sandbox not found"}))
        sb.close()
        self.assertTrue(sb.closed)

    def test_close_other_error_raises(self):
        sb = self.sandbox()
        self.stub.on("DELETE", SBX, Reply(500, {"error": "disk on fire"}))
        with self.assertRaises(ServerError):
            sb.close()
        self.assertFalse(sb.closed)

    def test_create_waits_while_creating(self):
        self.stub.on("POST", "/v1/sandboxes",
                     Reply(201, sandbox_json("sbx_1", status="creating"), {"X-Poll-After": "0.01"}))
        # The server's wait answers at its timeout with the status then, and the SDK asks again.
        self.stub.on("GET", SBX + "/wait", [Reply(200, sandbox_json("sbx_1", status="creating")),
                                            Reply(200, sandbox_json("sbx_1", status="running"))])
        sb = self.sandbox()
        self.assertEqual(sb.info["status"], "running")
        waits = self.stub.reqs("GET")
        self.assertEqual(len(waits), 2)
        self.assertEqual(waits[0].query["status"], ["running"])

    def test_status_property_gets(self):
        sb = self.sandbox()
        self.stub.on("GET", SBX, Reply(200, sandbox_json("sbx_1", status="paused")))
        self.assertEqual(sb.status, "paused")
        self.assertEqual(sb.info["status"], "paused")

    def test_connect_and_list(self):
        sb = Sandbox.connect("sbx_abc", **self.kw())
        self.assertEqual(sb.id, "sbx_abc")
        self.stub.on("GET", "/v1/sandboxes", Reply(200, {"sandboxes": [sandbox_json("sbx_a"),
                                                                       sandbox_json("sbx_b")]}))
        lst = Sandbox.list(metadata={"team": "x", "run": "7"}, status="running", **self.kw())
        self.assertEqual([s.id for s in lst], ["sbx_a", "sbx_b"])
        self.assertTrue(all(isinstance(s, Sandbox) for s in lst))
        [req] = self.stub.reqs("GET", "/v1/sandboxes")
        self.assertEqual(req.query, {"metadata.team": ["x"], "metadata.run": ["7"], "status": ["running"]})
        self.assertEqual(self.stub.reqs("DELETE"), [])  # nothing closed

    def test_connect_unknown(self):
        self.stub.on("GET", SBX, Reply(404, {"error": "sandbox not found"}))
        with self.assertRaises(SandboxNotFound) as cm:
            Sandbox.connect("sbx_nope", **self.kw())
        self.assertEqual(cm.exception.status, 404)
        self.assertEqual(cm.exception.message, "sandbox not found")


class TestErrors(StubTestCase):
    def check(self, status, body, exc, message=None, **kw):
        self.stub.on("POST", SBX + "/run_code", Reply(status, body, **kw))
        sb = self.sandbox()
        with self.assertRaises(exc) as cm:
            sb.run_code("1")
        self.assertIsInstance(cm.exception, RamifyError)
        self.assertEqual(cm.exception.status, status)
        if message is not None:
            self.assertEqual(cm.exception.message, message)
            self.assertIn(message, str(cm.exception))
        return cm.exception

    def test_400(self):
        self.check(400, {"error": "unknown field \"cod\""}, InvalidRequest, "unknown field \"cod\"")

    def test_401(self):
        self.check(401, {"error": "invalid api key"}, AuthError, "invalid api key")

    def test_404(self):
        self.check(404, {"error": "sandbox not found"}, SandboxNotFound, "sandbox not found")

    def test_409(self):
        self.check(409, {"error": "sandbox is not running"}, Conflict, "sandbox is not running")

    def test_413(self):
        self.check(413, {"error": "body too large"}, InvalidRequest, "body too large")

    def test_500(self):
        e = self.check(500, {"error": "cgroup write failed"}, ServerError, "cgroup write failed")
        self.assertEqual(e.body, {"error": "cgroup write failed"})

    def test_502_plain_text(self):
        self.check(502, b"Bad Gateway from proxy", ServerError, "Bad Gateway from proxy",
                   content_type="text/plain")

    def test_bad_key_on_create(self):
        with self.assertRaises(AuthError):
            Sandbox(api_url=self.stub.url, api_key="wrong")
        with self.assertRaises(AuthError):
            Sandbox(api_url=self.stub.url, api_key="")

    def test_builtin_bases(self):
        self.assertTrue(issubclass(ServerUnreachable, ConnectionError))
        self.assertTrue(issubclass(Timeout, TimeoutError))
        self.assertTrue(issubclass(FileNotFound, FileNotFoundError))
        self.assertTrue(issubclass(SandboxNotFound, RamifyError))

    def test_client_timeout(self):
        def slow(req):
            time.sleep(1.0)
            return Reply(200, sandbox_json())
        self.stub.on("GET", SBX, slow)
        sb = Sandbox(**self.kw(request_timeout=0.2))
        t0 = time.monotonic()
        with self.assertRaises(Timeout):
            sb.refresh()
        self.assertLess(time.monotonic() - t0, 0.9)
        self.assertEqual(len(self.stub.reqs("GET")), 1)  # timeouts are not retried


class TestRunCode(StubTestCase):
    def test_run_code_plain(self):
        self.stub.on("POST", SBX + "/run_code", Reply(200, {"stdout": "hi\n", "stderr": "", "value": "43",
                                                             "error": None, "execution_count": 2}))
        sb = self.sandbox()
        ex = sb.run_code("x + 1", timeout_s=10)
        [req] = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/run_code")
        self.assertEqual(req.json(), {"code": "x + 1", "timeout_s": 10})
        self.assertIsInstance(ex, Execution)
        self.assertEqual((ex.value, ex.text, ex.stdout, ex.error, ex.execution_count), ("43", "43", "hi\n", None, 2))
        self.assertIn("43", repr(ex))

    def test_run_code_error(self):
        err = {"name": "ZeroDivisionError", "value": "division by zero",
               "traceback": "Traceback (most recent call last):\n..."}
        self.stub.on("POST", SBX + "/run_code", Reply(200, {"stdout": "", "stderr": "", "value": None,
                                                             "error": err, "execution_count": 3}))
        ex = self.sandbox().run_code("1/0")
        self.assertIsNone(ex.value)
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertEqual(ex.error.value, "division by zero")
        self.assertTrue(ex.error.traceback.startswith("Traceback"))
        self.assertIn("ZeroDivisionError", repr(ex))

    def test_run_code_stream_callbacks_before_result(self):
        got_first = threading.Event()
        flags = {}

        def handler(req):
            def gen():
                yield (json.dumps({"type": "stdout", "data": "a\n"}) + "\n").encode()
                # Only continue once the client has delivered the first chunk to the callback:
                # proves the SDK reads the stream incrementally.
                flags["callback_before_result"] = got_first.wait(5)
                yield (json.dumps({"type": "stderr", "data": "warn\n"}) + "\n").encode()
                yield b"\n"
                yield (json.dumps({"type": "stdout", "data": "b\n"}) + "\n").encode()
                yield (json.dumps({"type": "result", "stdout": "a\nb\n", "stderr": "warn\n",
                                   "value": "7", "error": None, "execution_count": 1}) + "\n").encode()
            return Reply(200, gen(), content_type="application/x-ndjson")

        self.stub.on("POST", SBX + "/run_code", handler)
        events = []

        def on_out(s):
            events.append(("out", s))
            got_first.set()

        ex = self.sandbox().run_code("print('a')", on_stdout=on_out, on_stderr=lambda s: events.append(("err", s)))
        self.assertTrue(flags["callback_before_result"])
        self.assertEqual(events, [("out", "a\n"), ("err", "warn\n"), ("out", "b\n")])
        self.assertEqual(ex.value, "7")
        self.assertEqual(ex.stdout, "a\nb\n")
        [req] = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/run_code")
        self.assertEqual(req.json(), {"code": "print('a')", "stream": True})

    def test_run_code_stream_without_result(self):
        self.stub.on("POST", SBX + "/run_code",
                     Reply(200, ndjson({"type": "stdout", "data": "x"}), content_type="application/x-ndjson"))
        with self.assertRaises(RamifyError):
            self.sandbox().run_code("x", on_stdout=lambda s: None)

    def test_run_code_stream_server_ignores_stream(self):
        self.stub.on("POST", SBX + "/run_code", Reply(200, {"stdout": "o", "stderr": "e", "value": None,
                                                             "error": None, "execution_count": 1}))
        out, err = [], []
        ex = self.sandbox().run_code("x", on_stdout=out.append, on_stderr=err.append)
        self.assertEqual((out, err, ex.stdout), (["o"], ["e"], "o"))

    def test_post_cut_before_its_answer_is_retried_with_its_key(self):
        # The server took the fork, then the connection broke: the retry carries the same Idempotency-Key, so the
        # server answers with the fork it made instead of forking again.
        self.stub.on("POST", SBX + "/fork", [Reply(drop=True), Reply(200, {"children": ["sbx_c1"]})])
        kids = self.sandbox().fork(1)
        self.assertEqual([k.id for k in kids], ["sbx_c1"])
        reqs = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/fork")
        self.assertEqual(len(reqs), 2)
        keys = [r.headers.get("Idempotency-Key") for r in reqs]
        self.assertTrue(keys[0] and keys[0] == keys[1], keys)

    def test_every_post_gets_its_own_key(self):
        self.stub.on("POST", SBX + "/fork", Reply(200, {"children": ["sbx_c1"]}))
        sb = self.sandbox()
        sb.fork(1)
        sb.fork(1)
        keys = {r.headers.get("Idempotency-Key") for r in self.stub.reqs("POST", "/v1/sandboxes/sbx_1/fork")}
        self.assertEqual(len(keys), 2, keys)
        self.assertNotIn(None, keys)

    def test_run_code_not_retried(self):
        sb = self.sandbox()
        self.stub.on("POST", SBX + "/run_code", Reply(500, {"error": "boom"}))
        with self.assertRaises(ServerError):
            sb.run_code("1")
        self.assertEqual(len(self.stub.reqs("POST", "/v1/sandboxes/sbx_1/run_code")), 1)


class TestExec(StubTestCase):
    def setUp(self):
        super().setUp()
        self.stub.on("POST", SBX + "/exec", Reply(200, {"exit_code": 3, "stdout": "out", "stderr": "err",
                                                         "timed_out": False}))

    def test_exec_str(self):
        res = self.sandbox().exec("ls -l /", env={"A": "b"}, cwd="/tmp", timeout_s=5, stdin="data")
        [req] = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/exec")
        self.assertEqual(req.json(), {"cmd": "ls -l /", "env": {"A": "b"}, "cwd": "/tmp", "timeout_s": 5,
                                      "stdin": "data"})
        self.assertEqual(res, CommandResult(3, "out", "err", False))
        self.assertFalse(res.ok)

    def test_exec_argv(self):
        self.sandbox().exec(["ls", "-l", "/"])
        [req] = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/exec")
        self.assertEqual(req.json(), {"argv": ["ls", "-l", "/"]})

    def test_exec_stream(self):
        self.stub.on("POST", SBX + "/exec", Reply(200, ndjson(
            {"type": "stdout", "data": "1\n"}, {"type": "stderr", "data": "e\n"},
            {"type": "stdout", "data": "2\n"}, {"type": "exit", "exit_code": 137, "timed_out": True}),
            content_type="application/x-ndjson"))
        out = []
        res = self.sandbox().exec("seq 2", on_stdout=out.append)
        self.assertEqual(out, ["1\n", "2\n"])
        self.assertEqual(res, CommandResult(137, "1\n2\n", "e\n", True))
        [req] = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/exec")
        self.assertTrue(req.json()["stream"])


class TestFiles(StubTestCase):
    def test_read(self):
        payload = bytes(range(256)) * 100
        self.stub.on("GET", SBX + "/files", Reply(200, payload))
        sb = self.sandbox()
        self.assertEqual(sb.files.read("/root/a.bin"), payload)
        [req] = self.stub.reqs("GET", "/v1/sandboxes/sbx_1/files")
        self.assertEqual(req.query, {"path": ["/root/a.bin"]})
        self.stub.on("GET", SBX + "/files", Reply(200, "héllo".encode()))
        self.assertEqual(sb.files.read_text("/x"), "héllo")

    def test_read_stream(self):
        payload = os.urandom(300_000)
        self.stub.on("GET", SBX + "/files", Reply(200, [payload[i:i + 50_000] for i in range(0, 300_000, 50_000)]))
        chunks = list(self.sandbox().files.read_stream("/big", chunk_size=64 * 1024))
        self.assertEqual(b"".join(chunks), payload)
        self.assertTrue(all(len(c) <= 64 * 1024 for c in chunks))
        self.assertGreater(len(chunks), 1)

    def test_missing_file(self):
        self.stub.on("GET", SBX + "/files", Reply(404, {"error": "no such file: /nope"}))
        self.stub.on("GET", SBX + "/files/stat", Reply(404, {"error": "no such file: /nope"}))
        sb = self.sandbox()
        with self.assertRaises(FileNotFound):
            sb.files.read("/nope")
        with self.assertRaises(FileNotFoundError):
            sb.files.read_stream("/nope")
        self.assertFalse(sb.files.exists("/nope"))
        self.stub.on("GET", SBX + "/files/stat", Reply(404, {"error": "sandbox not found"}))
        with self.assertRaises(SandboxNotFound):
            sb.files.exists("/x")

    def test_write_bytes_and_str(self):
        self.stub.on("PUT", SBX + "/files", lambda r: Reply(200, {"path": r.q("path"), "size": len(r.body)}))
        sb = self.sandbox()
        self.assertEqual(sb.files.write("/root/a", b"\x00\x01", mode=0o755), {"path": "/root/a", "size": 2})
        self.assertEqual(sb.files.write("/root/b", "é")["size"], 2)
        r1, r2 = self.stub.reqs("PUT")
        self.assertEqual(r1.query, {"path": ["/root/a"], "mode": ["0755"]})
        self.assertEqual(r1.body, b"\x00\x01")
        self.assertEqual(r1.headers["Content-Length"], "2")
        self.assertEqual(r2.body, "é".encode())
        self.assertNotIn("mode", r2.query)

    def test_write_regular_file_streams_with_length(self):
        self.stub.on("PUT", SBX + "/files", lambda r: Reply(200, {"path": r.q("path"), "size": len(r.body)}))
        data = os.urandom(3 * 1024 * 1024 + 17)
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.seek(0)
            read_sizes = []
            orig = f.read

            def spy(n=-1):
                read_sizes.append(n)
                return orig(n)

            with mock.patch.object(f, "read", spy):
                res = self.sandbox().files.write("/root/big", f)
        self.assertEqual(res["size"], len(data))
        [req] = self.stub.reqs("PUT")
        self.assertEqual(req.body, data)
        self.assertEqual(req.headers["Content-Length"], str(len(data)))
        self.assertFalse(req.chunked)
        self.assertTrue(all(0 < n <= 1 << 20 for n in read_sizes), read_sizes)  # never read(-1)

    def test_write_unsized_stream_is_chunked(self):
        self.stub.on("PUT", SBX + "/files", lambda r: Reply(200, {"path": r.q("path"), "size": len(r.body)}))

        class Pipe(io.RawIOBase):
            def __init__(self, parts):
                self.parts = list(parts)

            def readable(self):
                return True

            def read(self, n=-1):
                return self.parts.pop(0) if self.parts else b""

        self.sandbox().files.write("/root/p", Pipe([b"abc", b"def", b"g"]))
        [req] = self.stub.reqs("PUT")
        self.assertTrue(req.chunked)
        self.assertEqual(req.body, b"abcdefg")

    def test_list_stat_mkdir_remove(self):
        entries = [{"name": "a.txt", "path": "/root/a.txt", "type": "file", "size": 12, "mode": "0644",
                    "mtime": "2026-01-01T00:00:00Z", "link_target": ""},
                   {"name": "d", "path": "/root/d", "type": "dir", "size": 0, "mode": "0755",
                    "mtime": "2026-01-01T00:00:00Z", "link_target": ""}]
        self.stub.on("GET", SBX + "/files/list", Reply(200, {"entries": entries}))
        self.stub.on("GET", SBX + "/files/stat", Reply(200, entries[0]))
        self.stub.on("POST", SBX + "/files/mkdir", Reply(200, entries[1]))
        self.stub.on("DELETE", SBX + "/files", Reply(204))
        sb = self.sandbox()
        lst = sb.files.list("/root")
        self.assertEqual([e.name for e in lst], ["a.txt", "d"])
        self.assertTrue(lst[0].is_file and lst[1].is_dir)
        st = sb.files.stat("/root/a.txt")
        self.assertEqual((st.size, st.mode, st.type), (12, "0644", "file"))
        self.assertTrue(sb.files.exists("/root/a.txt"))
        self.assertIsInstance(sb.files.mkdir("/root/d"), Entry)
        sb.files.mkdir("/root/e", parents=False)
        sb.files.remove("/root/a.txt")
        sb.files.remove("/root/d", recursive=True)
        m1, m2 = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/files/mkdir")
        self.assertEqual(m1.json(), {"path": "/root/d", "parents": True})
        self.assertEqual(m2.json(), {"path": "/root/e", "parents": False})
        d1, d2 = self.stub.reqs("DELETE", "/v1/sandboxes/sbx_1/files")
        self.assertEqual(d1.query, {"path": ["/root/a.txt"]})
        self.assertEqual(d2.query, {"path": ["/root/d"], "recursive": ["true"]})

    def test_names_that_are_not_utf8(self):
        # The server's answer for b"caf\xe9" (Latin-1), next to the UTF-8 b"caf\xc3\xa9": display string + b64.
        latin = {"name": "caf\ufffd", "name_b64": "Y2Fm6Q==", "path": "/root/caf\ufffd", "path_b64": "L3Jvb3QvY2Fm6Q==",
                 "type": "symlink", "size": 3, "mode": "0777", "mtime": "2026-01-01T00:00:00Z",
                 "link_target": "/x\ufffd", "link_target_b64": "L3jp"}
        utf8 = {"name": "café", "path": "/root/café", "type": "file", "size": 1, "mode": "0644",
                "mtime": "2026-01-01T00:00:00Z", "link_target": ""}
        self.stub.on("GET", SBX + "/files/list", Reply(200, {"entries": [utf8, latin]}))
        self.stub.on("GET", SBX + "/files", Reply(200, b"latin", {"Content-Type": "application/octet-stream"}))
        self.stub.on("PUT", SBX + "/files", Reply(200, {"path": "/root/caf\ufffd", "path_b64": "L3Jvb3QvY2Fm6Q==", "size": 2}))
        self.stub.on("POST", SBX + "/files/mkdir", Reply(200, latin))
        self.stub.on("DELETE", SBX + "/files", Reply(204))
        sb = self.sandbox()
        lst = sb.files.list(b"/root")
        self.assertEqual([e.name for e in lst], ["café", b"caf\xe9"])
        self.assertEqual((lst[1].path, lst[1].link_target), (b"/root/caf\xe9", b"/x\xe9"))
        self.assertEqual(sb.files.read(lst[1].path), b"latin")
        self.assertEqual(sb.files.read(lst[0].path), b"latin")
        self.assertEqual(sb.files.write(lst[1].path, b"hi"), {"path": b"/root/caf\xe9", "size": 2})
        sb.files.mkdir(b"/root/d\xe9")
        sb.files.remove(os.fsdecode(b"/root/caf\xe9"))  # a str with surrogate escapes: the bytes it stands for
        sb.files.remove(b"/root/caf\xc3\xa9")  # bytes that are UTF-8 go as the plain path
        r_list = self.stub.reqs("GET", "/v1/sandboxes/sbx_1/files/list")[-1]
        self.assertEqual(r_list.query, {"path": ["/root"]})
        r1, r2 = self.stub.reqs("GET", "/v1/sandboxes/sbx_1/files")[-2:]
        self.assertEqual(r1.query, {"path_b64": ["L3Jvb3QvY2Fm6Q=="]})
        self.assertEqual(r2.query, {"path": ["/root/café"]})
        self.assertEqual(self.stub.reqs("PUT", "/v1/sandboxes/sbx_1/files")[-1].query, {"path_b64": ["L3Jvb3QvY2Fm6Q=="]})
        self.assertEqual(self.stub.reqs("POST", "/v1/sandboxes/sbx_1/files/mkdir")[-1].json(), {"path_b64": "L3Jvb3QvZOk=", "parents": True})
        d1, d2 = self.stub.reqs("DELETE", "/v1/sandboxes/sbx_1/files")[-2:]
        self.assertEqual(d1.query, {"path_b64": ["L3Jvb3QvY2Fm6Q=="]})
        self.assertEqual(d2.query, {"path": ["/root/café"]})

    def test_upload_dir(self):
        seen = {}

        def handler(req):
            with tarfile.open(fileobj=io.BytesIO(req.body), mode="r:") as tar:
                for m in tar.getmembers():
                    seen[m.name] = (m.type, tar.extractfile(m).read() if m.isfile() else m.linkname)
            return Reply(200, {"path": req.q("path"), "files": len(seen)})

        self.stub.on("PUT", SBX + "/files/archive", handler)
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "sub", "empty"))
            with open(os.path.join(d, "a.txt"), "wb") as f:
                f.write(b"A")
            with open(os.path.join(d, "sub", "b.bin"), "wb") as f:
                f.write(os.urandom(10) + b"B")
            os.symlink("a.txt", os.path.join(d, "link"))
            res = self.sandbox().files.upload_dir(d, "/root/proj")
        self.assertEqual(res["path"], "/root/proj")
        self.assertEqual(set(seen), {"a.txt", "link", "sub", "sub/b.bin", "sub/empty"})
        self.assertEqual(seen["a.txt"], (tarfile.REGTYPE, b"A"))
        self.assertEqual(seen["link"], (tarfile.SYMTYPE, "a.txt"))
        self.assertEqual(seen["sub"][0], tarfile.DIRTYPE)
        [req] = self.stub.reqs("PUT")
        self.assertTrue(req.chunked)
        self.assertEqual(req.headers["Content-Type"], "application/x-tar")

    def test_upload_dir_server_error(self):
        self.stub.on("PUT", SBX + "/files/archive", Reply(400, {"error": "path must be absolute"}))
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "a"), "wb") as f:
                f.write(os.urandom(2_000_000))
            with self.assertRaises(InvalidRequest):
                self.sandbox().files.upload_dir(d, "rel")

    def _tar(self, build):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            build(tar)
        return buf.getvalue()

    @staticmethod
    def _add(tar, name, data=None, type=tarfile.REGTYPE, linkname=""):
        ti = tarfile.TarInfo(name)
        ti.type = type
        ti.linkname = linkname
        ti.mode = 0o4755 if data else 0o755
        if data is not None:
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
        else:
            tar.addfile(ti)

    def test_download_dir(self):
        def build(tar):
            self._add(tar, "./", type=tarfile.DIRTYPE)
            self._add(tar, "a.txt", b"A" * 100)
            self._add(tar, "sub", type=tarfile.DIRTYPE)
            self._add(tar, "sub/b.txt", b"B")
            self._add(tar, "l", type=tarfile.SYMTYPE, linkname="a.txt")
            self._add(tar, "abs", type=tarfile.SYMTYPE, linkname="/usr/bin/python3")
        data = self._tar(build)
        self.stub.on("GET", SBX + "/files/archive", Reply(200, [data[i:i + 1000] for i in range(0, len(data), 1000)],
                                                          content_type="application/x-tar"))
        with tempfile.TemporaryDirectory() as d:
            n = self.sandbox().files.download_dir("/root/proj", os.path.join(d, "out"))
            out = os.path.join(d, "out")
            self.assertEqual(n, 5)
            with open(os.path.join(out, "a.txt"), "rb") as f:
                self.assertEqual(f.read(), b"A" * 100)
            with open(os.path.join(out, "sub", "b.txt"), "rb") as f:
                self.assertEqual(f.read(), b"B")
            self.assertEqual(os.readlink(os.path.join(out, "l")), "a.txt")
            self.assertEqual(os.readlink(os.path.join(out, "abs")), "/usr/bin/python3")
            self.assertEqual(os.stat(os.path.join(out, "a.txt")).st_mode & 0o7000, 0)  # no setuid
        [req] = self.stub.reqs("GET", "/v1/sandboxes/sbx_1/files/archive")
        self.assertEqual(req.query, {"path": ["/root/proj"]})

    def test_download_dir_rejects_escapes(self):
        cases = [
            lambda t: self._add(t, "../evil", b"x"),
            lambda t: self._add(t, "/etc/evil", b"x"),
            lambda t: (self._add(t, "up", type=tarfile.SYMTYPE, linkname=".."),
                       self._add(t, "up/evil", b"x")),
            lambda t: self._add(t, "hl", type=tarfile.LNKTYPE, linkname="../../etc/passwd"),
        ]
        for build in cases:
            self.stub.on("GET", SBX + "/files/archive", Reply(200, self._tar(build)))
            with tempfile.TemporaryDirectory() as d:
                inner = os.path.join(d, "inner")
                with self.assertRaises(RamifyError):
                    self.sandbox().files.download_dir("/x", inner)
                self.assertFalse(os.path.exists(os.path.join(d, "evil")))


class TestForkMergeDiff(StubTestCase):
    def test_fork(self):
        self.stub.on("POST", SBX + "/fork", Reply(200, {"children": ["sbx_c1", "sbx_c2", "sbx_c3"]}))
        parent = self.sandbox()
        kids = parent.fork(n=3)
        [req] = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/fork")
        self.assertEqual(req.json(), {"n": 3})
        self.assertEqual([k.id for k in kids], ["sbx_c1", "sbx_c2", "sbx_c3"])
        self.assertTrue(all(isinstance(k, Sandbox) for k in kids))
        self.assertEqual(kids[0].ip, "10.213.0.5")  # fetched lazily
        self.assertEqual(kids[1].status, "running")

    def test_fork_children_objects(self):
        self.stub.on("POST", SBX + "/fork", Reply(200, {"children": [sandbox_json("sbx_c1", parent_id="sbx_1")]}))
        [kid] = self.sandbox().fork()
        self.assertEqual(kid.info["parent_id"], "sbx_1")
        self.assertEqual(self.stub.reqs("POST", "/v1/sandboxes/sbx_1/fork")[0].json(), {"n": 1})

    def test_fork_bad_n(self):
        self.stub.on("POST", SBX + "/fork", Reply(400, {"error": "n must be between 1 and 32"}))
        with self.assertRaises(InvalidRequest) as cm:
            self.sandbox().fork(n=33)
        self.assertIn("n must be between 1 and 32", str(cm.exception))

    def test_merge_into(self):
        self.stub.on("POST", SBX + "/fork", Reply(200, {"children": ["sbx_c1", "sbx_c2"]}))
        self.stub.on("POST", SBX + "/merge_into/(sbx_[a-z0-9]+)", Reply(204))
        parent = self.sandbox()
        a, b = parent.fork(n=2)
        parent.merge_into(b)
        [req] = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/merge_into/sbx_c2")
        self.assertEqual(req.headers["Authorization"], f"Bearer {API_KEY}")
        self.assertTrue(b.defunct)
        self.assertFalse(a.defunct)
        for c in (a, b):
            c.close()
        self.assertEqual([r.path for r in self.stub.reqs("DELETE")], ["/v1/sandboxes/sbx_c1"])
        with self.assertRaises(SandboxDefunct) as cm:
            b.run_code("1")
        self.assertIn("merged into sbx_1", str(cm.exception))
        with self.assertRaises(SandboxDefunct):
            b.files.read("/x")
        parent.run_code  # parent still usable
        self.stub.on("POST", SBX + "/run_code", Reply(200, {"value": "1", "execution_count": 1}))
        self.assertEqual(parent.run_code("1").value, "1")

    def test_retired_ids_map_to_sandbox_errors(self):
        from ramify.exceptions import error_for_status

        wid, pid = "sbx_" + "b" * 32, "sbx_" + "a" * 32
        merged = error_for_status(404, f"sandbox {wid} was merged into {pid} at 2026-11-23T13:05:00Z; use id {pid}", file_route=True)
        self.assertIsInstance(merged, SandboxDefunct)
        self.assertIsInstance(merged, SandboxNotFound)  # except SandboxNotFound catches a second merge_into
        deleted = error_for_status(404, f"sandbox {wid} was deleted at 2026-11-23T13:05:00Z", file_route=True)
        self.assertIs(type(deleted), SandboxNotFound)
        self.assertIs(type(error_for_status(404, "sandbox not found", file_route=True)), SandboxNotFound)
        self.assertIsInstance(error_for_status(404, "/root/x: no such file or directory", file_route=True), FileNotFound)
        self.assertTrue(issubclass(SandboxDefunct, SandboxNotFound))

    def test_merge_into_errors(self):
        self.stub.on("POST", SBX + "/merge_into/(sbx_[a-z0-9]+)", Reply(400, {"error": "cannot merge a sandbox into itself"}))
        parent = self.sandbox()
        with self.assertRaises(InvalidRequest):
            parent.merge_into(parent)
        self.assertFalse(parent.defunct)

    def test_diff(self):
        d = {"added": ["/root/b.txt"], "removed": ["/root/a.txt"], "modified": []}
        self.stub.on("GET", SBX + "/diff/(sbx_[a-z0-9]+)", Reply(200, d))
        a = self.sandbox()
        self.assertEqual(a.diff("sbx_b"), d)
        self.assertEqual(a.diff(Sandbox.connect("sbx_c", **self.kw()), paths=["/root", "/srv"]), d)
        r1, r2 = self.stub.reqs("GET")[-3], self.stub.reqs("GET")[-1]
        self.assertEqual((r1.path, r1.query), ("/v1/sandboxes/sbx_1/diff/sbx_b", {}))
        self.assertEqual((r2.path, r2.query), ("/v1/sandboxes/sbx_1/diff/sbx_c", {"paths": ["/root", "/srv"]}))

    def test_diff_names_that_are_not_utf8(self):
        d = {"added": ["/root/caf\ufffd", "/root/café"], "added_b64": ["L3Jvb3QvY2Fm6Q==", None],
             "removed": [], "modified": ["/x"]}
        self.stub.on("GET", SBX + "/diff/(sbx_[a-z0-9]+)", Reply(200, d))
        a = self.sandbox()
        got = a.diff("sbx_b", paths=["/root", b"/d\xe9"])
        self.assertEqual(got, {"added": [b"/root/caf\xe9", "/root/café"], "removed": [], "modified": ["/x"]})
        r = self.stub.reqs("GET")[-1]
        self.assertEqual(r.query, {"paths_b64": ["L3Jvb3Q=", "L2Tp"]})


class TestPauseResume(StubTestCase):
    def test_pause_waits_on_the_server(self):
        self.stub.on("POST", SBX + "/pause",
                     Reply(202, sandbox_json("sbx_1", status="pausing"), {"X-Poll-After": "1"}))
        sb = self.sandbox()
        self.stub.on("GET", SBX + "/wait", Reply(200, sandbox_json("sbx_1", status="paused")))
        t0 = time.monotonic()
        info = sb.pause(poll_timeout=10)
        elapsed = time.monotonic() - t0
        self.assertEqual(info["status"], "paused")
        gets = self.stub.reqs("GET")
        self.assertEqual([(g.path, g.query["status"]) for g in gets], [("/v1/sandboxes/sbx_1/wait", ["paused"])])
        self.assertLessEqual(float(gets[0].query["timeout_s"][0]), 10)
        self.assertLess(elapsed, 0.5)  # no sleeping out X-Poll-After: the server answers when it is paused

    def test_pause_already_paused(self):
        self.stub.on("POST", SBX + "/pause", Reply(200, sandbox_json("sbx_1", status="paused")))
        self.assertEqual(self.sandbox().pause()["status"], "paused")
        self.assertEqual(self.stub.reqs("GET"), [])

    def test_pause_no_wait(self):
        self.stub.on("POST", SBX + "/pause", Reply(202, sandbox_json("sbx_1", status="pausing")))
        self.assertEqual(self.sandbox().pause(wait=False)["status"], "pausing")
        self.assertEqual(self.stub.reqs("GET"), [])

    def test_resume_error_state(self):
        self.stub.on("POST", SBX + "/resume", Reply(202, sandbox_json("sbx_1", status="resuming"),
                                                    {"X-Poll-After": "0.01"}))
        sb = self.sandbox()
        self.stub.on("GET", SBX + "/wait", Reply(200, sandbox_json("sbx_1", status="error", error="no host with capacity")))
        with self.assertRaises(SandboxErrorState) as cm:
            sb.resume()
        self.assertIn("no host with capacity", str(cm.exception))

    def test_resume_wait_timeout(self):
        self.stub.on("POST", SBX + "/resume", Reply(202, sandbox_json("sbx_1", status="resuming"),
                                                    {"X-Poll-After": "0.05"}))
        sb = self.sandbox()
        def still_resuming(req):
            time.sleep(float(req.query["timeout_s"][0]))  # the server holds the request for its timeout
            return Reply(200, sandbox_json("sbx_1", status="resuming"))
        self.stub.on("GET", SBX + "/wait", still_resuming)
        t0 = time.monotonic()
        with self.assertRaises(Timeout):
            sb.resume(poll_timeout=0.4)
        self.assertLess(time.monotonic() - t0, 2)

    def test_pause_failed(self):
        # The server answers the wait when the pause failed: running, pause.error set. No waiting out the timeout.
        self.stub.on("POST", SBX + "/pause", Reply(202, sandbox_json("sbx_1", status="pausing")))
        sb = self.sandbox()
        failed = sandbox_json("sbx_1", status="running", pause={"error": "pause failed: its state is lost"})
        self.stub.on("GET", SBX + "/wait", Reply(200, failed))
        t0 = time.monotonic()
        with self.assertRaises(PauseFailed) as cm:
            sb.pause(poll_timeout=30)
        self.assertLess(time.monotonic() - t0, 2)
        self.assertIn("its state is lost", str(cm.exception))
        self.assertEqual(cm.exception.body["status"], "running")
        self.assertEqual(len(self.stub.reqs("GET")), 1)

    def test_resume_failed(self):
        # A resume that failed leaves the sandbox paused with pause.error: the wait ends on it at once.
        self.stub.on("POST", SBX + "/resume", Reply(202, sandbox_json("sbx_1", status="resuming")))
        sb = self.sandbox()
        failed = sandbox_json("sbx_1", status="paused", pause={"error": "resume failed: the store did not answer"})
        self.stub.on("GET", SBX + "/wait", Reply(200, failed))
        t0 = time.monotonic()
        with self.assertRaises(ResumeFailed) as cm:
            sb.resume(poll_timeout=30)
        self.assertLess(time.monotonic() - t0, 2)
        self.assertIn("the store did not answer", str(cm.exception))
        self.assertEqual(cm.exception.body["status"], "paused")
        self.assertEqual(len(self.stub.reqs("GET")), 1)

    def test_pause_conflict(self):
        self.stub.on("POST", SBX + "/pause", Reply(409, {"error": "sandbox is not running"}))
        with self.assertRaises(Conflict):
            self.sandbox().pause()


class TestConnections(StubTestCase):
    """Connections are kept alive and reused (one pool per server, shared by the process's clients)."""

    def setUp(self):
        super().setUp()
        self.stub.on("POST", SBX + "/run_code", Reply(200, {"stdout": "", "stderr": "", "value": "2",
                                                             "error": None, "execution_count": 1}))

    def conns(self, method="POST", path="/v1/sandboxes/sbx_1/run_code"):
        return [r.conn for r in self.stub.reqs(method, path)]

    def test_calls_in_a_row_share_one_connection(self):
        sb = self.sandbox()
        for _ in range(10):
            self.assertEqual(sb.run_code("1+1").value, "2")
        other = Sandbox.connect("sbx_1", **self.kw())  # another client of the same server
        other.run_code("1+1")
        self.assertEqual(len(set(self.conns())), 1, self.conns())
        self.assertEqual(self.conns()[0], self.stub.reqs("POST", "/v1/sandboxes")[0].conn)

    def test_concurrent_calls_each_take_one_and_keep_it(self):
        sb = self.sandbox()
        n = 8
        barrier = threading.Barrier(n, timeout=5)

        def run_code(req):
            barrier.wait()  # all n in flight at once: n connections
            return Reply(200, {"stdout": "", "stderr": "", "value": "1", "error": None, "execution_count": 1})

        self.stub.on("POST", SBX + "/run_code", run_code)
        rounds = []
        for _ in range(3):
            threads = [threading.Thread(target=sb.run_code, args=("1",)) for _ in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            got = self.conns()[-n:]
            self.assertEqual(len(set(got)), n)
            rounds.append(set(got))
        self.assertEqual(rounds[0], rounds[1])
        self.assertEqual(rounds[1], rounds[2])

    def test_pool_is_bounded(self):
        sb = self.sandbox()
        n = _http.POOL_SIZE + 8
        barrier = threading.Barrier(n, timeout=5)

        def get(req):
            barrier.wait()
            return Reply(200, sandbox_json(req.match.group(1)))

        self.stub.on("GET", SBX, get)
        threads = [threading.Thread(target=sb.refresh) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len(set(r.conn for r in self.stub.reqs("GET"))), n)
        self.assertEqual(len(_http._pool._idle[sb._client._pool_key]), _http.POOL_SIZE)

    def test_connections_idle_too_long_are_not_used(self):
        sb = self.sandbox()
        barrier = threading.Barrier(2, timeout=5)

        def get(req):
            barrier.wait()
            return Reply(200, sandbox_json(req.match.group(1)))

        self.stub.on("GET", SBX, get)
        threads = [threading.Thread(target=sb.refresh) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        key = sb._client._pool_key
        self.assertEqual(len(_http._pool._idle[key]), 2)
        with mock.patch.object(_http, "POOL_IDLE_S", 0.1):
            time.sleep(0.2)
            self.stub.on("GET", SBX, lambda r: Reply(200, sandbox_json(r.match.group(1))))
            sb.refresh()  # takes neither of the two (too old, closed), and puts its own back
        idle = _http._pool._idle[key]
        self.assertEqual(len(idle), 1)
        self.assertIsNotNone(idle[0][0].sock)

    def test_connections_left_at_the_bottom_are_let_go(self):
        pool, key = _http._Pool(), ("http", "h", 1)
        old, busy = mock.Mock(), mock.Mock()
        with mock.patch.object(_http.time, "monotonic", return_value=0.0):
            pool.put(key, old)
        with mock.patch.object(_http.time, "monotonic", return_value=_http.POOL_IDLE_S + 1):
            pool.put(key, busy)  # a connection in use all along comes back: the one below it is too old
        old.close.assert_called_once()
        busy.close.assert_not_called()
        self.assertEqual([c for c, _ in pool._idle[key]], [busy])

    def test_connection_the_server_closed_is_not_used(self):
        sb = self.sandbox()
        self.stub.on("POST", SBX + "/run_code", [
            Reply(200, {"stdout": "", "stderr": "", "value": "1", "error": None, "execution_count": 1}, hang_up=True),
            Reply(200, {"stdout": "", "stderr": "", "value": "2", "error": None, "execution_count": 2}),
        ])
        self.assertEqual(sb.run_code("1").value, "1")
        time.sleep(0.2)  # the server's FIN arrives
        self.assertEqual(sb.run_code("2").value, "2")  # a POST: it must not be lost to the dead connection
        first, second = self.conns()
        self.assertNotEqual(first, second)

    def test_kept_connection_dead_on_arrival_is_replaced_at_once(self):
        # The server closed the connection between the pool's check and the request (a race the check cannot
        # see): a request that could not have been taken goes again on a new connection, without a retry delay.
        sb = self.sandbox()
        self.stub.on("GET", SBX, [Reply(200, sandbox_json("sbx_1"), hang_up=True), Reply(200, sandbox_json("sbx_1"))])
        sb.refresh()
        time.sleep(0.2)
        with mock.patch.object(_http, "_closed_by_peer", return_value=False), \
                mock.patch.object(_http, "RETRY_BASE_DELAY", 5):
            t0 = time.monotonic()
            sb.refresh()
            self.assertLess(time.monotonic() - t0, 2)
        gets = self.stub.reqs("GET", "/v1/sandboxes/sbx_1")
        self.assertGreaterEqual(len(gets), 2)
        self.assertNotEqual(gets[-1].conn, gets[0].conn)

    def test_stream_read_to_its_end_gives_its_connection_back(self):
        self.stub.on("POST", SBX + "/exec", Reply(200, ndjson(
            {"type": "stdout", "data": "a"},
            {"type": "result", "exit_code": 0, "stdout": "a", "stderr": ""}), content_type="application/x-ndjson"))
        sb = self.sandbox()
        out = []
        sb.exec("echo a", on_stdout=out.append)
        self.assertEqual(out, ["a"])
        sb.run_code("1")
        [ex] = self.stub.reqs("POST", "/v1/sandboxes/sbx_1/exec")
        self.assertEqual(self.conns()[0], ex.conn)

    def test_stream_closed_early_is_not_reused(self):
        release = threading.Event()

        def endless(req):
            def gen():
                yield b"x" * 10
                release.wait(5)
                yield b"y" * 10
            return Reply(200, gen())

        self.stub.on("GET", SBX + "/files", endless)
        sb = self.sandbox()
        stream = sb._client.request("GET", "/v1/sandboxes/sbx_1/files", query={"path": "/a"}, stream=True)
        self.assertEqual(stream.read(10), b"x" * 10)
        stream.close()
        release.set()
        sb.run_code("1")
        [files] = self.stub.reqs("GET", "/v1/sandboxes/sbx_1/files")
        self.assertNotEqual(self.conns()[0], files.conn)

    def test_error_answers_keep_the_connection(self):
        sb = self.sandbox()
        self.stub.on("POST", SBX + "/run_code", [Reply(409, {"error": "sandbox is not running"}),
                                                 Reply(200, {"stdout": "", "stderr": "", "value": "1",
                                                             "error": None, "execution_count": 1})])
        with self.assertRaises(Conflict):
            sb.run_code("1")
        sb.run_code("1")
        self.assertEqual(len(set(self.conns())), 1)

    @unittest.skipUnless(hasattr(os, "fork"), "needs os.fork")
    def test_forked_process_opens_its_own(self):
        sb = self.sandbox()
        sb.run_code("1")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its calls must not share the parent's socket
            try:
                sb.run_code("1")
                os.write(w, b"ok")
            finally:
                os._exit(0)
        os.close(w)
        got = os.read(r, 2)
        os.close(r)
        os.waitpid(pid, 0)
        self.assertEqual(got, b"ok")
        sb.run_code("1")  # the parent's connection still works
        parent1, child, parent2 = self.conns()
        self.assertEqual(parent1, parent2)
        self.assertNotEqual(parent1, child)


class TestRetries(unittest.TestCase):
    def setUp(self):
        p = mock.patch.object(_http, "RETRY_BASE_DELAY", 0.2)
        p.start()
        self.addCleanup(p.stop)

    def test_get_retries_until_server_up(self):
        port = free_port()
        holder = {}

        def start_later():
            time.sleep(0.35)
            st = Stub(port=port)
            st.on("GET", SBX, lambda r: Reply(200, sandbox_json(r.match.group(1))))
            holder["stub"] = st.start()

        t = threading.Thread(target=start_later)
        t.start()
        try:
            sb = Sandbox.connect("sbx_x", api_url=f"http://127.0.0.1:{port}", api_key=API_KEY)
            self.assertEqual(sb.id, "sbx_x")
        finally:
            t.join()
            holder["stub"].stop()
        self.assertEqual(len(holder["stub"].reqs("GET")), 1)

    def test_get_gives_up(self):
        port = free_port()
        t0 = time.monotonic()
        with self.assertRaises(ServerUnreachable) as cm:
            Sandbox.connect("sbx_x", api_url=f"http://127.0.0.1:{port}", api_key=API_KEY)
        elapsed = time.monotonic() - t0
        self.assertIn("4 tries", str(cm.exception))
        self.assertGreaterEqual(elapsed, 0.2 + 0.4 + 0.8 - 0.01)
        self.assertIsInstance(cm.exception, ConnectionError)

    def test_post_retried_with_its_key(self):
        # A POST carries an Idempotency-Key, so it is retried like a GET: the server does it at most once.
        port = free_port()
        t0 = time.monotonic()
        with self.assertRaises(ServerUnreachable) as cm:
            Sandbox(api_url=f"http://127.0.0.1:{port}", api_key=API_KEY)
        self.assertGreaterEqual(time.monotonic() - t0, 0.2 + 0.4 + 0.8 - 0.01)
        self.assertIn("4 tries", str(cm.exception))

    def test_post_with_a_streamed_body_not_retried(self):
        from ramify._http import HTTPClient
        port = free_port()
        c = HTTPClient(f"http://127.0.0.1:{port}", API_KEY)
        with self.assertRaises(ServerUnreachable) as cm:
            c.request("POST", "/v1/x", body=iter([b"a"]))
        self.assertIn("1 try", str(cm.exception))

    def test_http_errors_not_retried(self):
        st = Stub().start()
        self.addCleanup(st.stop)
        st.on("GET", SBX, Reply(503, {"error": "overloaded"}))
        with self.assertRaises(ServerError):
            Sandbox.connect("sbx_x", api_url=st.url, api_key=API_KEY)
        self.assertEqual(len(st.reqs("GET")), 1)


class TestAsync(StubTestCase):
    def test_async_surface(self):
        n = 12  # more than the default executor's cpu+4 threads on small machines
        kid_ids = [f"sbx_c{i}" for i in range(1, n + 1)]
        self.stub.on("POST", SBX + "/fork", Reply(200, {"children": kid_ids}))
        self.stub.on("POST", SBX + "/merge_into/(sbx_[a-z0-9]+)", Reply(204))
        barrier = threading.Barrier(n, timeout=5)

        def run_code(req):
            # All children must be in flight at once, or the barrier breaks.
            try:
                barrier.wait()
                ok = True
            except threading.BrokenBarrierError:
                ok = False
            return Reply(200, {"stdout": "", "stderr": "", "value": repr((req.match.group(1), ok)),
                               "error": None, "execution_count": 1})

        self.stub.on("POST", SBX + "/run_code", run_code)
        self.stub.on("PUT", SBX + "/files", lambda r: Reply(200, {"path": r.q("path"), "size": len(r.body)}))
        self.stub.on("GET", SBX + "/files", Reply(200, b"data"))

        async def main():
            async with AsyncSandbox.create(**self.kw(metadata={"k": "v"})) as parent:
                self.assertEqual(parent.id, "sbx_1")
                self.assertEqual(await parent.get_status(), "running")
                kids = await parent.fork(n=n)
                results = await asyncio.gather(*(k.run_code("x") for k in kids))
                self.assertEqual([r.value for r in results], [repr((k, True)) for k in kid_ids])
                await parent.merge_into(kids[0])
                self.assertTrue(kids[0].defunct)
                await asyncio.gather(*(k.close() for k in kids))
                self.assertEqual((await parent.files.write("/a", b"xy"))["size"], 2)
                self.assertEqual(await parent.files.read("/a"), b"data")
                chunks = [c async for c in await parent.files.read_stream("/a")]
                self.assertEqual(b"".join(chunks), b"data")
            sb2 = await AsyncSandbox.create(**self.kw())
            async with sb2:
                pass
            return sb2

        sb2 = asyncio.run(main())
        self.assertTrue(sb2.closed)
        deletes = sorted(r.path for r in self.stub.reqs("DELETE"))
        self.assertEqual(deletes, sorted(["/v1/sandboxes/sbx_1", "/v1/sandboxes/sbx_1"] +
                                         [f"/v1/sandboxes/{k}" for k in kid_ids[1:]]))

    def test_async_stream_callbacks(self):
        self.stub.on("POST", SBX + "/run_code", lambda req: Reply(200, ndjson(
            {"type": "stdout", "data": "a"}, {"type": "stdout", "data": "b"},
            {"type": "result", "stdout": "ab", "stderr": "", "value": None, "error": None, "execution_count": 1}),
            content_type="application/x-ndjson"))
        seen = []

        async def main():
            sb = await AsyncSandbox.create(**self.kw())
            loop_thread = threading.get_ident()

            async def acb(s):
                await asyncio.sleep(0)
                seen.append(("async", s, threading.get_ident() == loop_thread))

            r1 = await sb.run_code("x", on_stdout=lambda s: seen.append(("sync", s, threading.get_ident() == loop_thread)))
            r2 = await sb.run_code("x", on_stdout=acb)
            await sb.close()
            return r1, r2

        r1, r2 = asyncio.run(main())
        self.assertEqual(r1.stdout, "ab")
        self.assertEqual(seen, [("sync", "a", True), ("sync", "b", True), ("async", "a", True), ("async", "b", True)])

    def test_async_errors(self):
        async def main():
            with self.assertRaises(SandboxNotFound):
                self.stub.on("GET", SBX, Reply(404, {"error": "sandbox not found"}))
                await AsyncSandbox.connect("sbx_zz", **self.kw())
            with self.assertRaises(AuthError):
                await AsyncSandbox.create(api_url=self.stub.url, api_key="bad")

        asyncio.run(main())


class TestAsyncSurface(StubTestCase):
    """AsyncSandbox has Sandbox's surface (README: "the same as coroutines")."""

    def test_same_surface_as_sandbox(self):
        import inspect

        def params(fn):
            return [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]

        self.assertEqual(params(AsyncSandbox.__init__), params(Sandbox.__init__), "constructor")
        self.assertEqual([p.name for p in params(AsyncSandbox.create)], [p.name for p in params(Sandbox.__init__)],
                         "AsyncSandbox.create takes the constructor's arguments")
        missing = []
        for name, attr in inspect.getmembers(Sandbox):
            if name.startswith("_"):
                continue
            if not hasattr(AsyncSandbox, name):
                missing.append(name)
                continue
            a = inspect.getattr_static(AsyncSandbox, name)
            sattr = inspect.getattr_static(Sandbox, name)
            if isinstance(sattr, property):
                self.assertIsInstance(a, property, name)
            elif callable(attr):
                afn = getattr(AsyncSandbox, name)
                self.assertTrue(inspect.iscoroutinefunction(afn) or name == "create", f"{name} is not a coroutine function")
                self.assertEqual([p.name for p in params(afn)], [p.name for p in params(attr)], name)
        self.assertEqual(missing, [], "Sandbox attributes AsyncSandbox lacks")

    def test_constructed_like_sandbox(self):
        self.stub.on("POST", "/v1/sandboxes", lambda r: Reply(201, sandbox_json(
            "sbx_1", metadata=json.loads(r.body).get("metadata", {}))))

        async def main():
            sb = AsyncSandbox(**self.kw(metadata={"team": "a"}, timeout_s=60))
            self.assertIn("not created yet", repr(sb))
            with self.assertRaises(RuntimeError):
                sb.id
            self.assertIs(await sb, sb)
            self.assertEqual((sb.id, sb.status, sb.metadata), ("sbx_1", "running", {"team": "a"}))
            await sb.close()
            async with AsyncSandbox(**self.kw()) as sb2:
                self.assertEqual(sb2.status, "running")
            return sb2

        sb2 = asyncio.run(main())
        self.assertTrue(sb2.closed)
        creates = self.stub.reqs("POST", "/v1/sandboxes")
        self.assertEqual(len(creates), 2)
        self.assertEqual(json.loads(creates[0].body), {"metadata": {"team": "a"}, "timeout_s": 60})

    def test_set_timeout_and_run_env(self):
        self.stub.on("POST", SBX + "/timeout", lambda r: Reply(200, dict(sandbox_json(r.match.group(1)),
                                                                           timeout_s=json.loads(r.body)["timeout_s"])))
        self.stub.on("POST", SBX + "/run_code", Reply(200, {"stdout": "", "stderr": "", "value": "'1'",
                                                            "error": None, "execution_count": 1}))

        async def main():
            async with AsyncSandbox(**self.kw()) as sb:
                info = await sb.set_timeout(600)
                self.assertEqual((info["timeout_s"], sb.info["timeout_s"]), (600, 600))
                await sb.run_code("import os; os.environ['A']", env={"A": 1})

        asyncio.run(main())
        self.assertEqual(json.loads(self.stub.reqs("POST", "/v1/sandboxes/sbx_1/timeout")[0].body), {"timeout_s": 600})
        self.assertEqual(json.loads(self.stub.reqs("POST", "/v1/sandboxes/sbx_1/run_code")[0].body),
                         {"code": "import os; os.environ['A']", "env": {"A": "1"}})
        with Sandbox(**self.kw()) as sb:
            with self.assertRaises(TypeError):
                sb.set_timeout(1.5)


class TestMisc(unittest.TestCase):
    def test_version_and_exports(self):
        self.assertTrue(ramify.__version__)
        for name in ramify.__all__:
            self.assertTrue(hasattr(ramify, name), name)

    def test_execution_repr(self):
        ex = Execution.from_dict({"stdout": "x" * 500, "value": "1", "execution_count": 4})
        r = repr(ex)
        self.assertLess(len(r), 200)
        self.assertIn("execution_count=4", r)

    def test_url_with_base_path(self):
        c = _http.HTTPClient("https://example.com/ramify/", "k")
        self.assertEqual(c.url_for("/v1/sandboxes", {"a": "b c", "n": None}), "/ramify/v1/sandboxes?a=b+c")


if __name__ == "__main__":
    unittest.main()


class TestResult(unittest.TestCase):
    """Result's accessors and save(), on a bundle as the server sends it (no server needed)."""

    def test_formats_and_save(self):
        import base64
        png = b"\x89PNG\r\n\x1a\nbody"
        r = ramify.Result.from_dict({"type": "display_data", "data": {
            "image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>", "application/json": {"a": 1}}})
        self.assertEqual((r.type, r.png, r.text, r.json, r.html), ("display_data", png, "<Figure>", {"a": 1}, None))
        self.assertEqual(r.formats(), ["image/png", "text/plain", "application/json"])
        with tempfile.TemporaryDirectory() as d:
            with open(r.save(os.path.join(d, "a.png")), "rb") as f:
                self.assertEqual(f.read(), png)
            with open(r.save(os.path.join(d, "a.json")), "rb") as f:
                self.assertEqual(json.loads(f.read()), {"a": 1})
            with open(r.save(os.path.join(d, "noext")), "rb") as f:  # the richest format: PNG
                self.assertEqual(f.read(), png)
            with self.assertRaises(ValueError):
                r.save(os.path.join(d, "a.html"), format="text/html")
        ex = ramify.Execution.from_dict({"value": "1", "results": [{"type": "execute_result", "data": {"text/plain": "1"}}]})
        self.assertEqual(ex.results[0].text, "1")
        self.assertEqual(ramify.Execution.from_dict({}).results, [])
