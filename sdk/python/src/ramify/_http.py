"""Minimal HTTP layer over :mod:`http.client` (standard library only).

Connections are kept alive and reused: after a response has been read to its end its connection goes
back to a pool shared by every client of the same server in the process (a fork's children called from
as many threads each take one), so a call does not pay a TCP connect, or a TLS handshake, each time.
The pool is safe to share between threads; a process forked from this one (``os.fork``,
``multiprocessing``) starts with an empty one.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import random
import select
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._version import __version__
from .exceptions import (
    RamifyError,
    ServerUnreachable,
    Timeout,
    error_for_status,
)

DEFAULT_API_URL = "http://127.0.0.1:7070"
DEFAULT_REQUEST_TIMEOUT = 60.0

# Retry policy for idempotent calls (GET / DELETE / HEAD, and POSTs, which carry an Idempotency-Key) on
# connection errors that happen before a response arrives. Module-level so tests (or users) can tune them.
MAX_TRIES = 4
RETRY_BASE_DELAY = 0.2  # seconds; delays are 0.2, 0.4, 0.8 (+ up to 10% jitter)

# Idle connections kept per server, and for how long: enough for a fork's 32 children called at once; the
# server closes a connection idle for 2 minutes, so the pool lets go of it well before that.
POOL_SIZE = 32
POOL_IDLE_S = 60.0

_IDEMPOTENT = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
_UNSET: Any = object()

Query = Union[Mapping[str, Any], Sequence[Tuple[str, Any]], None]


class _Pool:
    """Idle keep-alive connections per (scheme, host, port), newest first; shared by the process's clients."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: Dict[Tuple[str, str, Optional[int]], List[Tuple[http.client.HTTPConnection, float]]] = {}

    def take(self, key: Tuple[str, str, Optional[int]]) -> Optional[http.client.HTTPConnection]:
        """An idle connection to key that the server has not closed, or None."""
        now = time.monotonic()
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                conn, since = idle.pop()
            if now - since < POOL_IDLE_S and not _closed_by_peer(conn):
                return conn
            conn.close()

    def put(self, key: Tuple[str, str, Optional[int]], conn: http.client.HTTPConnection) -> None:
        now = time.monotonic()
        with self._lock:
            idle = self._idle.setdefault(key, [])
            # The oldest ones, at the bottom, are let go once they have waited too long (the server will have
            # closed them), so that they do not linger unused behind the ones kept busy.
            stale = 0
            while stale < len(idle) and now - idle[stale][1] >= POOL_IDLE_S:
                stale += 1
            old, idle[:stale] = idle[:stale], []
            if len(idle) < POOL_SIZE:
                idle.append((conn, now))
                conn = None
        for c, _ in old:
            c.close()
        if conn is not None:
            conn.close()

    def close_all(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn, _ in conns:
                conn.close()

    def after_fork(self) -> None:
        """In a forked child: a new lock, and the parent's connections closed here (their descriptors only:
        no shutdown reaches the server, the parent goes on using them)."""
        self._lock = threading.Lock()
        self.close_all()


def _closed_by_peer(conn: http.client.HTTPConnection) -> bool:
    """True when an idle connection can no longer carry a request: its socket is gone, or readable, which on
    an idle HTTP connection means the server closed it (or sent something no request asked for)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):
            p = select.poll()
            p.register(sock, select.POLLIN)
            return bool(p.poll(0))
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


_pool = _Pool()
atexit.register(_pool.close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool.after_fork)


class BodyError(Exception):
    """Raised by a request-body generator when the data source itself failed (not the network)."""

    def __init__(self, original: BaseException):
        super().__init__(str(original))
        self.original = original


class Response:
    """A fully read (non-streamed) response."""

    def __init__(self, status: int, headers: http.client.HTTPMessage, data: bytes):
        self.status = status
        self.headers = headers
        self.data = data

    def json(self) -> Any:
        if not self.data:
            return None
        try:
            return json.loads(self.data)
        except ValueError as e:
            raise RamifyError(f"invalid JSON from server: {e}: {self.data[:200]!r}", self.status) from e


class StreamResponse:
    """A streamed response; the caller must :meth:`close` it (or use it as a context manager)."""

    def __init__(self, status: int, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection,
                 release: Any = None):
        self.status = status
        self.headers = resp.headers
        self.raw = resp
        self._conn = conn
        self._release = release  # called with the connection once the response was read to its end

    @property
    def content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()

    def read(self, n: int = -1) -> bytes:
        try:
            if n is None or n < 0:
                return self.raw.read()
            return self.raw.read(n)
        except (TimeoutError, socket.timeout) as e:
            raise Timeout(f"timed out reading the response: {e}") from e
        except http.client.IncompleteRead as e:
            raise ServerUnreachable(f"connection closed mid-response: {e!r}") from e
        except OSError as e:
            raise ServerUnreachable(f"connection lost mid-response: {e}") from e

    def readline(self) -> bytes:
        try:
            return self.raw.readline()
        except (TimeoutError, socket.timeout) as e:
            raise Timeout(f"timed out reading the response: {e}") from e
        except http.client.IncompleteRead as e:
            raise ServerUnreachable(f"connection closed mid-response: {e!r}") from e
        except OSError as e:
            raise ServerUnreachable(f"connection lost mid-response: {e}") from e

    def iter_lines(self) -> Iterable[bytes]:
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def finish(self, limit: int = 1 << 16) -> None:
        """The caller saw the stream's last event: read what is left of it (the server ends the stream right
        after), so that its connection can carry the next request; :meth:`close` then keeps it."""
        if self._conn is None or self.raw.isclosed():
            return
        try:
            if self._conn.sock is not None:
                self._conn.sock.settimeout(1.0)
            self.raw.read(limit)
        except Exception:
            pass  # close() drops the connection: the response did not end

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        # Read to its end, the connection can carry the next request; closed early, it holds the rest.
        done = self.raw.isclosed()
        try:
            self.raw.close()
        finally:
            if done and self._release is not None:
                self._release(conn)
            else:
                conn.close()

    def __enter__(self) -> "StreamResponse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class HTTPClient:
    """Holds the base URL, API key and default timeout; thread-safe."""

    def __init__(
        self,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ):
        api_url = api_url or os.environ.get("RAMIFY_API_URL") or DEFAULT_API_URL
        if api_key is None:
            api_key = os.environ.get("RAMIFY_API_KEY")
        if "://" not in api_url:
            api_url = "http://" + api_url
        u = urllib.parse.urlsplit(api_url)
        if u.scheme not in ("http", "https"):
            raise ValueError(f"unsupported api_url scheme {u.scheme!r} (want http or https)")
        if not u.hostname:
            raise ValueError(f"api_url has no host: {api_url!r}")
        self.api_url = api_url.rstrip("/")
        self.api_key = api_key
        self.request_timeout = request_timeout
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port
        self._base_path = u.path.rstrip("/")
        self._pool_key = (self._scheme, self._host, self._port)

    # -- helpers -------------------------------------------------------------------------------
    def _new_conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        conn.blocksize = 1 << 20
        return conn

    def _conn(self, timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, bool]:
        """A connection for one request, and whether it was kept from an earlier one."""
        conn = _pool.take(self._pool_key)
        if conn is None:
            return self._new_conn(timeout), False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def _release(self, conn: http.client.HTTPConnection) -> None:
        """Keep conn for the next request if the server left it open."""
        if conn.sock is None:  # the response said Connection: close
            conn.close()
            return
        _pool.put(self._pool_key, conn)

    def url_for(self, path: str, query: Query = None) -> str:
        url = self._base_path + path
        if query:
            items = list(query.items()) if isinstance(query, Mapping) else list(query)
            items = [(k, v) for k, v in items if v is not None]
            if items:
                url += "?" + urllib.parse.urlencode(items, doseq=True)
        return url

    def _headers(self, extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
        h = {"User-Agent": f"ramify-python/{__version__}", "Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            h.update(extra)
        return h

    @staticmethod
    def _error_message(data: bytes, status: int, reason: str) -> Tuple[str, Any]:
        body: Any = None
        msg = ""
        if data:
            try:
                body = json.loads(data)
            except ValueError:
                body = data.decode("utf-8", "replace")
            if isinstance(body, dict) and isinstance(body.get("error"), str):
                msg = body["error"]
            elif isinstance(body, str):
                msg = body.strip()[:500]
        if not msg:
            msg = reason or f"HTTP {status}"
        return msg, body

    # -- main entry point ----------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        json_body: Any = _UNSET,
        body: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Any = _UNSET,
        stream: bool = False,
        file_route: bool = False,
        retry: Optional[bool] = None,
    ) -> Union[Response, StreamResponse]:
        """Send a request; raise a :class:`RamifyError` subclass on error statuses.

        ``retry`` defaults to True for idempotent methods (GET/HEAD/DELETE) and for POSTs, which get an
        ``Idempotency-Key`` header (unless ``headers`` has one, or the body is a stream), and False otherwise.
        """
        method = method.upper()
        hdrs = self._headers(headers)
        if json_body is not _UNSET:
            body = json.dumps(json_body).encode("utf-8")
            hdrs["Content-Type"] = "application/json"
        if timeout is _UNSET:
            timeout = self.request_timeout
        replayable = body is None or isinstance(body, (bytes, bytearray, memoryview))
        if method == "POST" and replayable and not any(k.lower() == "idempotency-key" for k in hdrs):
            # The server does a POST with a key at most once and answers a repeat with the first call's answer:
            # a call whose connection broke is retried without forking (creating, merging...) twice.
            hdrs["Idempotency-Key"] = uuid.uuid4().hex
        if retry is None:
            retry = method in _IDEMPOTENT or any(k.lower() == "idempotency-key" for k in hdrs)
        if retry and body is not None and not isinstance(body, (bytes, bytearray, memoryview)):
            retry = False  # a streamed body cannot be replayed
        tries = MAX_TRIES if retry else 1
        url = self.url_for(path, query)

        last_exc: Optional[BaseException] = None
        attempt, fresh = 0, False
        while attempt < tries:
            if attempt and not fresh:
                delay = RETRY_BASE_DELAY * (2 ** (attempt - 1))
                time.sleep(delay + random.uniform(0, delay / 10))
            if fresh:
                conn, kept = self._new_conn(timeout), False
            else:
                conn, kept = self._conn(timeout)
            fresh, sent = False, False
            try:
                conn.request(method, url, body=body, headers=hdrs)
                sent = True
                resp = conn.getresponse()
            except BodyError:
                conn.close()
                raise
            except (TimeoutError, socket.timeout) as e:
                conn.close()
                raise Timeout(f"{method} {path}: timed out after {timeout}s ({e})") from e
            except (ConnectionError, OSError) as e:
                # Connection refused / reset / broken pipe before any response.
                resp = None
                if body is not None and isinstance(e, (BrokenPipeError, ConnectionResetError)):
                    # The server may have answered early (e.g. 404) and closed while we were still
                    # sending a large body: try to read that answer.
                    try:
                        resp = conn.getresponse()
                    except Exception:
                        resp = None
                if resp is None:
                    conn.close()
                    last_exc = e
                    if kept and replayable and (not sent or retry):
                        # A kept connection the server had closed (idle, or restarting): it did not take
                        # the request, which goes again at once on a new connection. A request that was
                        # sent whole may have been taken: only one safe to repeat (GET, DELETE...) goes again.
                        fresh = True
                        continue
                    attempt += 1
                    continue
            except http.client.HTTPException as e:
                conn.close()
                raise RamifyError(f"{method} {path}: invalid HTTP response: {e!r}") from e

            status = resp.status
            if status >= 400:
                try:
                    data = resp.read()
                except Exception:
                    data = b""
                    conn.close()
                else:
                    self._release(conn)
                msg, parsed = self._error_message(data, status, resp.reason)
                raise error_for_status(status, msg, parsed, file_route=file_route)
            if stream:
                return StreamResponse(status, resp, conn, self._release)
            try:
                data = resp.read()
            except (TimeoutError, socket.timeout) as e:
                conn.close()
                raise Timeout(f"{method} {path}: timed out reading the response ({e})") from e
            except (http.client.HTTPException, OSError) as e:
                conn.close()
                raise ServerUnreachable(f"{method} {path}: connection lost mid-response: {e!r}") from e
            self._release(conn)
            return Response(status, resp.headers, data)

        where = f"{self._scheme}://{self._host}" + (f":{self._port}" if self._port else "")
        raise ServerUnreachable(
            f"{method} {path}: cannot reach ramify server at {where} "
            f"after {tries} tr{'y' if tries == 1 else 'ies'}: {last_exc}"
        ) from last_exc

    def json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.request(method, path, **kw)
        assert isinstance(resp, Response)
        return resp.json()


def iter_ndjson(resp: StreamResponse) -> Iterable[Dict[str, Any]]:
    """Yield one decoded JSON object per non-empty NDJSON line."""
    for line in resp.iter_lines():
        line = line.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise RamifyError(f"invalid NDJSON line from server: {line[:200]!r}") from e
        if isinstance(ev, dict):
            yield ev


def chunked_file_reader(f: Any, chunk_size: int = 1 << 20) -> Iterable[bytes]:
    """Yield bytes chunks from a binary or text file-like object (text is UTF-8 encoded)."""
    while True:
        try:
            chunk = f.read(chunk_size)
        except Exception as e:  # the source failed, not the network
            raise BodyError(e) from e
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8")
        yield bytes(chunk)


__all__ = ["HTTPClient", "Response", "StreamResponse", "BodyError", "iter_ndjson", "chunked_file_reader"]
