"""Integration tests against a real ramify server.

Skipped unless RAMIFY_API_URL and RAMIFY_API_KEY are set. Fork/merge/diff tests also need
RAMIFY_TEST_FORK=1, pause/resume tests RAMIFY_TEST_PAUSE=1.

    RAMIFY_API_URL=http://127.0.0.1:7070 RAMIFY_API_KEY=... \\
        /usr/bin/python3 -m unittest discover -s tests -v
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import tempfile
import time
import unittest
import urllib.parse
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from ramify import (  # noqa: E402
    AsyncSandbox,
    AuthError,
    Conflict,
    FileNotFound,
    InvalidRequest,
    NotFound,
    RamifyError,
    Sandbox,
    SandboxDefunct,
    SandboxNotFound,
)

API_URL = os.environ.get("RAMIFY_API_URL")
API_KEY = os.environ.get("RAMIFY_API_KEY")
HAVE_SERVER = bool(API_URL and API_KEY)
SKIP_MSG = ("integration tests need a running ramify server: set RAMIFY_API_URL and RAMIFY_API_KEY "
            "(e.g. RAMIFY_API_URL=http://127.0.0.1:7070)")
FORK = os.environ.get("RAMIFY_TEST_FORK") == "1"
PAUSE = os.environ.get("RAMIFY_TEST_PAUSE") == "1"
RUN_ID = uuid.uuid4().hex[:12]
META = {"suite": "ramify-python-sdk-tests", "run": RUN_ID}


def _sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tree(root: str) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = "dir"
        for f in filenames:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.normpath(os.path.join(rel, f))] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _ed25519_line(raw: bytes, comment: str) -> str:
    """An authorized_keys line for the ed25519 public key raw (32 bytes): any 32 bytes make a parseable key."""
    import base64
    import struct

    def string(b: bytes) -> bytes:
        return struct.pack(">I", len(b)) + b
    blob = string(b"ssh-ed25519") + string(raw)
    return "ssh-ed25519 " + base64.b64encode(blob).decode() + " " + comment


def _fingerprint(line: str) -> str:
    """The key's SHA256 fingerprint, as ssh-keygen -l prints it."""
    import base64
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@unittest.skipUnless(HAVE_SERVER, SKIP_MSG)
class TestIntegration(unittest.TestCase):
    sb: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = Sandbox(metadata=META)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.close()

    # -- lifecycle -----------------------------------------------------------------------------------
    def test_create_and_close(self):
        sb = Sandbox(metadata=META, env={"FOO": "bar"})
        try:
            self.assertTrue(sb.id.startswith("sbx_"))
            self.assertEqual(sb.status, "running")
            self.assertEqual(sb.info["metadata"], META)
            self.assertTrue(sb.ip)
            self.assertEqual(sb.exec("echo $FOO").stdout.strip(), "bar")
        finally:
            sb.close()
        sb.close()  # second close is fine
        with self.assertRaises(SandboxNotFound):
            Sandbox.connect(sb.id)

    def test_context_manager(self):
        with Sandbox(metadata=META) as sb:
            sid = sb.id
            self.assertEqual(sb.run_code("1 + 1").value, "2")
        with self.assertRaises(SandboxNotFound):
            Sandbox.connect(sid)

    def test_ingress_url(self):
        import urllib.error
        import urllib.request
        with Sandbox(metadata=META, ingress_enabled=True) as sb:
            self.assertTrue(sb.info["ingress"]["enabled"])
            # Bound, then detached: the port listens when exec returns.
            r = sb.exec("mkdir -p /srv && echo hi-from-sandbox > /srv/hello.txt && python3 -c \"import http.server, os, "
                        "functools; s = http.server.ThreadingHTTPServer(('0.0.0.0', 8000), functools.partial("
                        "http.server.SimpleHTTPRequestHandler, directory='/srv')); os.fork() and os._exit(0); "
                        "os.setsid(); s.serve_forever()\" </dev/null >/dev/null 2>&1")
            self.assertEqual(r.exit_code, 0, r)
            url = sb.url(8000)
            self.assertIn("8000-" + sb.id[4:] + ".localhost", url)
            # *.localhost is loopback; urllib does not know that, so connect to 127.0.0.1 with the Host header.
            u = urllib.parse.urlsplit(url)
            req = urllib.request.Request(f"http://127.0.0.1:{u.port}/hello.txt", headers={"Host": u.netloc})
            with urllib.request.urlopen(req, timeout=30) as resp:
                self.assertEqual(resp.read(), b"hi-from-sandbox\n")
            req = urllib.request.Request(sb.api_url(8000) + "hello.txt",
                                         headers={"Authorization": "Bearer " + API_KEY})
            with urllib.request.urlopen(req, timeout=30) as resp:
                self.assertEqual(resp.read(), b"hi-from-sandbox\n")
        with self.assertRaises(RamifyError):
            self.sb.url(8000)  # not ingress-enabled

    def test_list_and_connect(self):
        ids = [s.id for s in Sandbox.list(metadata={"run": RUN_ID})]
        self.assertIn(self.sb.id, ids)
        ids = [s.id for s in Sandbox.list(metadata={"run": "no-such-run-" + RUN_ID})]
        self.assertNotIn(self.sb.id, ids)
        self.assertIn(self.sb.id, [s.id for s in Sandbox.list(status="running")])
        self.sb.run_code("connect_marker = 'here'")
        other = Sandbox.connect(self.sb.id)
        self.assertEqual(other.id, self.sb.id)
        self.assertEqual(other.run_code("connect_marker").value, "'here'")

    def test_bad_key(self):
        with self.assertRaises(AuthError):
            Sandbox.list(api_key="definitely-wrong")
        with self.assertRaises(AuthError):
            Sandbox(api_key="definitely-wrong")

    def test_unknown_id(self):
        with self.assertRaises(SandboxNotFound):
            Sandbox.connect("sbx_" + "0" * 32)

    # -- run_code ----------------------------------------------------------------------------------
    def test_run_code_persistence(self):
        self.sb.run_code("x = 42")
        ex = self.sb.run_code("x + 1")
        self.assertEqual(ex.value, "43")
        self.assertEqual(ex.text, "43")
        self.assertIsNone(ex.error)

    def test_stdout_capture(self):
        ex = self.sb.run_code("print('hello'); import sys; print('oops', file=sys.stderr)")
        self.assertEqual(ex.stdout, "hello\n")
        self.assertEqual(ex.stderr, "oops\n")
        self.assertIsNone(ex.value)

    def test_exception(self):
        ex = self.sb.run_code("1/0")
        self.assertIsNotNone(ex.error)
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertIn("division by zero", ex.error.value)
        self.assertIn("Traceback", ex.error.traceback)

    def test_traceback_shows_the_users_lines(self):
        # As a notebook shows it: each cell's own lines, also of a function defined in an earlier cell; no
        # frame of ramify's and, for a SyntaxError, no ast.py frame.
        with Sandbox(metadata=META) as sb:
            sb.run_code("def half(x):\n    return x / 0\n")
            err = sb.run_code("y = 4\nhalf(y)").error
            self.assertIsNotNone(err)
            tb = err.traceback
            self.assertIn("half(y)", tb)
            self.assertIn("return x / 0", tb)
            self.assertNotIn("repl", tb.lower())
            self.assertTrue(tb.startswith("Traceback (most recent call last):\n  File \"<cell"), tb)
            syn = sb.run_code("x = (1,\n").error
            self.assertEqual(syn.name, "SyntaxError")
            self.assertIn("x = (1,", syn.traceback)
            self.assertNotIn("ast.py", syn.traceback)
            self.assertNotIn("Traceback (most recent call last)", syn.traceback)
            # A timeout says so, after showing where the code was interrupted.
            to = sb.run_code("import time\ntime.sleep(30)", timeout_s=1).error
            self.assertEqual(to.name, "TimeoutError")
            self.assertIn("time.sleep(30)", to.traceback)
            self.assertTrue(to.traceback.rstrip().endswith("TimeoutError: execution exceeded 1s and was interrupted"),
                            to.traceback)

    def test_run_code_env_is_per_call(self):
        sb = self.sb
        sb.run_code("import os; os.environ['KEEP'] = 'before'")
        r = sb.run_code("import os, subprocess\n"
                        "(os.environ['KEEP'], os.environ['ONLY'], subprocess.run(['sh', '-c', 'echo $ONLY'],"
                        " capture_output=True, text=True).stdout.strip())",
                        env={"KEEP": "during", "ONLY": "this-cell"})
        self.assertIsNone(r.error)
        self.assertEqual(r.value, "('during', 'this-cell', 'this-cell')")
        self.assertEqual(sb.run_code("import os; (os.environ['KEEP'], os.environ.get('ONLY'))").value,
                         "('before', None)")
        with self.assertRaises(InvalidRequest):
            sb.run_code("1", env={"A=B": "x"})

    def test_interrupt_stops_running_calls(self):
        import threading

        with Sandbox(metadata=META) as sb:
            sb.run_code("x = 'kept'")
            started = threading.Event()
            result = {}

            def cell():
                result["r"] = sb.run_code("import time\nprint('started', flush=True)\nwhile True: time.sleep(0.05)",
                                          on_stdout=lambda _: started.set())

            t = threading.Thread(target=cell)
            t.start()
            self.assertTrue(started.wait(60))
            self.assertEqual(sb.interrupt("run_code"), {"run_code": 1, "exec": 0})
            t.join(60)
            r = result["r"]
            self.assertEqual(r.error.name, "KeyboardInterrupt")
            self.assertTrue(r.interrupted)
            self.assertEqual(sb.run_code("x").value, "'kept'")
            self.assertEqual(sb.interrupt(), {"run_code": 0, "exec": 0})
            with self.assertRaises(ValueError):
                sb.interrupt("everything")

    def test_set_timeout_keeps_alive(self):
        with Sandbox(metadata=META, timeout_s=30) as sb:
            first = sb.info["expires_at"]
            info = sb.set_timeout(3600)
            self.assertEqual(info["timeout_s"], 3600)
            self.assertGreater(info["expires_at"], first)
            self.assertEqual(sb.refresh()["expires_at"], info["expires_at"])
            info = sb.set_timeout(0)
            self.assertIsNone(info["expires_at"])
            with self.assertRaises(InvalidRequest):
                sb.set_timeout(-1)

    def test_ssh_keys(self):
        k1, k2 = _ed25519_line(b"\x01" * 32, "one@test"), _ed25519_line(b"\x02" * 32, "two@test")
        with self.assertRaises(InvalidRequest):
            Sandbox(metadata=META, ssh_pubkeys=["ssh-ed25519 not-a-key"])
        with Sandbox(metadata=META, ssh_pubkeys=[k1]) as sb:
            keys = sb.info["ssh"]["keys"]
            self.assertEqual([k["fingerprint"] for k in keys], [_fingerprint(k1)])
            self.assertEqual(keys[0]["comment"], "one@test")
            # the test server runs --ssh-listen (scripts/with-test-server)
            self.assertTrue(sb.info["ssh"]["command"].startswith("ssh -p "), sb.info["ssh"])
            self.assertIn(sb.id + "@", sb.info["ssh"]["command"])
            info = sb.add_ssh_keys([k2, k1])  # k1 again: skipped
            self.assertEqual([k["fingerprint"] for k in info["ssh"]["keys"]], [_fingerprint(k1), _fingerprint(k2)])
            self.assertEqual(len(sb.refresh()["ssh"]["keys"]), 2)
            with self.assertRaises(InvalidRequest):
                sb.add_ssh_keys(["nonsense"])

    async def _async_ssh_keys(self):
        k1 = _ed25519_line(b"\x03" * 32, "async@test")
        sb = await AsyncSandbox(metadata=META)
        try:
            info = await sb.add_ssh_keys(k1)
            self.assertEqual(info["ssh"]["keys"][0]["fingerprint"], _fingerprint(k1))
        finally:
            await sb.close()

    def test_ssh_keys_async(self):
        asyncio.run(self._async_ssh_keys())

    def test_async_constructed_like_sandbox(self):
        async def main():
            async with AsyncSandbox(metadata=META, timeout_s=120) as sb:
                self.assertEqual(sb.status, "running")
                self.assertEqual(sb.metadata, META)
                info = await sb.set_timeout(600)
                self.assertEqual(info["timeout_s"], 600)
                return (await sb.run_code("import os; os.environ['E']", env={"E": "x"})).value

        self.assertEqual(asyncio.run(main()), "'x'")

    def test_run_code_timeout_keeps_state(self):
        self.sb.run_code("survivor = 7")
        ex = self.sb.run_code("import time\ntime.sleep(30)", timeout_s=1)
        self.assertEqual(ex.error.name, "TimeoutError")
        self.assertEqual(self.sb.run_code("survivor").value, "7")

    def test_streaming_callbacks_before_result(self):
        got = []

        def on_out(s):
            got.append((time.monotonic(), s))

        code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second', flush=True)\n'done'"
        ex = self.sb.run_code(code, on_stdout=on_out)
        done = time.monotonic()
        self.assertEqual(ex.value, "'done'")
        self.assertEqual("".join(s for _, s in got), "first\nsecond\n")
        self.assertEqual(ex.stdout, "first\nsecond\n")
        first_at = next(t for t, s in got if "first" in s)
        self.assertGreater(done - first_at, 1.0, "stdout was not delivered before the result")

    def test_rich_results(self):
        ex = self.sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        self.assertEqual([r.type for r in ex.results], ["display_data"])
        png = ex.results[0].png
        self.assertTrue(png and png.startswith(b"\x89PNG\r\n\x1a\n"), ex.results)
        self.assertIn("image/png", ex.results[0].formats())
        with tempfile.TemporaryDirectory() as d:
            path = ex.results[0].save(os.path.join(d, "chart.png"))
            with open(path, "rb") as f:
                self.assertEqual(f.read(), png)
        ex = self.sb.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        r = ex.results[0]
        self.assertEqual(r.type, "execute_result")
        self.assertIn("<table", r.html or "")
        self.assertEqual(r.text, ex.value)
        self.assertIsNone(r.png)
        ex = self.sb.run_code("from IPython.display import JSON, SVG\n"
                              "display(JSON({'k': [1]}), SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>'))")
        self.assertEqual(ex.results[0].json, {"k": [1]})
        self.assertIn("<svg", ex.results[1].svg or "")

    def test_rich_results_streamed(self):
        got = []
        ex = self.sb.run_code("print('a')\ndisplay('shown')\nprint('b')", on_stdout=lambda s: got.append(s),
                              on_result=lambda r: got.append(r))
        self.assertEqual([g if isinstance(g, str) else g.text for g in got], ["a", "\n", "'shown'", "b", "\n"])
        self.assertEqual(ex.results, [g for g in got if not isinstance(g, str)])

    def test_exec_streaming(self):
        out = []
        res = self.sb.exec("echo one; sleep 0.5; echo two >&2; exit 4", on_stdout=out.append)
        self.assertEqual(res.exit_code, 4)
        self.assertEqual("".join(out), "one\n")
        self.assertEqual(res.stderr, "two\n")

    # -- exec --------------------------------------------------------------------------------------
    def test_exec_str_and_argv(self):
        r = self.sb.exec("echo hi && echo err >&2")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.timed_out), (0, "hi\n", "err\n", False))
        r = self.sb.exec(["printf", "%s|", "a b", "$HOME"])
        self.assertEqual(r.stdout, "a b|$HOME|")  # no shell: no splitting, no expansion

    def test_exec_exit_codes_env_cwd_stdin(self):
        self.assertEqual(self.sb.exec("exit 3").exit_code, 3)
        self.assertEqual(self.sb.exec(["false"]).exit_code, 1)
        self.assertEqual(self.sb.exec("kill -9 $$").exit_code, 137)
        self.assertEqual(self.sb.exec("echo $A", env={"A": "x"}).stdout, "x\n")
        self.assertEqual(self.sb.exec("pwd", cwd="/tmp").stdout, "/tmp\n")
        self.assertEqual(self.sb.exec("cat", stdin="piped").stdout, "piped")

    def test_exec_timeout(self):
        r = self.sb.exec("sleep 30", timeout_s=1)
        self.assertTrue(r.timed_out)

    # -- files -------------------------------------------------------------------------------------
    def test_files_binary_round_trip(self):
        data = bytes(range(256)) * 64
        res = self.sb.files.write("/root/it/bin.dat", data)
        self.assertEqual(res["size"], len(data))
        self.assertEqual(self.sb.files.read("/root/it/bin.dat"), data)
        self.sb.files.write("/root/it/t.txt", "héllo ✓")
        self.assertEqual(self.sb.files.read_text("/root/it/t.txt"), "héllo ✓")
        self.assertEqual(self.sb.run_code("open('/root/it/t.txt', encoding='utf-8').read()").value, repr("héllo ✓"))

    def test_files_20mb(self):
        size = 20 * 1024 * 1024
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "big.bin")
            with open(src, "wb") as f:
                for _ in range(20):
                    f.write(os.urandom(1024 * 1024))
            with open(src, "rb") as f:
                res = self.sb.files.write("/root/big.bin", f)
            self.assertEqual(res["size"], size)
            self.assertEqual(self.sb.files.stat("/root/big.bin").size, size)
            r = self.sb.exec("sha256sum /root/big.bin")
            self.assertEqual(r.stdout.split()[0], _sha(src))
            dst = os.path.join(d, "back.bin")
            self.assertEqual(self.sb.files.download_file("/root/big.bin", dst), size)
            self.assertEqual(_sha(dst), _sha(src))
            h = hashlib.sha256()
            for chunk in self.sb.files.read_stream("/root/big.bin", chunk_size=256 * 1024):
                h.update(chunk)
            self.assertEqual(h.hexdigest(), _sha(src))
            self.assertEqual(hashlib.sha256(self.sb.files.read("/root/big.bin")).hexdigest(), _sha(src))
        self.sb.files.remove("/root/big.bin")

    def test_files_list_stat_mkdir_remove(self):
        fs = self.sb.files
        d = "/root/lsm"
        entry = fs.mkdir(d + "/a/b/c")
        self.assertEqual(entry.type, "dir")
        fs.write(d + "/f.txt", b"12345", mode=0o600)
        fs.write(d + "/g.sh", "#!/bin/sh\necho ok\n", mode=0o755)
        names = [e.name for e in fs.list(d)]
        self.assertEqual(names, sorted(names))
        self.assertEqual(set(names), {"a", "f.txt", "g.sh"})
        st = fs.stat(d + "/f.txt")
        self.assertEqual((st.type, st.size, st.mode, st.name, st.path), ("file", 5, "0600", "f.txt", d + "/f.txt"))
        self.assertEqual(fs.stat(d + "/g.sh").mode, "0755")
        self.assertEqual(self.sb.exec(d + "/g.sh").stdout, "ok\n")
        self.assertTrue(fs.exists(d + "/a/b/c"))
        with self.assertRaises(InvalidRequest):
            fs.read(d + "/a")  # a directory
        with self.assertRaises(RamifyError):
            fs.mkdir(d + "/x/y", parents=False)
        fs.remove(d + "/f.txt")
        self.assertFalse(fs.exists(d + "/f.txt"))
        with self.assertRaises(RamifyError):
            fs.remove(d + "/a")  # non-empty directory without recursive
        fs.remove(d, recursive=True)
        self.assertFalse(fs.exists(d))
        with self.assertRaises(FileNotFound):
            fs.read(d + "/nope")
        with self.assertRaises(FileNotFound):
            fs.stat("/root/definitely/not/here")

    def test_upload_download_dir(self):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "src")
            os.makedirs(os.path.join(src, "pkg", "sub"))
            os.makedirs(os.path.join(src, "empty"))
            with open(os.path.join(src, "README"), "w") as f:
                f.write("hello\n")
            with open(os.path.join(src, "pkg", "sub", "data.bin"), "wb") as f:
                f.write(os.urandom(300_000))
            with open(os.path.join(src, "pkg", "__init__.py"), "w") as f:
                f.write("VALUE = 5\n")
            res = self.sb.files.upload_dir(src, "/root/proj")
            self.assertEqual(res.get("path"), "/root/proj")
            self.assertEqual(self.sb.files.read_text("/root/proj/README"), "hello\n")
            self.assertEqual(self.sb.run_code("import sys; sys.path.insert(0, '/root/proj')\n"
                                              "import pkg; pkg.VALUE").value, "5")
            self.assertTrue(self.sb.files.stat("/root/proj/empty").is_dir)
            dst = os.path.join(d, "dst")
            self.sb.exec("rm -rf /root/proj/pkg/__pycache__")
            self.sb.files.download_dir("/root/proj", dst)
            self.assertEqual(_tree(dst), _tree(src))

    def test_async(self):
        async def main():
            async with AsyncSandbox.create(metadata=META) as sb:
                await sb.run_code("y = 2")
                r1, r2 = await asyncio.gather(sb.exec("echo a"), sb.files.write("/root/async.txt", b"z"))
                self.assertEqual(r1.stdout, "a\n")
                self.assertEqual(await sb.files.read("/root/async.txt"), b"z")
                shown = []
                ex = await sb.run_code("display(y)", on_result=shown.append)
                self.assertEqual([r.text for r in shown], ["2"])
                self.assertEqual(ex.results, shown)
                return (await sb.run_code("y * 21")).value

        self.assertEqual(asyncio.run(main()), "42")


@unittest.skipUnless(HAVE_SERVER, SKIP_MSG)
@unittest.skipUnless(FORK, "fork/merge/diff tests: set RAMIFY_TEST_FORK=1 once the server supports fork")
class TestForkIntegration(unittest.TestCase):
    def test_fork_ssh_keys(self):
        k1, k2 = _ed25519_line(b"\x04" * 32, "parent@test"), _ed25519_line(b"\x05" * 32, "child@test")
        with Sandbox(metadata=META, ssh_pubkeys=[k1]) as parent:
            children = parent.fork(n=1, ssh_pubkeys=[k2])
            try:
                got = [k["fingerprint"] for k in children[0].refresh()["ssh"]["keys"]]
                self.assertEqual(got, [_fingerprint(k1), _fingerprint(k2)])
                self.assertEqual([k["fingerprint"] for k in parent.refresh()["ssh"]["keys"]], [_fingerprint(k1)])
            finally:
                for c in children:
                    c.close()

    def test_fork_inherits_and_isolates(self):
        with Sandbox(metadata=META) as parent:
            parent.run_code("x = 42; import json")
            parent.files.write("/root/base.txt", b"base")
            children = parent.fork(n=3)
            try:
                self.assertEqual(len(children), 3)
                self.assertEqual(len({c.id for c in children} | {parent.id}), 4)
                for i, c in enumerate(children):
                    self.assertEqual(c.run_code("x + 1").value, "43")
                    self.assertEqual(c.run_code("json.dumps([1])").value, "'[1]'")
                    self.assertEqual(c.files.read("/root/base.txt"), b"base")
                    c.run_code(f"x = {i}")
                    c.files.write("/root/base.txt", f"child {i}")
                self.assertEqual(parent.run_code("x").value, "42")
                self.assertEqual(parent.files.read("/root/base.txt"), b"base")
                self.assertEqual([c.run_code("x").value for c in children], ["0", "1", "2"])
                self.assertEqual(children[0].info.get("parent_id") or children[0].refresh().get("parent_id"),
                                 parent.id)
            finally:
                for c in children:
                    c.close()

    def test_fork_limits(self):
        with Sandbox(metadata=META) as parent:
            with self.assertRaises(InvalidRequest):
                parent.fork(n=33)
            with self.assertRaises(InvalidRequest):
                parent.fork(n=0)

    def test_diff(self):
        with Sandbox(metadata=META) as parent:
            parent.files.write("/root/same.txt", b"same")
            parent.files.write("/root/mod.txt", b"v1")
            a, b = parent.fork(n=2)
            try:
                a.run_code("open('/root/a.txt','w').write('from a')")
                b.run_code("open('/root/b.txt','w').write('from b')")
                b.files.write("/root/mod.txt", b"v2")
                d = a.diff(b)
                self.assertIn("/root/b.txt", d["added"])
                self.assertIn("/root/a.txt", d["removed"])
                self.assertIn("/root/mod.txt", d["modified"])
                self.assertNotIn("/root/same.txt", d["added"] + d["removed"] + d["modified"])
                b.files.write("/srv/x.txt", b"x")
                d2 = a.diff(b, paths=["/srv"])
                self.assertEqual(d2["added"], ["/srv/x.txt"])
            finally:
                a.close()
                b.close()

    def test_merge_into(self):
        with Sandbox(metadata=META) as parent:
            parent.run_code("v = 'parent'")
            children = parent.fork(n=3)
            winner = children[1]
            try:
                winner.run_code("v = 'winner'")
                winner.files.write("/root/won.txt", b"yes")
                parent.merge_into(winner)
                self.assertEqual(parent.run_code("v").value, "'winner'")
                self.assertEqual(parent.files.read("/root/won.txt"), b"yes")
                self.assertTrue(winner.defunct)
                with self.assertRaises(SandboxDefunct):
                    winner.run_code("1")
                with self.assertRaises(SandboxNotFound):
                    Sandbox.connect(winner.id)
                with self.assertRaises(SandboxNotFound):
                    parent.merge_into(winner.id)  # second merge of the same winner: 404
                with self.assertRaises(InvalidRequest):
                    parent.merge_into(parent)
                self.assertEqual(children[0].run_code("v").value, "'parent'")  # siblings untouched
            finally:
                for c in children:
                    c.close()  # no-op for the defunct winner

    def test_async_children_concurrently(self):
        async def main():
            async with AsyncSandbox.create(metadata=META) as parent:
                await parent.run_code("import time; base = 10")
                kids = await parent.fork(n=4)
                try:
                    t0 = time.monotonic()
                    res = await asyncio.gather(*(k.run_code(f"time.sleep(1); base + {i}") for i, k in enumerate(kids)))
                    elapsed = time.monotonic() - t0
                    return [r.value for r in res], elapsed
                finally:
                    await asyncio.gather(*(k.close() for k in kids))

        values, elapsed = asyncio.run(main())
        self.assertEqual(values, ["10", "11", "12", "13"])
        self.assertLess(elapsed, 3.5)


@unittest.skipUnless(HAVE_SERVER, SKIP_MSG)
@unittest.skipUnless(PAUSE, "pause/resume tests: set RAMIFY_TEST_PAUSE=1 once the server supports pause")
class TestPauseIntegration(unittest.TestCase):
    def test_pause_resume(self):
        with Sandbox(metadata=META) as sb:
            sb.run_code("kept = [1, 2, 3]")
            sb.files.write("/root/kept.txt", b"kept")
            info = sb.pause()
            self.assertEqual(info["status"], "paused")
            self.assertEqual(sb.status, "paused")
            self.assertEqual(sb.pause()["status"], "paused")  # idempotent
            with self.assertRaises(Conflict):
                sb.run_code("1")
            info = sb.resume()
            self.assertEqual(info["status"], "running")
            self.assertEqual(sb.resume()["status"], "running")  # idempotent
            self.assertEqual(sb.run_code("sum(kept)").value, "6")
            self.assertEqual(sb.files.read("/root/kept.txt"), b"kept")

    def test_pause_reports_progress(self):
        # A pause that takes a few seconds whatever the disk (each of 25 objects waits 0.1 s as it is saved, then
        # writes 8 MiB): on_progress, called about twice a second, hears how far it got, in order. (A state of
        # 1.5 GiB paused in about a second on a fast disk: the polling could see only its start.)
        with Sandbox(metadata=META) as sb:
            sb.run_code("import time\nclass Slow:\n    def __init__(self):\n        self.data = bytes(8 << 20)\n"
                        "    def __reduce__(self):\n        time.sleep(0.1)\n        return bytes, (self.data,)\n"
                        "objs = [Slow() for _ in range(25)]")
            seen = []
            sb.pause(on_progress=seen.append)
            self.assertGreaterEqual(len(seen), 2, seen)
            for p in seen:
                self.assertIn(p["phase"], ("session", "files", "commit"))
            self.assertEqual([p["bytes"] for p in seen], sorted(p["bytes"] for p in seen))
            self.assertGreater(seen[-1]["bytes"], 0, seen)
            sb.resume()
            self.assertEqual(sb.run_code("len(objs), len(objs[0])").value, "(25, 8388608)")

    def test_traceback_lines_survive_pause(self):
        # A function defined before the pause still shows its cell's lines when it fails after the resume.
        with Sandbox(metadata=META) as sb:
            sb.run_code("def boom():\n    raise ValueError('after resume')\n")
            sb.pause()
            sb.resume()
            err = sb.run_code("boom()").error
            self.assertEqual(err.name, "ValueError")
            self.assertIn("raise ValueError('after resume')", err.traceback)

    def test_pause_no_wait(self):
        with Sandbox(metadata=META) as sb:
            info = sb.pause(wait=False)
            self.assertIn(info["status"], ("pausing", "paused"))
            sb.wait_for_status("paused", timeout=120)
            sb.resume()
            self.assertEqual(sb.run_code("1 + 1").value, "2")


@unittest.skipUnless(HAVE_SERVER, SKIP_MSG)
@unittest.skipUnless(PAUSE, "template tests need the snapshot store: set RAMIFY_TEST_PAUSE=1")
class TestTemplateIntegration(unittest.TestCase):
    def test_save_create_delete(self):
        name = f"py-{RUN_ID}"
        with Sandbox(metadata=META) as src:
            src.run_code("import json\ndata = {'rows': list(range(1000))}")
            src.files.write("/root/model.txt", b"weights")
            t = src.save_template(name)
            self.assertEqual((t["name"], t["from"]), (name, src.id))
            self.assertGreater(t["size"], 0)
            with self.assertRaises(Conflict):
                src.save_template(name)
            self.assertEqual(src.run_code("len(data['rows'])").value, "1000")  # still running
        try:
            self.assertIn(name, [x["name"] for x in Sandbox.list_templates()])
            self.assertEqual(Sandbox.get_template(name)["name"], name)
            with Sandbox(template=name, metadata=META) as a, Sandbox(template=name, metadata=META) as b:
                self.assertEqual(a.info.get("template"), name)
                self.assertNotEqual(a.id, b.id)
                self.assertEqual(a.run_code("sum(data['rows'])").value, "499500")
                self.assertEqual(a.files.read("/root/model.txt"), b"weights")
                a.run_code("data['rows'] = []")
                self.assertEqual(b.run_code("len(data['rows'])").value, "1000")
        finally:
            Sandbox.delete_template(name)
        with self.assertRaises(NotFound) as cm:
            Sandbox.get_template(name)
        self.assertNotIsInstance(cm.exception, SandboxNotFound)
        with self.assertRaises(NotFound):
            Sandbox(template=name, metadata=META)


def _serve_wheel_index(project: str, version: str, module: str, source: str):
    """Serve a PEP 503 simple index on loopback with one pure-Python wheel (written here with zipfile)
    and return (url, server)."""
    import base64
    import http.server
    import io
    import threading
    import zipfile

    dist = project.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {f"{module}.py": source,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: ramify-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        record = []
        for name, body in files.items():
            z.writestr(name, body)
            digest = base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(body)}")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    wheel = buf.getvalue()
    wheel_name = f"{dist}-{version}-py3-none-any.whl"
    page = f'<a href="/files/{wheel_name}#sha256={hashlib.sha256(wheel).hexdigest()}">{wheel_name}</a>'.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == f"/simple/{project}/":
                body, ctype = page, "text/html"
            elif self.path == f"/files/{wheel_name}":
                body, ctype = wheel, "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}/simple/", srv


@unittest.skipUnless(HAVE_SERVER, SKIP_MSG)
@unittest.skipUnless(os.environ.get("RAMIFY_TEST_IMAGES") == "1",
                     "image tests build images on the server: run through scripts/with-test-server (RAMIFY_TEST_IMAGES=1)")
class TestImageIntegration(unittest.TestCase):
    def test_build_create_fork_delete(self):
        name = f"py-{RUN_ID}"
        index, srv = _serve_wheel_index("ramify-py-hello", "0.1", "ramify_py_hello", "GREETING = 'hi from pip'\n")
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        with self.assertRaises(InvalidRequest):
            Sandbox.build_image("Bad Name", apt=["tree"])
        lines = []
        img = Sandbox.build_image(name, apt=["tree"], pip=["ramify-py-hello==0.1"], pip_index=index,
                                  on_progress=lines.append)
        try:
            self.assertEqual(img["name"], name)
            self.assertTrue(any("pip: installed ramify-py-hello-0.1" in line for line in lines), lines)
            self.assertIn(name, [x["name"] for x in Sandbox.list_images()])
            with Sandbox(image=name, metadata=META) as sb:
                self.assertEqual(sb.info.get("image"), name)
                self.assertEqual(sb.exec("tree -L 1 / >/dev/null && echo ok").stdout, "ok\n")
                self.assertEqual(sb.run_code("import ramify_py_hello; ramify_py_hello.GREETING").value, "'hi from pip'")
                if FORK:
                    kid = sb.fork(1)[0]
                    try:
                        self.assertEqual(kid.refresh().get("image"), name)
                        self.assertEqual(kid.run_code("ramify_py_hello.GREETING").value, "'hi from pip'")
                    finally:
                        kid.close()
                with self.assertRaises(Conflict):
                    Sandbox.delete_image(name)
        finally:
            Sandbox.delete_image(name)
        with self.assertRaises(NotFound) as cm:
            Sandbox.get_image(name)
        self.assertNotIsInstance(cm.exception, SandboxNotFound)
        with self.assertRaises(NotFound) as cm:
            Sandbox(image=name, metadata=META)
        self.assertNotIsInstance(cm.exception, SandboxNotFound)


if __name__ == "__main__":
    unittest.main()
