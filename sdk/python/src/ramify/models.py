"""Result types returned by the SDK."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

__all__ = ["Execution", "ExecutionError", "CommandResult", "Entry"]


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

    name: str
    path: str
    type: str  # "file", "dir", "symlink" or "other"
    size: int = 0
    mode: str = ""
    mtime: str = ""
    link_target: str = ""

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Entry":
        return cls(
            name=d.get("name", ""),
            path=d.get("path", ""),
            type=d.get("type", "other"),
            size=int(d.get("size") or 0),
            mode=str(d.get("mode") or ""),
            mtime=str(d.get("mtime") or ""),
            link_target=d.get("link_target") or "",
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
