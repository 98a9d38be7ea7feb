"""``AsyncSandbox``: the :class:`Sandbox` surface as coroutines.

Each call runs the synchronous client in a worker thread (a dedicated thread pool, like
:func:`asyncio.to_thread` but not capped at the default executor's ``cpu + 4`` threads), so many
sandboxes (e.g. fork children) can be driven concurrently with :func:`asyncio.gather`.
Output callbacks of ``run_code`` / ``exec`` are called on the event loop thread; they may be plain
functions or coroutine functions (awaited before the call returns).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import os
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Generator, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._http import DEFAULT_REQUEST_TIMEOUT
from .files import DEFAULT_CHUNK_SIZE, Files
from .models import CommandResult, Entry, Execution, PathArg, Result
from .sandbox import DEFAULT_POLL_TIMEOUT, Sandbox

__all__ = ["AsyncSandbox", "AsyncFiles"]

AsyncOutputCallback = Callable[[str], Any]

# Blocking SDK calls mostly wait on the network, so allow many at once (e.g. 32 fork children each
# running code). Threads are only started when needed.
MAX_WORKERS = 128
_executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def _get_executor() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=MAX_WORKERS,
                                                              thread_name_prefix="ramify-async")
        return _executor


async def _run(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking call in the SDK's thread pool (contextvars propagated, like to_thread)."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    return await loop.run_in_executor(_get_executor(), functools.partial(ctx.run, fn, *args))


def _unwrap(x: Any) -> Any:
    return x._s() if isinstance(x, AsyncSandbox) else x


class _Callbacks:
    """Marshal callbacks from the worker thread onto the event loop, preserving order."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.pending: List["asyncio.Future[Any]"] = []
        self.errors: List[BaseException] = []

    def wrap(self, cb: Optional[Callable[[Any], Any]]) -> Optional[Callable[[Any], None]]:
        if cb is None:
            return None

        def invoke(data: Any) -> None:
            try:
                r = cb(data)
                if inspect.isawaitable(r):
                    self.pending.append(asyncio.ensure_future(r))
            except BaseException as e:  # surfaced after the call returns
                self.errors.append(e)

        def from_thread(data: Any) -> None:
            self.loop.call_soon_threadsafe(invoke, data)

        return from_thread

    async def finish(self) -> None:
        # Every call_soon_threadsafe above was queued before the worker's completion callback,
        # so all callbacks have run by now; await the coroutine ones.
        if self.pending:
            await asyncio.gather(*self.pending)
        if self.errors:
            raise self.errors[0]


class AsyncFiles:
    """``sb.files`` of an :class:`AsyncSandbox`."""

    def __init__(self, files: Files):
        self._files = files

    async def read(self, path: PathArg) -> bytes:
        return await _run(self._files.read, path)

    async def read_text(self, path: PathArg, encoding: str = "utf-8", errors: str = "strict") -> str:
        return await _run(self._files.read_text, path, encoding, errors)

    async def read_stream(self, path: PathArg, chunk_size: int = DEFAULT_CHUNK_SIZE) -> AsyncIterator[bytes]:
        """Async iterator of bytes chunks: ``async for chunk in await sb.files.read_stream(p)``."""
        stream = await _run(self._files.read_stream, path, chunk_size)

        async def gen() -> AsyncIterator[bytes]:
            try:
                while True:
                    chunk = await _run(next, stream, None)
                    if chunk is None:
                        return
                    yield chunk
            finally:
                stream.close()

        return gen()

    async def download_file(self, remote_path: PathArg, local_path: Union[str, os.PathLike],
                            chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
        return await _run(self._files.download_file, remote_path, local_path, chunk_size)

    async def write(self, path: PathArg, data: Any, mode: Union[int, str, None] = None) -> Dict[str, Any]:
        return await _run(self._files.write, path, data, mode)

    async def upload_file(self, local_path: Union[str, os.PathLike], remote_path: PathArg,
                          mode: Union[int, str, None] = None) -> Dict[str, Any]:
        return await _run(self._files.upload_file, local_path, remote_path, mode)

    async def list(self, path: PathArg) -> List[Entry]:
        return await _run(self._files.list, path)

    async def stat(self, path: PathArg) -> Entry:
        return await _run(self._files.stat, path)

    async def exists(self, path: PathArg) -> bool:
        return await _run(self._files.exists, path)

    async def mkdir(self, path: PathArg, parents: bool = True) -> Entry:
        return await _run(self._files.mkdir, path, parents)

    async def remove(self, path: PathArg, recursive: bool = False) -> None:
        return await _run(self._files.remove, path, recursive)

    async def upload_dir(self, local_dir: Union[str, os.PathLike], remote_dir: PathArg) -> Dict[str, Any]:
        return await _run(self._files.upload_dir, local_dir, remote_dir)

    async def download_dir(self, remote_dir: PathArg, local_dir: Union[str, os.PathLike]) -> int:
        return await _run(self._files.download_dir, remote_dir, local_dir)


class _Creating:
    """Returned by :meth:`AsyncSandbox.create`: await it, or use it directly with ``async with``."""

    def __init__(self, kwargs: Dict[str, Any]):
        self._kwargs = kwargs
        self._sb: Optional[AsyncSandbox] = None

    async def _create(self) -> "AsyncSandbox":
        sync = await _run(lambda: Sandbox(**self._kwargs))
        return AsyncSandbox._of(sync)

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self._create().__await__()

    async def __aenter__(self) -> "AsyncSandbox":
        self._sb = await self._create()
        return self._sb

    async def __aexit__(self, *exc: Any) -> None:
        if self._sb is not None:
            await self._sb.close()


_NOT_CREATED = ("this AsyncSandbox is not created yet: use `sb = await AsyncSandbox(...)`, "
                "`async with AsyncSandbox(...) as sb:` or `await AsyncSandbox.create(...)`")


class AsyncSandbox:
    """Async version of :class:`Sandbox`, with the same constructor, methods (as coroutines) and
    properties.

    ``AsyncSandbox(...)`` takes :class:`Sandbox`'s arguments; the sandbox is created on the server
    when the object is awaited or entered, since a constructor cannot await::

        async with AsyncSandbox(timeout_s=600) as sb:   # or: sb = await AsyncSandbox(...)
            print((await sb.run_code("1 + 1")).value)

    ``await AsyncSandbox.create(...)`` and ``async with AsyncSandbox.create(...)`` work too.
    Properties (:attr:`status`, :attr:`ip`, :attr:`metadata`) read the last known state without
    I/O; ``await sb.refresh()`` (or :meth:`get_status`) fetches it.
    """

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
        self._sync: Optional[Sandbox] = None
        self._kwargs: Optional[Dict[str, Any]] = None
        if isinstance(vcpu, Sandbox):  # AsyncSandbox(sync_sandbox) wraps an existing one
            self._wrap(vcpu)
            return
        self._kwargs = dict(vcpu=vcpu, mem_mib=mem_mib, max_procs=max_procs, timeout_s=timeout_s,
                            on_timeout=on_timeout, env=env, cwd=cwd, metadata=metadata,
                            api_url=api_url, api_key=api_key, request_timeout=request_timeout,
                            disk_mib=disk_mib, egress=egress, ingress_enabled=ingress_enabled,
                            template=template, image=image, ssh_pubkeys=ssh_pubkeys)

    def _wrap(self, sandbox: Sandbox) -> "AsyncSandbox":
        self._sync = sandbox
        self.files = AsyncFiles(sandbox.files)
        self._kwargs = None
        return self

    @classmethod
    def _of(cls, sandbox: Sandbox) -> "AsyncSandbox":
        return cls.__new__(cls)._wrap(sandbox)

    async def _ensure_created(self) -> "AsyncSandbox":
        if self._sync is None:
            kwargs = self._kwargs or {}
            self._wrap(await _run(lambda: Sandbox(**kwargs)))
        return self

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self._ensure_created().__await__()

    def _s(self) -> Sandbox:
        if self._sync is None:
            raise RuntimeError(_NOT_CREATED)
        return self._sync

    # -- construction -------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
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
    ) -> _Creating:
        return _Creating(dict(vcpu=vcpu, mem_mib=mem_mib, max_procs=max_procs, timeout_s=timeout_s,
                              on_timeout=on_timeout, env=env, cwd=cwd, metadata=metadata,
                              api_url=api_url, api_key=api_key, request_timeout=request_timeout,
                              disk_mib=disk_mib, egress=egress, ingress_enabled=ingress_enabled,
                              template=template, image=image, ssh_pubkeys=ssh_pubkeys))

    @classmethod
    async def connect(cls, id: str, api_url: Optional[str] = None, api_key: Optional[str] = None,
                      request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> "AsyncSandbox":
        return cls._of(await _run(Sandbox.connect, id, api_url, api_key, request_timeout))

    @classmethod
    async def list(cls, metadata: Optional[Mapping[str, str]] = None, status: Optional[str] = None,
                   api_url: Optional[str] = None, api_key: Optional[str] = None,
                   request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> "List[AsyncSandbox]":
        sbs = await _run(Sandbox.list, metadata, status, api_url, api_key, request_timeout)
        return [cls._of(s) for s in sbs]

    # -- state -------------------------------------------------------------------------------------
    @property
    def sync(self) -> Sandbox:
        """The underlying synchronous :class:`Sandbox`."""
        return self._s()

    @property
    def id(self) -> str:
        return self._s().id

    @property
    def info(self) -> Dict[str, Any]:
        return self._s().info

    @property
    def status(self) -> str:
        """Status from the last known sandbox JSON (``await sb.get_status()`` fetches it)."""
        return str(self._s().info.get("status", ""))

    @property
    def ip(self) -> Optional[str]:
        """IP from the last known sandbox JSON (``await sb.refresh()`` to update)."""
        return self._s().info.get("ip")

    @property
    def metadata(self) -> Dict[str, str]:
        return self._s().metadata

    async def url(self, port: int) -> str:
        """See :meth:`Sandbox.url`."""
        return await _run(self._s().url, port)

    async def api_url(self, port: int) -> str:
        """See :meth:`Sandbox.api_url`."""
        return await _run(self._s().api_url, port)

    @property
    def defunct(self) -> bool:
        return self._s().defunct

    @property
    def closed(self) -> bool:
        return self._s().closed

    async def refresh(self) -> Dict[str, Any]:
        return await _run(self._s().refresh)

    async def get_status(self) -> str:
        return await _run(self._s().get_status)

    async def set_timeout(self, timeout_s: int) -> Dict[str, Any]:
        return await _run(self._s().set_timeout, timeout_s)

    async def add_ssh_keys(self, keys: Sequence[str]) -> Dict[str, Any]:
        return await _run(self._s().add_ssh_keys, keys)

    async def interrupt(self, what: Optional[str] = None) -> Dict[str, int]:
        return await _run(self._s().interrupt, what)

    # -- code ------------------------------------------------------------------------------------
    async def run_code(self, code: str, timeout_s: Optional[float] = None,
                       on_stdout: Optional[AsyncOutputCallback] = None,
                       on_stderr: Optional[AsyncOutputCallback] = None,
                       env: Optional[Mapping[str, str]] = None,
                       on_result: Optional[Callable[[Result], Any]] = None) -> Execution:
        cbs = _Callbacks()
        result = await _run(self._s().run_code, code, timeout_s,
                            cbs.wrap(on_stdout), cbs.wrap(on_stderr), env, cbs.wrap(on_result))
        await cbs.finish()
        return result

    async def exec(self, cmd: Union[str, Sequence[str]], env: Optional[Mapping[str, str]] = None,
                   cwd: Optional[str] = None, timeout_s: Optional[float] = None,
                   stdin: Union[str, bytes, None] = None,
                   on_stdout: Optional[AsyncOutputCallback] = None,
                   on_stderr: Optional[AsyncOutputCallback] = None) -> CommandResult:
        cbs = _Callbacks()
        result = await _run(self._s().exec, cmd, env, cwd, timeout_s, stdin,
                            cbs.wrap(on_stdout), cbs.wrap(on_stderr))
        await cbs.finish()
        return result

    # -- fork / merge / diff ------------------------------------------------------------------------
    async def fork(self, n: int = 1, ingress_enabled: Optional[bool] = None,
                   ssh_pubkeys: Optional[Sequence[str]] = None) -> "List[AsyncSandbox]":
        children = await _run(self._s().fork, n, ingress_enabled, ssh_pubkeys)
        return [AsyncSandbox._of(c) for c in children]

    async def merge_into(self, winner: Union["AsyncSandbox", Sandbox, str]) -> None:
        await _run(self._s().merge_into, _unwrap(winner))

    async def diff(self, other: Union["AsyncSandbox", Sandbox, str],
                   paths: Optional[Iterable[PathArg]] = None) -> Dict[str, Any]:
        return await _run(self._s().diff, _unwrap(other), paths)

    # -- images (see Sandbox) --------------------------------------------------------------------
    @staticmethod
    async def build_image(name: str, apt: Optional[Sequence[str]] = None, pip: Optional[Sequence[str]] = None,
                          pip_index: Optional[str] = None, on_progress: Optional[Callable[[str], None]] = None,
                          api_url: Optional[str] = None, api_key: Optional[str] = None,
                          timeout: float = 1800.0) -> Dict[str, Any]:
        return await _run(Sandbox.build_image, name, apt, pip, pip_index, on_progress, api_url, api_key, timeout)

    @staticmethod
    async def list_images(api_url: Optional[str] = None, api_key: Optional[str] = None,
                          request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> List[Dict[str, Any]]:
        return await _run(Sandbox.list_images, api_url, api_key, request_timeout)

    @staticmethod
    async def get_image(name: str, api_url: Optional[str] = None, api_key: Optional[str] = None,
                        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> Dict[str, Any]:
        return await _run(Sandbox.get_image, name, api_url, api_key, request_timeout)

    @staticmethod
    async def delete_image(name: str, api_url: Optional[str] = None, api_key: Optional[str] = None,
                           request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> None:
        await _run(Sandbox.delete_image, name, api_url, api_key, request_timeout)

    # -- templates (see Sandbox) -----------------------------------------------------------------
    async def save_template(self, name: str) -> Dict[str, Any]:
        return await _run(self._s().save_template, name)

    @staticmethod
    async def list_templates(api_url: Optional[str] = None, api_key: Optional[str] = None,
                             request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> List[Dict[str, Any]]:
        return await _run(Sandbox.list_templates, api_url, api_key, request_timeout)

    @staticmethod
    async def get_template(name: str, api_url: Optional[str] = None, api_key: Optional[str] = None,
                           request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> Dict[str, Any]:
        return await _run(Sandbox.get_template, name, api_url, api_key, request_timeout)

    @staticmethod
    async def delete_template(name: str, api_url: Optional[str] = None, api_key: Optional[str] = None,
                              request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> None:
        await _run(Sandbox.delete_template, name, api_url, api_key, request_timeout)

    # -- lifecycle -------------------------------------------------------------------------------
    async def pause(self, wait: bool = True, poll_timeout: float = DEFAULT_POLL_TIMEOUT,
                    on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        return await _run(self._s().pause, wait, poll_timeout, on_progress)

    async def resume(self, wait: bool = True, poll_timeout: float = DEFAULT_POLL_TIMEOUT,
                     on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        return await _run(self._s().resume, wait, poll_timeout, on_progress)

    async def wait_for_status(self, target: str, timeout: float = DEFAULT_POLL_TIMEOUT) -> Dict[str, Any]:
        return await _run(self._s().wait_for_status, target, timeout)

    async def close(self) -> None:
        if self._sync is None:  # never created: nothing to destroy
            return
        await _run(self._sync.close)

    kill = close

    async def __aenter__(self) -> "AsyncSandbox":
        return await self._ensure_created()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        if self._sync is None:
            return "<AsyncSandbox (not created yet)>"
        return repr(self._sync).replace("<Sandbox", "<AsyncSandbox", 1)
