"""Result types returned by the SDK."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

__all__ = ["Execution", "ExecutionError", "Result", "CommandResult", "Entry"]

# A path of a sandbox file as the SDK takes it: str (UTF-8; a str from os.fsdecode with surrogate escapes is sent
# as the bytes it stands for), bytes (any name Linux allows), or os.PathLike of either.
PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


def path_fields(path: Any, key: str = "path") -> Dict[str, str]:
    """The request field naming ``path``: ``{key: str}`` when its bytes are UTF-8, else ``{key + "_b64": ...}``
    (standard base64 of the raw bytes), which the server takes in its place."""
    p = os.fspath(path)
    if isinstance(p, str):
        try:
            p.encode("utf-8")
            return {key: p}
        except UnicodeEncodeError:  # lone surrogates: os.fsdecode's escapes of bytes that are not UTF-8
            p = os.fsencode(p)
    raw = bytes(p)
    try:
        return {key: raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {key + "_b64": base64.b64encode(raw).decode("ascii")}


def raw_name(d: Dict[str, Any], key: str) -> Union[str, bytes]:
    """Field ``key`` of a server answer: the str as sent, or the raw bytes of ``key + "_b64"`` when the server gave
    one (the name is not UTF-8; the str beside it is only a display form)."""
    b = d.get(key + "_b64")
    if b:
        return base64.b64decode(b)
    return d.get(key) or ""


def raw_path_list(d: Dict[str, Any], key: str) -> List[Union[str, bytes]]:
    """List ``key`` of a server answer with each path that has a base64 twin (``key + "_b64"``, a parallel list
    with null where the path is UTF-8) as its raw bytes."""
    plain = list(d.get(key) or [])
    b64 = d.get(key + "_b64")
    if not b64:
        return plain
    return [base64.b64decode(b) if b else p for p, b in zip(plain, b64)]


def _short(s: Optional[str], n: int = 60) -> str:
    if s is None:
        return "None"
    r = repr(s)
    return r if len(r) <= n else r[: n - 4] + "...'"


@dataclass
class ExecutionError:
    """An exception raised by code run with :meth:`Sandbox.run_code`."""

    name: str
    value: str = ""
    traceback: str = ""

    @classmethod
    def from_dict(cls, d: Any) -> Optional["ExecutionError"]:
        if not d:
            return None
        if isinstance(d, str):
            return cls(name="Error", value=d)
        return cls(name=str(d.get("name") or "Error"), value=str(d.get("value") or ""),
                   traceback=str(d.get("traceback") or ""))

    def __str__(self) -> str:
        return f"{self.name}: {self.value}" if self.value else self.name


class Result:
    """A rich result of :meth:`Sandbox.run_code`, as a Jupyter kernel gives it.

    ``type`` is ``"execute_result"`` (the cell's trailing expression) or ``"display_data"`` (``display()``,
    ``plt.show()``, a figure left open); ``data`` maps mime types to values (``image/png`` base64). The
    properties give the common formats, ``None`` when the result has no such format::

        ex = sbx.run_code("import matplotlib.pyplot as plt; plt.plot([1, 3, 2]); plt.show()")
        ex.results[0].save("chart.png")
    """

    _EXT = {"image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg", "text/html": ".html",
            "application/json": ".json", "text/markdown": ".md", "text/latex": ".tex", "text/plain": ".txt"}

    def __init__(self, type: str, data: Dict[str, Any]) -> None:
        self.type = type
        self.data = dict(data or {})

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Result":
        return cls(str(d.get("type") or "display_data"), d.get("data") or {})

    def formats(self) -> List[str]:
        """The mime types this result has, e.g. ``["image/png", "text/plain"]``."""
        return list(self.data)

    def _bytes(self, mime: str) -> Optional[bytes]:
        v = self.data.get(mime)
        return base64.b64decode(v) if isinstance(v, str) else None

    @property
    def png(self) -> Optional[bytes]:
        """The PNG image, decoded."""
        return self._bytes("image/png")

    @property
    def jpeg(self) -> Optional[bytes]:
        return self._bytes("image/jpeg")

    @property
    def text(self) -> Optional[str]:
        """``text/plain``: the object's repr."""
        return self.data.get("text/plain")

    @property
    def html(self) -> Optional[str]:
        return self.data.get("text/html")

    @property
    def svg(self) -> Optional[str]:
        return self.data.get("image/svg+xml")

    @property
    def markdown(self) -> Optional[str]:
        return self.data.get("text/markdown")

    @property
    def latex(self) -> Optional[str]:
        return self.data.get("text/latex")

    @property
    def json(self) -> Any:
        """``application/json``, as a Python value."""
        return self.data.get("application/json")

    def save(self, path: Union[str, "os.PathLike[str]"], format: Optional[str] = None) -> str:
        """Write the result to ``path`` and return it: the format named (a mime type), else the one the file's
        extension names, else the richest it has (PNG, JPEG, SVG, HTML, JSON, Markdown, LaTeX, text)."""
        path = os.fspath(path)
        if format is None:
            ext = os.path.splitext(path)[1].lower()
            format = next((m for m, e in self._EXT.items() if e == ext and m in self.data), None)
        if format is None:
            format = next((m for m in self._EXT if m in self.data), None)
        if format is None or format not in self.data:
            raise ValueError(f"result has no {format or 'known'} format; it has {self.formats()}")
        if format in ("image/png", "image/jpeg"):
            content: bytes = self._bytes(format) or b""
        elif format == "application/json" or format.endswith("+json"):
            import json
            content = json.dumps(self.data[format]).encode()
        else:
            content = str(self.data[format]).encode()
        with open(path, "wb") as f:
            f.write(content)
        return path

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Dict[str, Any]:
        """In a notebook, a result shows as it did in the sandbox."""
        return dict(self.data)

    def __repr__(self) -> str:
        return f"Result(type={self.type!r}, formats={self.formats()!r}, text={_short(self.text)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Result) and (self.type, self.data) == (other.type, other.data)


@dataclass(repr=False)
class Execution:
    """Result of :meth:`Sandbox.run_code`.

    ``value`` is ``repr()`` of the cell's trailing expression (or None); ``error`` is None or an
    :class:`ExecutionError` with ``name``, ``value`` and ``traceback``.
    """

    stdout: str = ""
    stderr: str = ""
    value: Optional[str] = None
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    #: True when :meth:`Sandbox.interrupt` stopped the cell (``error`` is then a ``KeyboardInterrupt``).
    interrupted: bool = False
    #: The cell's rich results in order (:class:`Result`): the trailing expression's ``execute_result``, a
    #: ``display_data`` for each ``display()``, ``plt.show()`` or figure left open.
    results: List[Result] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Execution":
        return cls(
            stdout=d.get("stdout") or "",
            stderr=d.get("stderr") or "",
            value=d.get("value"),
            error=ExecutionError.from_dict(d.get("error")),
            execution_count=d.get("execution_count"),
            interrupted=bool(d.get("interrupted")),
            results=[Result.from_dict(r) for r in d.get("results") or []],
            raw=dict(d),
        )

    @property
    def text(self) -> Optional[str]:
        """The trailing expression's repr (same as ``value``)."""
        return self.value

    @property
    def ok(self) -> bool:
        return self.error is None

    def __repr__(self) -> str:
        parts = [f"value={_short(self.value)}"]
        if self.stdout:
            parts.append(f"stdout={_short(self.stdout)}")
        if self.stderr:
            parts.append(f"stderr={_short(self.stderr)}")
        if self.error is not None:
            parts.append(f"error={str(self.error)!r}")
        parts.append(f"execution_count={self.execution_count}")
        return "Execution(" + ", ".join(parts) + ")"


@dataclass
class CommandResult:
    """Result of :meth:`Sandbox.exec`."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    #: True when :meth:`Sandbox.interrupt` stopped the command.
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.interrupted


@dataclass
class Entry:
    """A file-system entry (from ``files.list`` / ``files.stat`` / ``files.mkdir``)."""

    # name, path and link_target are str, or bytes when the name is not UTF-8 (the server's *_b64 forms): pass
    # them back as they are (sb.files.read(entry.path)); os.fsdecode(entry.name) gives a str either way.
    name: Union[str, bytes]
    path: Union[str, bytes]
    type: str  # "file", "dir", "symlink" or "other"
    size: int = 0
    mode: str = ""
    mtime: str = ""
    link_target: Union[str, bytes] = ""

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Entry":
        return cls(
            name=raw_name(d, "name"),
            path=raw_name(d, "path"),
            type=d.get("type", "other"),
            size=int(d.get("size") or 0),
            mode=str(d.get("mode") or ""),
            mtime=str(d.get("mtime") or ""),
            link_target=raw_name(d, "link_target"),
        )

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        return self.type == "symlink"
