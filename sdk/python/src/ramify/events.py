"""Follow the server's lifecycle events (``GET /v1/events``, server-sent events).

    from ramify.events import events

    for ev in events(family=sb.family_id):        # blocks; break out of the loop to stop
        print(ev.id, ev.type, ev.sandbox, ev.children)

Each event is an :class:`Event`. The iterator reconnects by itself when the connection drops, resuming after the
last event it yielded (``Last-Event-ID``); a ``missed`` event says that events were lost (the id was older than
the server's history, or the server restarted). See docs/observability.md.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

from ._http import HTTPClient, StreamResponse
from .exceptions import RamifyError, ServerError, ServerUnreachable, Timeout

__all__ = ["Event", "events"]

# The server sends a keepalive comment every 15 s: a read that waits longer means a dead connection.
_READ_TIMEOUT = 60.0
_RECONNECT_DELAY = 1.0


@dataclass(frozen=True)
class Event:
    """One lifecycle event; fields that do not apply to its type are empty."""

    type: str
    id: int = 0
    time: str = ""
    sandbox: str = ""
    family: str = ""
    status: str = ""
    parent: str = ""
    children: List[str] = field(default_factory=list)
    winner: str = ""
    other: str = ""
    n: int = 0
    ms: float = 0.0
    pause_ms: float = 0.0
    bytes: int = 0
    reason: str = ""
    error: str = ""
    after: int = 0
    oldest: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Event":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "raw" and v is not None}
        return cls(raw=d, **known)


def _parse(resp: StreamResponse) -> Iterator[Event]:
    data: List[str] = []
    for raw_line in resp.iter_lines():
        line = raw_line.decode("utf-8", "replace").rstrip("\r\n")
        if line:
            if line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            continue  # id: and event: repeat what data holds; ":" lines are keepalives
        if not data:
            continue
        text = "\n".join(data)
        data = []
        try:
            yield Event.from_json(json.loads(text))
        except (ValueError, TypeError) as e:
            raise RamifyError(f"invalid event from server: {text[:200]!r}") from e


def events(
    *,
    sandbox: Optional[str] = None,
    family: Optional[str] = None,
    after: Optional[int] = None,
    reconnect: bool = True,
    api_url: Optional[str] = None,
    api_key: Optional[str] = None,
) -> Iterator[Event]:
    """Yield lifecycle events as they happen.

    ``sandbox`` keeps the events that mention that sandbox (subject, fork parent or child, merge winner, diff
    side); ``family`` those of one fork family. ``after`` starts after that event id, from the server's recent
    history; without it the stream starts with the next event. With ``reconnect`` (the default) a dropped
    connection is re-opened after a second, resuming after the last event yielded; without it the iterator
    ends when the stream does. Errors the server answers (401, 400) are raised at once.
    """
    client = HTTPClient(api_url, api_key, request_timeout=_READ_TIMEOUT)
    query = {"sandbox": sandbox, "family": family}
    last = after or 0
    while True:
        headers = {"Accept": "text/event-stream"}
        if last:
            headers["Last-Event-ID"] = str(last)
        try:
            resp = client.request("GET", "/v1/events", query=query, headers=headers, stream=True, retry=False)
            assert isinstance(resp, StreamResponse)
            with resp:
                for ev in _parse(resp):
                    if ev.id:
                        last = ev.id
                    yield ev
        except (ServerUnreachable, Timeout, ServerError):
            if not reconnect:
                raise
        else:
            if not reconnect:
                return
        time.sleep(_RECONNECT_DELAY)
