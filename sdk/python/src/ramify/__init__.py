"""Python SDK for ramify, a self-hosted sandbox server for AI agents.

    from ramify import Sandbox

    with Sandbox() as sb:
        sb.run_code("x = 42")
        print(sb.run_code("x + 1").value)   # '43'
"""

from ._version import __version__
from .async_sandbox import AsyncFiles, AsyncSandbox
from .exceptions import (
    AuthError,
    Conflict,
    FileNotFound,
    InvalidRequest,
    NotFound,
    PauseFailed,
    ResumeFailed,
    RamifyError,
    SandboxDefunct,
    SandboxErrorState,
    SandboxNotFound,
    ServerError,
    ServerUnreachable,
    Timeout,
)
from .files import FileStream, Files
from .models import CommandResult, Entry, Execution, ExecutionError, Result
from .sandbox import Sandbox

__all__ = [
    "__version__",
    "Sandbox",
    "AsyncSandbox",
    "Files",
    "AsyncFiles",
    "FileStream",
    "Execution",
    "ExecutionError",
    "Result",
    "CommandResult",
    "Entry",
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
