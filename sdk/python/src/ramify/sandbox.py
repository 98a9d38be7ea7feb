"""The synchronous :class:`Sandbox` client."""

from __future__ import annotations

import base64
import os
import time
import urllib.parse
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from ._http import DEFAULT_REQUEST_TIMEOUT, HTTPClient, Response, StreamResponse, iter_ndjson
from .exceptions import (
    PauseFailed,
    ResumeFailed,
    RamifyError,
    SandboxDefunct,
    SandboxErrorState,
    SandboxNotFound,
    ServerError,
    Timeout,
)
from .files import Files
from .models import CommandResult, Execution, PathArg, Result, path_fields, raw_path_list

__all__ = ["Sandbox"]

OutputCallback = Callable[[str], Any]
ResultCallback = Callable[[Result], Any]

# Server-side default for run_code / exec timeout_s (docs/api.md); the socket timeout is this plus
# a margin so the server's own timeout fires first.
_SERVER_DEFAULT_RUN_TIMEOUT = 300.0
_RUN_TIMEOUT_MARGIN = 30.0
DEFAULT_POLL_TIMEOUT = 300.0
_WAIT_CHUNK = 20.0  # seconds one wait request may take (the server allows 60)


def _q(s: str) -> str:
    return urllib.parse.quote(str(s), safe="")


def _sandbox_id(x: Any) -> str:
    if isinstance(x, str):
        return x
    sid = getattr(x, "id", None)
    if not isinstance(sid, str):
        raise TypeError(f"expected a Sandbox or a sandbox id, got {type(x).__name__}")
    return sid


def _is_ndjson(resp: StreamResponse) -> bool:
    # Anything but plain JSON is read as NDJSON (a server that does not set
    # application/x-ndjson still streams one event per line).
    return resp.content_type != "application/json"


class Sandbox:
    """A ramify sandbox.

    ``Sandbox(...)`` creates a new sandbox on the server (``POST /v1/sandboxes``); use it as a
    context manager to close it on exit::

        with Sandbox() as sb:
            print(sb.run_code("1 + 1").value)

    Use :meth:`connect` to attach to an existing sandbox and :meth:`list` to enumerate them.
    ``api_url`` / ``api_key`` default to the ``RAMIFY_API_URL`` / ``RAMIFY_API_KEY`` environment
    variables (URL default ``http://127.0.0.1:7070``).
    """

    id: str
    info: Dict[str, Any]
    files: Files

    def __init__(
        self,
        vcpu: Optional[float] = None,
        mem_mib: Optional[int] = None,
        max_procs: Optional[int] = None,
        timeout_s: Optional[int] = None,
        on_timeout: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
        disk_mib: Optional[int] = None,
        egress: Optional[Sequence[str]] = None,
        ingress_enabled: bool = False,
        template: Optional[str] = None,
        image: Optional[str] = None,
        ssh_pubkeys: Optional[Sequence[str]] = None,
    ):
        client = HTTPClient(api_url, api_key, request_timeout)
        body: Dict[str, Any] = {}
        for k, v in (
            ("template", template),
            ("image", image),
            ("vcpu", vcpu),
            ("mem_mib", mem_mib),
            ("max_procs", max_procs),
            ("timeout_s", timeout_s),
            ("on_timeout", on_timeout),
            ("cwd", cwd),
            ("disk_mib", disk_mib),
        ):
            if v is not None:
                body[k] = v
        if egress is not None:  # [] means no outbound traffic at all; None means the server's default policy
            body["egress"] = [str(e) for e in egress]
        if ingress_enabled:  # the sandbox's ports reachable over HTTP: see url() and api_url()
            body["ingress_enabled"] = True
        if ssh_pubkeys is not None:  # authorized_keys lines: ssh into the sandbox (server with --ssh-listen)
            body["ssh_pubkeys"] = _key_lines(ssh_pubkeys)
        if env is not None:
            body["env"] = {str(k): str(v) for k, v in env.items()}
        if metadata is not None:
            body["metadata"] = {str(k): str(v) for k, v in metadata.items()}
        resp = client.request("POST", "/v1/sandboxes", json_body=body,
                              timeout=_longer(request_timeout, 120.0))
        assert isinstance(resp, Response)
        info = resp.json()
        if not isinstance(info, dict) or "id" not in info:
            raise RamifyError(f"unexpected create response: {info!r}", resp.status, info)
        self._setup(client, info)
        if self.info.get("status") in ("creating", "resuming"):
            try:
                self._wait_for("running", DEFAULT_POLL_TIMEOUT)
            except BaseException:
                try:
                    self.close()
                except Exception:
                    pass
                raise

    # -- construction helpers --------------------------------------------------------------------
    def _setup(self, client: HTTPClient, info: Dict[str, Any]) -> None:
        self._client = client
        self.info = dict(info)
        self.id = str(info["id"])
        self._closed = False
        self._merged_into: Optional[str] = None
        self.files = Files(self)

    @classmethod
    def _from_info(cls, client: HTTPClient, info: Dict[str, Any]) -> "Sandbox":
        sb = cls.__new__(cls)
        sb._setup(client, info)
        return sb

    @classmethod
    def connect(
        cls,
        id: str,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> "Sandbox":
        """Attach to an existing sandbox (``GET /v1/sandboxes/{id}``); raises :class:`SandboxNotFound`."""
        client = HTTPClient(api_url, api_key, request_timeout)
        info = client.json("GET", f"/v1/sandboxes/{_q(id)}")
        return cls._from_info(client, info)

    @classmethod
    def list(
        cls,
        metadata: Optional[Mapping[str, str]] = None,
        status: Optional[str] = None,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
    ) -> "List[Sandbox]":
        """List sandboxes, optionally filtered by metadata labels (all must match) and status."""
        client = HTTPClient(api_url, api_key, request_timeout)
        query: List[Any] = [(f"metadata.{k}", str(v)) for k, v in (metadata or {}).items()]
        if status is not None:
            query.append(("status", status))
        data = client.json("GET", "/v1/sandboxes", query=query)
        items = (data or {}).get("sandboxes") or []
        return [cls._from_info(client, it) for it in items]

    # -- state -------------------------------------------------------------------------------------
    def _path(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{_q(self.id)}{suffix}"

    def _check(self) -> None:
        if self._merged_into is not None:
            raise SandboxDefunct(
                f"sandbox {self.id} was merged into {self._merged_into} and is defunct; "
                f"use the parent sandbox ({self._merged_into}) instead"
            )
        if self._closed:
            raise SandboxNotFound(f"sandbox {self.id} is closed")

    @property
    def defunct(self) -> bool:
        """True once this sandbox was the winner of a ``merge_into`` (its id is retired)."""
        return self._merged_into is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def refresh(self) -> Dict[str, Any]:
        """Re-read the sandbox (``GET``), update :attr:`info` and return it."""
        self._check()
        info = self._client.json("GET", self._path())
        if isinstance(info, dict):
            self.info = info
        return self.info

    def get_status(self) -> str:
        return str(self.refresh().get("status", ""))

    @property
    def status(self) -> str:
        """Current status, fetched from the server (``creating``, ``running``, ``paused``, ...)."""
        return self.get_status()

    @property
    def ip(self) -> Optional[str]:
        if not self.info.get("ip") and not self._closed and self._merged_into is None:
            self.refresh()
        return self.info.get("ip")

    @property
    def metadata(self) -> Dict[str, str]:
        return dict(self.info.get("metadata") or {})

    def _ingress(self) -> Dict[str, Any]:
        ing = self.info.get("ingress")
        if not isinstance(ing, dict):
            ing = self.refresh().get("ingress") or {}
        if not ing.get("enabled"):
            raise RamifyError(f"sandbox {self.id} was created without ingress_enabled: its ports are not reachable",
                              None, ing)
        return ing

    def url(self, port: int) -> str:
        """The URL of ``port`` inside the sandbox through the server's ingress listener (no API key needed), e.g.
        ``http://8000-<id without sbx_>.localhost:7080/``. The sandbox must have been created with
        ``ingress_enabled=True``; a server without ``--ingress-listen`` has no such URL (see :meth:`api_url`)."""
        tmpl = self._ingress().get("url_template")
        if not tmpl:
            raise RamifyError("the server has no ingress listener (ramify serve --ingress-listen): "
                              "use api_url(port) with the API key", None, None)
        return str(tmpl).replace("{port}", str(int(port)), 1)

    def api_url(self, port: int) -> str:
        """The API's URL of ``port`` inside the sandbox: requests to it and below it go to the port, with the
        API key in ``Authorization: Bearer`` (not forwarded to the sandbox)."""
        path = str(self._ingress().get("path_template") or self._path("/ports/{port}/"))
        return self._client.api_url + path.replace("{port}", str(int(port)), 1)

    def set_timeout(self, timeout_s: int) -> Dict[str, Any]:
        """Keep the sandbox alive: it now times out ``timeout_s`` seconds from now (0: never), with
        its ``on_timeout`` action (``POST /v1/sandboxes/{id}/timeout``). Running or paused sandboxes
        only. Updates :attr:`info` (``expires_at`` is the new deadline) and returns it."""
        self._check()
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int):
            raise TypeError("timeout_s must be an int (seconds)")
        info = self._client.json("POST", self._path("/timeout"), json_body={"timeout_s": timeout_s})
        if isinstance(info, dict):
            self.info = info
        return self.info

    def add_ssh_keys(self, keys: Sequence[str]) -> Dict[str, Any]:
        """Authorize more SSH keys (authorized_keys lines, e.g. the contents of ``~/.ssh/id_ed25519.pub``) on this
        running or paused sandbox (``POST /v1/sandboxes/{id}/ssh_keys``); keys it already has are skipped. Updates
        :attr:`info`, whose ``ssh`` lists the keys and, when the server runs ``--ssh-listen``, the ``command``
        that connects, and returns it. A line that is not a public key raises :class:`InvalidRequest`."""
        self._check()
        info = self._client.json("POST", self._path("/ssh_keys"), json_body={"keys": _key_lines(keys)})
        if isinstance(info, dict):
            self.info = info
        return self.info

    def interrupt(self, what: Optional[str] = None) -> Dict[str, int]:
        """Stop the ``run_code`` and ``exec`` calls in flight in this sandbox (``POST .../interrupt``), from
        any thread or process: a running cell gets a ``KeyboardInterrupt`` (its variables survive), cells queued
        behind it end without running, and every ``exec``'s command is killed with what it started. Each
        stopped call returns with ``interrupted`` set. ``what`` is ``"run_code"`` or ``"exec"`` to stop only
        those. Returns how many calls were stopped: ``{"run_code": n, "exec": m}``."""
        self._check()
        if what not in (None, "run_code", "exec"):
            raise ValueError('what must be None, "run_code" or "exec"')
        body = {} if what is None else {"what": what}
        out = self._client.json("POST", self._path("/interrupt"), json_body=body)
        counts = (out or {}).get("interrupted") or {}
        return {"run_code": int(counts.get("run_code", 0)), "exec": int(counts.get("exec", 0))}

    def _run_timeout(self, timeout_s: Optional[float]) -> Optional[float]:
        rt = self._client.request_timeout
        if timeout_s == 0 or rt is None:
            return None
        server = _SERVER_DEFAULT_RUN_TIMEOUT if timeout_s is None else float(timeout_s)
        return max(rt, server + _RUN_TIMEOUT_MARGIN)

    # -- code ------------------------------------------------------------------------------------
    def run_code(
        self,
        code: str,
        timeout_s: Optional[float] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        env: Optional[Mapping[str, str]] = None,
        on_result: Optional[ResultCallback] = None,
    ) -> Execution:
        """Run Python code in the sandbox's persistent interpreter.

        With ``on_stdout`` / ``on_stderr`` / ``on_result`` the output is streamed (NDJSON) and the
        callbacks are called with each chunk (each ``display_data`` :class:`Result`) as it arrives,
        before this method returns. ``env`` is set in the interpreter's ``os.environ`` for this call
        only; what it replaced is restored after it. The cell's rich results (figures, DataFrames,
        ``display()``) are in the returned ``Execution.results``.
        """
        self._check()
        body: Dict[str, Any] = {"code": code}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if env is not None:
            body["env"] = {str(k): str(v) for k, v in env.items()}
        timeout = self._run_timeout(timeout_s)
        if on_stdout is None and on_stderr is None and on_result is None:
            data = self._client.json("POST", self._path("/run_code"), json_body=body, timeout=timeout)
            return Execution.from_dict(data or {})
        body["stream"] = True
        resp = self._client.request(
            "POST", self._path("/run_code"), json_body=body, timeout=timeout, stream=True,
            headers={"Accept": "application/x-ndjson"},
        )
        assert isinstance(resp, StreamResponse)
        with resp:
            if not _is_ndjson(resp):
                # The server ignored "stream": deliver the output in one go.
                result = Execution.from_dict(_json_or_error(resp.read()))
                if result.stdout and on_stdout:
                    on_stdout(result.stdout)
                if result.stderr and on_stderr:
                    on_stderr(result.stderr)
                for r in result.results:
                    if on_result and r.type == "display_data":
                        on_result(r)
                return result
            out: List[str] = []
            err: List[str] = []
            for ev in iter_ndjson(resp):
                typ = ev.get("type")
                if typ == "stdout":
                    data = str(ev.get("data") or "")
                    out.append(data)
                    if on_stdout:
                        on_stdout(data)
                elif typ == "stderr":
                    data = str(ev.get("data") or "")
                    err.append(data)
                    if on_stderr:
                        on_stderr(data)
                elif typ == "display_data":
                    if on_result:
                        on_result(Result.from_dict(ev))
                elif typ == "result":
                    ev = dict(ev)
                    ev.setdefault("stdout", "".join(out))
                    ev.setdefault("stderr", "".join(err))
                    resp.finish()
                    return Execution.from_dict(ev)
                elif typ == "error":
                    raise ServerError(str(ev.get("error") or ev.get("data") or "stream error"), resp.status, ev)
        raise RamifyError("run_code stream ended without a result event", resp.status)

    def exec(
        self,
        cmd: Union[str, Sequence[str]],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout_s: Optional[float] = None,
        stdin: Union[str, bytes, None] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> CommandResult:
        """Run a command: a string goes through ``/bin/sh -c``, a list is an argv (no shell)."""
        self._check()
        body: Dict[str, Any] = {}
        if isinstance(cmd, str):
            body["cmd"] = cmd
        elif isinstance(cmd, (bytes, bytearray)):
            body["cmd"] = bytes(cmd).decode("utf-8")
        else:
            argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in cmd]
            if not argv:
                raise ValueError("argv must not be empty")
            body["argv"] = argv
        if env is not None:
            body["env"] = {str(k): str(v) for k, v in env.items()}
        if cwd is not None:
            body["cwd"] = os.fspath(cwd)
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if stdin is not None:
            body["stdin"] = stdin.decode("utf-8") if isinstance(stdin, (bytes, bytearray)) else str(stdin)
        timeout = self._run_timeout(timeout_s)
        if on_stdout is None and on_stderr is None:
            data = self._client.json("POST", self._path("/exec"), json_body=body, timeout=timeout) or {}
            return _command_result(data)
        body["stream"] = True
        resp = self._client.request(
            "POST", self._path("/exec"), json_body=body, timeout=timeout, stream=True,
            headers={"Accept": "application/x-ndjson"},
        )
        assert isinstance(resp, StreamResponse)
        with resp:
            if not _is_ndjson(resp):
                result = _command_result(_json_or_error(resp.read()))
                if result.stdout and on_stdout:
                    on_stdout(result.stdout)
                if result.stderr and on_stderr:
                    on_stderr(result.stderr)
                for r in result.results:
                    if on_result and r.type == "display_data":
                        on_result(r)
                return result
            out: List[str] = []
            err: List[str] = []
            for ev in iter_ndjson(resp):
                typ = ev.get("type")
                if typ == "stdout":
                    data = str(ev.get("data") or "")
                    out.append(data)
                    if on_stdout:
                        on_stdout(data)
                elif typ == "stderr":
                    data = str(ev.get("data") or "")
                    err.append(data)
                    if on_stderr:
                        on_stderr(data)
                elif typ in ("exit", "result"):
                    ev = dict(ev)
                    ev.setdefault("stdout", "".join(out))
                    ev.setdefault("stderr", "".join(err))
                    resp.finish()
                    return _command_result(ev)
                elif typ == "error":
                    raise ServerError(str(ev.get("error") or ev.get("data") or "stream error"), resp.status, ev)
        raise RamifyError("exec stream ended without an exit event", resp.status)

    # -- fork / merge / diff ----------------------------------------------------------------------
    def fork(self, n: int = 1, ingress_enabled: Optional[bool] = None,
             ssh_pubkeys: Optional[Sequence[str]] = None) -> "List[Sandbox]":
        """Fork this sandbox into ``n`` children (1..32) that inherit its memory and files (and its
        ``ingress_enabled``, unless given, and its SSH keys, plus ``ssh_pubkeys`` if given)."""
        self._check()
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError("n must be an int")
        body: Dict[str, Any] = {"n": n}
        if ingress_enabled is not None:
            body["ingress_enabled"] = bool(ingress_enabled)
        if ssh_pubkeys is not None:
            body["ssh_pubkeys"] = _key_lines(ssh_pubkeys)
        data = self._client.json(
            "POST", self._path("/fork"), json_body=body,
            timeout=_longer(self._client.request_timeout, 300.0),
        ) or {}
        children = data.get("children")
        if not isinstance(children, list):
            raise RamifyError(f"unexpected fork response: {data!r}", None, data)
        out = []
        for c in children:
            info = {"id": c} if isinstance(c, str) else dict(c)
            out.append(type(self)._from_info(self._client, info))
        return out

    def merge_into(self, winner: Union["Sandbox", str]) -> None:
        """Replace this sandbox's state with ``winner``'s (a fork child).

        This sandbox keeps its id and now drives the winner's VM; the winner's id is retired and the
        winner object becomes defunct (``close()`` is a no-op, other calls raise
        :class:`SandboxDefunct`). Other children are untouched: close them yourself.
        """
        self._check()
        wid = _sandbox_id(winner)
        if isinstance(winner, Sandbox):
            winner._check()
        self._client.request("POST", self._path(f"/merge_into/{_q(wid)}"),
                             timeout=_longer(self._client.request_timeout, 300.0))
        if isinstance(winner, Sandbox):
            winner._merged_into = self.id
        try:
            self.refresh()
        except RamifyError:
            pass

    def diff(self, other: Union["Sandbox", str], paths: Optional[Iterable[PathArg]] = None) -> Dict[str, Any]:
        """Compare file-system state with another sandbox.

        Returns the server's JSON, e.g. ``{"added": [...], "removed": [...], "modified": [...]}``
        (``added`` = only in ``other``, ``removed`` = only in ``self``). A path that is not UTF-8 is
        listed as its raw ``bytes`` (the server's ``added_b64``, ... are folded in); ``paths`` may be
        str or bytes.
        """
        self._check()
        oid = _sandbox_id(other)
        if isinstance(paths, (str, bytes)):
            paths = [paths]
        fields = [path_fields(p, "paths") for p in (paths or [])]
        if any("paths_b64" in f for f in fields):  # one form for all: the server takes paths or paths_b64
            fields = [f if "paths_b64" in f else {"paths_b64": base64.b64encode(f["paths"].encode("utf-8")).decode("ascii")}
                      for f in fields]
        query = [kv for f in fields for kv in f.items()]
        d = self._client.json(
            "GET", self._path(f"/diff/{_q(oid)}"), query=query,
            timeout=_longer(self._client.request_timeout, 300.0),
        ) or {}
        for key in ("added", "removed", "modified"):
            if key + "_b64" in d:
                d[key] = raw_path_list(d, key)
                del d[key + "_b64"]
        return d

    # -- templates ---------------------------------------------------------------------------------
    def save_template(self, name: str) -> Dict[str, Any]:
        """Capture this sandbox (its files and its interpreter's variables) as template ``name``
        (``POST /v1/templates``); the sandbox keeps running. ``Sandbox(template=name)`` starts new
        sandboxes from it. Returns the template (``name``, ``size``, ``not_saved``, ...); raises
        :class:`Conflict` when the name is taken."""
        self._check()
        return self._client.json("POST", "/v1/templates", json_body={"name": name, "from": self.id},
                                 timeout=_longer(self._client.request_timeout, 300.0))

    @staticmethod
    def list_templates(api_url: Optional[str] = None, api_key: Optional[str] = None,
                       request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> List[Dict[str, Any]]:
        """Every template, by name (``GET /v1/templates``)."""
        data = HTTPClient(api_url, api_key, request_timeout).json("GET", "/v1/templates")
        return list((data or {}).get("templates") or [])

    @staticmethod
    def get_template(name: str, api_url: Optional[str] = None, api_key: Optional[str] = None,
                     request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> Dict[str, Any]:
        """One template (``GET /v1/templates/{name}``); raises :class:`NotFound`."""
        return HTTPClient(api_url, api_key, request_timeout).json("GET", f"/v1/templates/{_q(name)}")

    @staticmethod
    def delete_template(name: str, api_url: Optional[str] = None, api_key: Optional[str] = None,
                        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> None:
        """Delete a template; sandboxes made from it are not affected. Raises :class:`NotFound`."""
        HTTPClient(api_url, api_key, request_timeout).request("DELETE", f"/v1/templates/{_q(name)}")

    # -- images ------------------------------------------------------------------------------------
    @staticmethod
    def build_image(name: str, apt: Optional[Sequence[str]] = None, pip: Optional[Sequence[str]] = None,
                    pip_index: Optional[str] = None, on_progress: Optional[Callable[[str], None]] = None,
                    api_url: Optional[str] = None, api_key: Optional[str] = None,
                    timeout: float = 1800.0) -> Dict[str, Any]:
        """Build (or rebuild) the named image ``name`` on the server, on top of the default image
        (``POST /v1/images``): Debian packages ``apt`` and pip requirements ``pip`` (installed from
        ``pip_index``, a PEP 503 simple index the server reaches; Debian's ``python3-*`` packages
        need none). ``on_progress`` gets each progress line. Returns the image; raises
        :class:`InvalidRequest` for bad input, :class:`Conflict` while sandboxes use the name, and
        :class:`RamifyError` when the build fails. ``Sandbox(image=name)`` runs on it."""
        body: Dict[str, Any] = {"name": name}
        if apt:
            body["apt"] = [str(p) for p in apt]
        if pip:
            body["pip"] = [str(p) for p in pip]
        if pip_index:
            body["pip_index"] = pip_index
        client = HTTPClient(api_url, api_key, DEFAULT_REQUEST_TIMEOUT)
        resp = client.request("POST", "/v1/images", json_body=body, timeout=timeout, stream=True,
                              headers={"Accept": "application/x-ndjson"})
        assert isinstance(resp, StreamResponse)
        with resp:
            for ev in iter_ndjson(resp):
                typ = ev.get("type")
                if typ == "progress":
                    if on_progress:
                        on_progress(str(ev.get("data") or ""))
                elif typ == "done":
                    return dict(ev.get("image") or {})
                elif typ == "error":
                    raise RamifyError(f"image build failed: {ev.get('error')}", 500, ev)
        raise RamifyError("image build: the stream ended without a result")

    @staticmethod
    def list_images(api_url: Optional[str] = None, api_key: Optional[str] = None,
                    request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> List[Dict[str, Any]]:
        """The default image and the named ones (``GET /v1/images``)."""
        data = HTTPClient(api_url, api_key, request_timeout).json("GET", "/v1/images")
        return list((data or {}).get("images") or [])

    @staticmethod
    def get_image(name: str, api_url: Optional[str] = None, api_key: Optional[str] = None,
                  request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> Dict[str, Any]:
        """One image (``GET /v1/images/{name}``; ``default`` is the default one); raises :class:`NotFound`."""
        return HTTPClient(api_url, api_key, request_timeout).json("GET", f"/v1/images/{_q(name)}")

    @staticmethod
    def delete_image(name: str, api_url: Optional[str] = None, api_key: Optional[str] = None,
                     request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> None:
        """Delete a named image; raises :class:`Conflict` while sandboxes or templates use it."""
        HTTPClient(api_url, api_key, request_timeout).request("DELETE", f"/v1/images/{_q(name)}")

    # -- pause / resume -----------------------------------------------------------------------------
    def pause(self, wait: bool = True, poll_timeout: float = DEFAULT_POLL_TIMEOUT,
              on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """Pause (snapshot) the sandbox; with ``wait`` wait until it is ``paused``. ``on_progress``, if given, is
        called about twice a second while it waits with the server's progress (``{"phase": "session", "bytes":
        ..., "elapsed_ms": ...}``)."""
        return self._transition("/pause", "paused", wait, poll_timeout, on_progress)

    def resume(self, wait: bool = True, poll_timeout: float = DEFAULT_POLL_TIMEOUT,
               on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """Resume a paused sandbox; with ``wait`` wait until it is ``running``. ``on_progress`` as for
        :meth:`pause` (with ``total_bytes``, the snapshot's size)."""
        return self._transition("/resume", "running", wait, poll_timeout, on_progress)

    def _transition(self, suffix: str, target: str, wait: bool, poll_timeout: float,
                    on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        self._check()
        resp = self._client.request("POST", self._path(suffix),
                                    timeout=_longer(self._client.request_timeout, 120.0))
        assert isinstance(resp, Response)
        try:
            data = resp.json()
        except RamifyError:
            data = None
        if isinstance(data, dict) and data.get("id") == self.id:
            self.info = data
        if wait:
            if isinstance(data, dict) and data.get("status") == target:
                return self.info
            self._wait_for(target, poll_timeout, on_progress)
        return self.info

    def wait_for_status(self, target: str, timeout: float = DEFAULT_POLL_TIMEOUT) -> Dict[str, Any]:
        """Wait until the sandbox reaches ``target`` status; raise on ``error`` or timeout."""
        self._check()
        return self._wait_for(target, timeout)

    def _wait_for(self, target: str, timeout: float,
                  on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """Wait until the sandbox's status is ``target``: the server answers ``GET .../wait`` as soon as it is (or
        when ``status`` goes to ``error``, or, waiting for ``paused``, when the pause failed, or, waiting for
        ``running``, when the resume failed), so this returns within milliseconds of the transition (the 202's
        ``X-Poll-After`` is not needed). Raises :class:`SandboxErrorState` on ``error``, :class:`PauseFailed` when
        the pause failed and :class:`ResumeFailed` when the resume failed (the sandbox is paused again)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout(
                    f"sandbox {self.id} did not become {target!r} within {timeout}s "
                    f"(last status {self.info.get('status')!r})"
                )
            chunk = min(remaining, _WAIT_CHUNK if on_progress is None else 0.5)
            resp = self._client.request(
                "GET", self._path("/wait"),
                query={"status": target, "timeout_s": f"{chunk:.3f}"},
                timeout=None if self._client.request_timeout is None else chunk + self._client.request_timeout,
            )
            assert isinstance(resp, Response)
            info = resp.json()
            if isinstance(info, dict):
                self.info = info
            status = self.info.get("status")
            if status == target:
                return self.info
            if status == "error":
                reason = self.info.get("error") or "unknown error"
                raise SandboxErrorState(
                    f"sandbox {self.id} went to status 'error' while waiting for {target!r}: {reason}",
                    None, self.info,
                )
            pause_error = (self.info.get("pause") or {}).get("error")
            if target == "paused" and status == "running" and pause_error:
                raise PauseFailed(f"sandbox {self.id} was not paused and keeps running: {pause_error}", None, self.info)
            if target == "running" and status == "paused" and pause_error:
                raise ResumeFailed(f"sandbox {self.id} was not resumed and is paused again: {pause_error}", None, self.info)
            if on_progress is not None and self.info.get("progress"):
                on_progress(self.info["progress"])

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy the sandbox (``DELETE``). Idempotent; a 404 is ignored; no-op when defunct."""
        if self._closed or self._merged_into is not None:
            return
        try:
            self._client.request("DELETE", self._path())
        except SandboxNotFound:
            pass
        self._closed = True

    kill = close

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = self.info.get("status")
        if self._merged_into is not None:
            state = f"defunct (merged into {self._merged_into})"
        elif self._closed:
            state = "closed"
        return f"<{type(self).__name__} id={self.id!r} status={state!r}>"


def _longer(a: Optional[float], b: float) -> Optional[float]:
    return None if a is None else max(a, b)


def _json_or_error(data: bytes) -> Dict[str, Any]:
    import json

    try:
        d = json.loads(data) if data else {}
    except ValueError as e:
        raise RamifyError(f"invalid JSON from server: {data[:200]!r}") from e
    return d if isinstance(d, dict) else {}


def _command_result(d: Dict[str, Any]) -> CommandResult:
    ec = d.get("exit_code")
    return CommandResult(
        exit_code=int(ec) if ec is not None else -1,
        stdout=d.get("stdout") or "",
        stderr=d.get("stderr") or "",
        timed_out=bool(d.get("timed_out")),
        interrupted=bool(d.get("interrupted")),
    )


def _key_lines(keys: Sequence[str]) -> List[str]:
    """SSH public keys as the API takes them: a list of authorized_keys lines (a single string is one key)."""
    if isinstance(keys, str):
        keys = [keys]
    return [str(k).strip() for k in keys]
