"""A tiny in-process HTTP stub of the ramify API for unit tests (no real server needed)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

API_KEY = "test-key"


class Req:
    def __init__(self, method: str, path: str, query: Dict[str, List[str]], headers: Any, body: bytes,
                 chunked: bool, match: Optional[re.Match]):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.chunked = chunked
        self.match = match
        self.conn: Any = None  # the client's (host, port): which connection carried the request

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def q(self, key: str) -> Optional[str]:
        v = self.query.get(key)
        return v[0] if v else None

    def __repr__(self) -> str:
        return f"<Req {self.method} {self.path} {self.query}>"


class Reply:
    """status + body; body is a JSON-able object, bytes, or an iterable of bytes (sent chunked)."""

    def __init__(self, status: int = 200, body: Any = None, headers: Optional[Dict[str, str]] = None,
                 content_type: Optional[str] = None, hang_up: bool = False, drop: bool = False):
        self.status = status
        self.body = body
        self.headers = dict(headers or {})
        self.content_type = content_type
        self.hang_up = hang_up  # close the connection after the response without saying so (no Connection: close)
        self.drop = drop  # close the connection without any response (a connection cut after the request)


def sandbox_json(id: str = "sbx_1", status: str = "running", **kw: Any) -> Dict[str, Any]:
    d = {
        "id": id, "status": status, "ip": "10.213.0.5", "hostname": "sbx-1", "vcpu": 1,
        "mem_mib": 1024, "max_procs": 512, "shape": "1vcpu-1024mib", "timeout_s": 0,
        "on_timeout": "destroy", "expires_at": None, "cwd": "/root", "metadata": {},
        "created_at": "2026-11-22T22:30:00.123Z", "family_id": "fam_1", "parent_id": None,
        "forked_from": None, "error": "",
    }
    d.update(kw)
    return d


Handler = Callable[[Req], Reply]


class Stub:
    def __init__(self, port: int = 0, check_auth: bool = True):
        self.routes: List[Tuple[str, re.Pattern, Handler]] = []
        self.requests: List[Req] = []
        self.lock = threading.Lock()
        self.check_auth = check_auth
        stub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def _read_body(self) -> Tuple[bytes, bool]:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size_line = self.rfile.readline()
                        size = int(size_line.split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out), True
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return (self.rfile.read(n) if n else b""), False

            def _handle(self) -> None:
                u = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(u.query, keep_blank_values=True)
                body, chunked = self._read_body()
                req = Req(self.command, u.path, query, self.headers, body, chunked, None)
                req.conn = self.client_address
                with stub.lock:
                    stub.requests.append(req)
                reply = stub.dispatch(req)
                if reply.drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self._send(reply)
                if reply.hang_up:
                    self.close_connection = True

            def _send(self, reply: Reply) -> None:
                body = reply.body
                ct = reply.content_type
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                if reply.status == 204:
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if isinstance(body, list) and body and all(isinstance(x, (bytes, bytearray)) for x in body):
                    data: Optional[bytes] = None  # list of byte chunks: sent chunked
                elif body is None:
                    data = b""
                elif isinstance(body, (bytes, bytearray)):
                    data = bytes(body)
                    ct = ct or "application/octet-stream"
                elif isinstance(body, (dict, list, str, int, float, bool)):
                    data = json.dumps(body).encode()
                    ct = ct or "application/json"
                else:
                    data = None  # iterable: chunked
                if ct:
                    self.send_header("Content-Type", ct)
                if data is not None:
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                for chunk in body:
                    if not chunk:
                        continue
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                import sys
                if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
                    return  # clients closing streams early: expected
                super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", port), H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def start(self) -> "Stub":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def on(self, method: str, path_regex: str, handler: Any) -> None:
        """Register a route; handler is a Reply, a callable(req) -> Reply, or a list of Replies
        (returned in sequence, the last one repeated)."""
        if isinstance(handler, Reply):
            reply = handler
            handler = lambda req: reply  # noqa: E731
        elif isinstance(handler, list):
            seq = list(handler)
            lock = threading.Lock()

            def handler(req: Req, seq: List[Reply] = seq) -> Reply:
                with lock:
                    return seq.pop(0) if len(seq) > 1 else seq[0]

        self.routes.insert(0, (method, re.compile("^" + path_regex + "$"), handler))

    def dispatch(self, req: Req) -> Reply:
        if req.path.startswith("/v1") and self.check_auth:
            if req.headers.get("Authorization") != f"Bearer {API_KEY}":
                return Reply(401, {"error": "invalid api key"})
        for method, rx, handler in self.routes:
            m = rx.match(req.path)
            if method == req.method and m:
                req.match = m
                try:
                    return handler(req)
                except Exception as e:  # make stub bugs visible
                    return Reply(599, {"error": f"stub handler crashed: {e!r}"})
        return Reply(500, {"error": f"stub: no route for {req.method} {req.path}"})

    def reqs(self, method: Optional[str] = None, path: Optional[str] = None) -> List[Req]:
        with self.lock:
            return [r for r in self.requests
                    if (method is None or r.method == method) and (path is None or r.path == path)]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ndjson(*events: Dict[str, Any]) -> Iterable[bytes]:
    for ev in events:
        yield (json.dumps(ev) + "\n").encode()
