"""File operations of a sandbox (``sb.files``)."""

from __future__ import annotations

import io
import os
import stat as _stat
import tarfile
import threading
from typing import TYPE_CHECKING, Any, BinaryIO, Dict, Iterator, List, Optional, Tuple, Union

from ._http import BodyError, Response, StreamResponse, chunked_file_reader
from .exceptions import FileNotFound, RamifyError
from .models import Entry, PathArg, path_fields, raw_name

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Sandbox

__all__ = ["Files", "FileStream"]

DEFAULT_CHUNK_SIZE = 1 << 20  # 1 MiB
_TRANSFER_TIMEOUT = 300.0

Data = Union[bytes, bytearray, memoryview, str, BinaryIO, Any]


def _raw_path(d: Dict[str, Any]) -> Dict[str, Any]:
    """An answer's "path" as the raw bytes of its "path_b64" when the server gave one (not UTF-8)."""
    if d.get("path_b64"):
        d["path"] = raw_name(d, "path")
        del d["path_b64"]
    return d


def _mode_str(mode: Union[int, str, None]) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, int):
        return f"{mode:04o}"
    return str(mode)


class FileStream:
    """Iterator over the bytes of a sandbox file, read from the network in chunks.

    Also a minimal binary file object (``read(n)``) and a context manager; close it if you stop
    iterating early.
    """

    def __init__(self, resp: StreamResponse, chunk_size: int):
        self._resp = resp
        self.chunk_size = chunk_size
        self.closed = False

    def __iter__(self) -> "FileStream":
        return self

    def __next__(self) -> bytes:
        if self.closed:
            raise StopIteration
        chunk = self._resp.read(self.chunk_size)
        if not chunk:
            self.close()
            raise StopIteration
        return chunk

    def read(self, n: int = -1) -> bytes:
        if self.closed:
            return b""
        return self._resp.read(n)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._resp.close()

    def __enter__(self) -> "FileStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Files:
    """``sb.files``: read, write, list and transfer files inside the sandbox."""

    def __init__(self, sandbox: "Sandbox"):
        self._sb = sandbox

    # -- plumbing ---------------------------------------------------------------------------------
    def _req(self, method: str, suffix: str, **kw: Any) -> Any:
        self._sb._check()
        return self._sb._client.request(method, self._sb._path(suffix), file_route=True, **kw)

    def _json(self, method: str, suffix: str, **kw: Any) -> Any:
        resp = self._req(method, suffix, **kw)
        assert isinstance(resp, Response)
        return resp.json()

    def _transfer_timeout(self) -> Optional[float]:
        rt = self._sb._client.request_timeout
        return None if rt is None else max(rt, _TRANSFER_TIMEOUT)

    # -- reading ----------------------------------------------------------------------------------
    def read(self, path: PathArg) -> bytes:
        """Return the whole content of a file as bytes."""
        resp = self._req("GET", "/files", query=path_fields(path), timeout=self._transfer_timeout())
        return resp.data

    def read_text(self, path: PathArg, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read(path).decode(encoding, errors)

    def read_stream(self, path: PathArg, chunk_size: int = DEFAULT_CHUNK_SIZE) -> FileStream:
        """Return an iterator of ``bytes`` chunks of the file (streamed, not loaded in memory).

        Errors (missing file, ...) are raised by this call, not on first iteration.
        """
        resp = self._req("GET", "/files", query=path_fields(path), stream=True,
                         timeout=self._transfer_timeout(),
                         headers={"Accept": "application/octet-stream"})
        return FileStream(resp, chunk_size)

    def download_file(self, remote_path: PathArg, local_path: Union[str, os.PathLike],
                      chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
        """Stream a sandbox file to a local file; return the number of bytes written."""
        n = 0
        with self.read_stream(remote_path, chunk_size) as stream, open(local_path, "wb") as f:
            for chunk in stream:
                f.write(chunk)
                n += len(chunk)
        return n

    # -- writing ----------------------------------------------------------------------------------
    def write(self, path: PathArg, data: Data, mode: Union[int, str, None] = None) -> Dict[str, Any]:
        """Write ``data`` (bytes, str (UTF-8) or a file-like object) to ``path``.

        File-like objects are streamed in chunks (``Content-Length`` from the file size when it is
        a regular file, chunked transfer encoding otherwise). Parent directories are created.
        ``mode`` is an int (``0o644``) or an octal string (``"0644"``). Returns
        ``{"path": ..., "size": ...}``.
        """
        headers = {"Content-Type": "application/octet-stream"}
        body: Any
        if isinstance(data, str):
            body = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            body = data
        elif hasattr(data, "read"):
            size = _remaining_size(data)
            if size is not None:
                headers["Content-Length"] = str(size)
            body = chunked_file_reader(data, DEFAULT_CHUNK_SIZE)
        else:
            raise TypeError(f"data must be bytes, str or a file-like object, not {type(data).__name__}")
        if isinstance(body, (bytes, bytearray, memoryview)):
            headers["Content-Length"] = str(memoryview(body).nbytes)
        query = {**path_fields(path), "mode": _mode_str(mode)}
        try:
            resp = self._req("PUT", "/files", query=query, body=body, headers=headers,
                             timeout=self._transfer_timeout())
        except BodyError as e:
            raise e.original
        return _raw_path(resp.json() or {})

    def upload_file(self, local_path: Union[str, os.PathLike], remote_path: PathArg,
                    mode: Union[int, str, None] = None) -> Dict[str, Any]:
        """Stream a local file into the sandbox."""
        with open(local_path, "rb") as f:
            return self.write(remote_path, f, mode=mode)

    # -- metadata ---------------------------------------------------------------------------------
    def list(self, path: PathArg) -> List[Entry]:
        """List a directory (entries sorted by name)."""
        data = self._json("GET", "/files/list", query=path_fields(path)) or {}
        return [Entry.from_dict(e) for e in data.get("entries") or []]

    def stat(self, path: PathArg) -> Entry:
        return Entry.from_dict(self._json("GET", "/files/stat", query=path_fields(path)) or {})

    def exists(self, path: PathArg) -> bool:
        try:
            self.stat(path)
            return True
        except FileNotFound:
            return False

    def mkdir(self, path: PathArg, parents: bool = True) -> Entry:
        return Entry.from_dict(self._json("POST", "/files/mkdir",
                                          json_body={**path_fields(path), "parents": bool(parents)}) or {})

    def remove(self, path: PathArg, recursive: bool = False) -> None:
        query = {**path_fields(path), "recursive": "true" if recursive else None}
        self._req("DELETE", "/files", query=query, timeout=self._transfer_timeout())

    # -- directories (tar) ------------------------------------------------------------------------
    def upload_dir(self, local_dir: Union[str, os.PathLike], remote_dir: PathArg) -> Dict[str, Any]:
        """Upload the contents of ``local_dir`` into ``remote_dir`` as a streamed tar archive.

        Returns the server's ``{"path": ..., "files": N}``.
        """
        local_dir = os.fspath(local_dir)
        if not os.path.isdir(local_dir):
            raise NotADirectoryError(f"not a directory: {local_dir}")
        self._sb._check()
        rfd, wfd = os.pipe()
        rf = os.fdopen(rfd, "rb")
        wf = os.fdopen(wfd, "wb")
        errors: List[BaseException] = []

        def produce() -> None:
            try:
                with tarfile.open(fileobj=wf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    for full, arc in _walk(local_dir):
                        tar.add(full, arcname=arc, recursive=False)
            except BaseException as e:  # reported to the caller below
                errors.append(e)
            finally:
                try:
                    wf.close()
                except OSError:
                    pass

        def body() -> Iterator[bytes]:
            for chunk in chunked_file_reader(rf, DEFAULT_CHUNK_SIZE):
                yield chunk
            if errors and not isinstance(errors[0], BrokenPipeError):
                raise BodyError(errors[0])

        t = threading.Thread(target=produce, name="ramify-upload-dir", daemon=True)
        t.start()
        try:
            resp = self._req("PUT", "/files/archive", query=path_fields(remote_dir), body=body(),
                             headers={"Content-Type": "application/x-tar"},
                             timeout=self._transfer_timeout())
        except BodyError as e:
            raise e.original
        finally:
            rf.close()  # unblocks the producer if the request failed early
            t.join()
        return _raw_path(resp.json() or {})

    def download_dir(self, remote_dir: PathArg, local_dir: Union[str, os.PathLike]) -> int:
        """Download the contents of ``remote_dir`` into ``local_dir`` (created if missing).

        The tar stream is extracted as it arrives; entries that would land outside ``local_dir``
        (absolute paths, ``..``, escaping links) are rejected, devices are skipped. Returns the
        number of entries extracted.
        """
        local_dir = os.fspath(local_dir)
        os.makedirs(local_dir, exist_ok=True)
        dest = os.path.realpath(local_dir)
        resp = self._req("GET", "/files/archive", query=path_fields(remote_dir), stream=True,
                         timeout=self._transfer_timeout(), headers={"Accept": "application/x-tar"})
        count = 0
        with resp:
            try:
                tar = tarfile.open(fileobj=resp, mode="r|*")
            except tarfile.ReadError as e:
                raise RamifyError(f"server sent an invalid tar stream: {e}") from e
            with tar:
                for member in tar:
                    if not _safe_member(member, dest):
                        continue
                    if hasattr(tarfile, "data_filter"):
                        tar.extract(member, dest, filter="fully_trusted")
                    else:
                        tar.extract(member, dest)
                    count += 1
        return count


def _remaining_size(f: Any) -> Optional[int]:
    if isinstance(f, io.TextIOBase):
        return None
    try:
        st = os.fstat(f.fileno())
        if not _stat.S_ISREG(st.st_mode):
            return None
        return max(0, st.st_size - f.tell())
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        pass
    if isinstance(f, io.BytesIO):
        return len(f.getbuffer()) - f.tell()
    return None


def _walk(root: str) -> Iterator[Tuple[str, str]]:
    """Yield (full path, archive name) for everything under root, parents before children."""

    def rec(d: str, prefix: str) -> Iterator[Tuple[str, str]]:
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            arc = prefix + e.name
            yield e.path, arc
            if e.is_dir(follow_symlinks=False):
                yield from rec(e.path, arc + "/")

    yield from rec(root, "")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _safe_member(m: tarfile.TarInfo, dest: str) -> bool:
    """Validate (and sanitise in place) a tar member; False = skip it, raise = reject archive."""
    name = m.name
    while name.startswith("./"):
        name = name[2:]
    if name in ("", "."):
        return False
    if name.startswith("/") or os.path.isabs(name) or ".." in name.split("/"):
        raise RamifyError(f"refusing unsafe path in archive: {m.name!r}")
    m.name = name
    if m.isdev():  # char/block devices and fifos
        return False
    target = os.path.join(dest, name)
    parent = os.path.realpath(os.path.dirname(target))
    if not _within(parent, dest):
        raise RamifyError(f"refusing archive entry outside the destination: {m.name!r}")
    if m.islnk():
        link = m.linkname
        while link.startswith("./"):
            link = link[2:]
        if os.path.isabs(link) or not _within(os.path.realpath(os.path.join(dest, link)), dest):
            raise RamifyError(f"refusing hard link outside the destination: {m.name!r} -> {m.linkname!r}")
        m.linkname = link
    # Symlinks are extracted as they are (absolute targets included, e.g. a venv's bin/python);
    # writing *through* one is prevented by the parent check above and by replacing an existing
    # symlink instead of following it.
    if os.path.islink(target):
        os.unlink(target)
    # No setuid/setgid/sticky bits, and files owned by the local user.
    if m.mode is not None:
        m.mode &= 0o777
        if m.isdir():
            m.mode |= 0o700
        elif m.isreg():
            m.mode |= 0o600
    m.uid, m.gid = os.getuid(), os.getgid()
    m.uname = m.gname = ""
    return True
