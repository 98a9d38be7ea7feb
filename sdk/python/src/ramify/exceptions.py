"""Exceptions raised by the ramify SDK.

Every error the server returns is JSON ``{"error": "<message>"}``; the SDK maps the HTTP status
to one of the classes below and keeps the message (``.message``), the status (``.status``) and the
raw body (``.body``).
"""

from __future__ import annotations

import re
from typing import Any, Optional

__all__ = [
    "RamifyError",
    "AuthError",
    "InvalidRequest",
    "NotFound",
    "SandboxNotFound",
    "FileNotFound",
    "Conflict",
    "ServerError",
    "Timeout",
    "ServerUnreachable",
    "SandboxDefunct",
    "SandboxErrorState",
    "PauseFailed",
    "ResumeFailed",
]


class RamifyError(Exception):
    """Base class of every error raised by the SDK."""

    def __init__(self, message: str, status: Optional[int] = None, body: Any = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = body

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        return f"{self.message} (HTTP {self.status})"


class AuthError(RamifyError):
    """401: missing or wrong API key."""


class InvalidRequest(RamifyError):
    """400 / 413: malformed request, bad value, or body too large."""


class NotFound(RamifyError):
    """404: something does not exist (see the two subclasses)."""


class SandboxNotFound(NotFound):
    """404: the sandbox does not exist (or was closed)."""


class FileNotFound(NotFound, FileNotFoundError):
    """404 from a file route: the path does not exist inside the sandbox.

    Also a builtin :class:`FileNotFoundError`.
    """


class Conflict(RamifyError):
    """409: the sandbox is not in a state that allows the call (e.g. ``sandbox is not running``)."""


class ServerError(RamifyError):
    """5xx: internal server error."""


class Timeout(RamifyError, TimeoutError):
    """A client-side timeout: the socket timed out, or a wait (pause/resume/create) took too long.

    Also a builtin :class:`TimeoutError`.
    """


class ServerUnreachable(RamifyError, ConnectionError):
    """The server could not be reached (connection refused/reset before a response).

    Also a builtin :class:`ConnectionError`.
    """


class SandboxDefunct(SandboxNotFound):
    """The sandbox was the winner of a ``merge_into`` and its id is retired (the server answers 404 for it, saying
    which sandbox holds its state now): a :class:`SandboxNotFound`, so ``except SandboxNotFound`` catches it."""


class SandboxErrorState(RamifyError):
    """The sandbox went to status ``error`` while waiting for it (``info["error"]`` holds the reason)."""


class PauseFailed(RamifyError):
    """The pause waited for failed: the sandbox was not paused and keeps running (``body`` is the sandbox info;
    ``body["pause"]["error"]`` says why)."""


class ResumeFailed(RamifyError):
    """The resume waited for failed for a reason retrying may cure: the sandbox is paused again with its snapshot
    intact (``body`` is the sandbox info; ``body["pause"]["error"]`` says why). A broken snapshot puts the sandbox
    in status ``error`` instead (:class:`SandboxErrorState`)."""


# The server's 404 for a sandbox: "sandbox not found", or for an id it retired "sandbox sbx_... was merged into
# sbx_... at ..." / "sandbox sbx_... was deleted at ...". A file route's 404 for a missing path says otherwise.
_SANDBOX_GONE = re.compile(r"^sandbox (?:not found|sbx_[0-9a-f]{32} was (?:(merged into)|\w))")


def error_for_status(status: int, message: str, body: Any = None, file_route: bool = False) -> RamifyError:
    """Map an HTTP error status (and message) to an exception instance."""
    if status == 401 or status == 403:
        return AuthError(message, status, body)
    if status in (400, 413, 422):
        return InvalidRequest(message, status, body)
    if status == 404:
        gone = _SANDBOX_GONE.match(message)
        if gone is None and file_route:
            return FileNotFound(message, status, body)
        if gone is None and (message.startswith("template ") or message.startswith("image ")):
            return NotFound(message, status, body)  # a template's or an image's 404: no sandbox is missing
        if gone is not None and gone.group(1):
            return SandboxDefunct(message, status, body)
        return SandboxNotFound(message, status, body)
    if status == 409:
        return Conflict(message, status, body)
    if 500 <= status <= 599:
        return ServerError(message, status, body)
    return RamifyError(message, status, body)
