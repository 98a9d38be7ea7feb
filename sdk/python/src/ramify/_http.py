"""Minimal HTTP layer over :mod:`http.client` (standard library only).

One connection per request: the client is safe to share between threads (fork children use it
concurrently) and needs no pool bookkeeping.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import ssl
import time
import urllib.parse
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

# Retry policy for idempotent calls (GET / DELETE / HEAD) on connection errors that happen before a
# response arrives. Module-level so tests (or users) can tune them.
MAX_TRIES = 4
RETRY_BASE_DELAY = 0.2  # seconds; delays are 0.2, 0.4, 0.8 (+ up to 10% jitter)

_IDEMPOTENT = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
_UNSET: Any = object()

Query = Union[Mapping[str, Any], Sequence[Tuple[str, Any]], None]


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

    def __init__(self, status: int, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection):
        self.status = status
        self.headers = resp.headers
        self.raw = resp
        self._conn = conn

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

    def close(self) -> None:
        try:
            self.raw.close()
        finally:
            self._conn.close()

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

        ``retry`` defaults to True for idempotent methods (GET/HEAD/DELETE) and False otherwise.
        """
        method = method.upper()
        hdrs = self._headers(headers)
        if json_body is not _UNSET:
            body = json.dumps(json_body).encode("utf-8")
            hdrs["Content-Type"] = "application/json"
        if timeout is _UNSET:
            timeout = self.request_timeout
        if retry is None:
            retry = method in _IDEMPOTENT
        if retry and body is not None and not isinstance(body, (bytes, bytearray, memoryview)):
            retry = False  # a streamed body cannot be replayed
        tries = MAX_TRIES if retry else 1
        url = self.url_for(path, query)

        last_exc: Optional[BaseException] = None
        for attempt in range(tries):
            if attempt:
                delay = RETRY_BASE_DELAY * (2 ** (attempt - 1))
                time.sleep(delay + random.uniform(0, delay / 10))
            conn = self._new_conn(timeout)
            try:
                conn.request(method, url, body=body, headers=hdrs)
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
                finally:
                    conn.close()
                msg, parsed = self._error_message(data, status, resp.reason)
                raise error_for_status(status, msg, parsed, file_route=file_route)
            if stream:
                return StreamResponse(status, resp, conn)
            try:
                data = resp.read()
            except (TimeoutError, socket.timeout) as e:
                raise Timeout(f"{method} {path}: timed out reading the response ({e})") from e
            except (http.client.HTTPException, OSError) as e:
                raise ServerUnreachable(f"{method} {path}: connection lost mid-response: {e!r}") from e
            finally:
                conn.close()
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
