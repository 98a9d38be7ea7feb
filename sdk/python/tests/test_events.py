"""The event stream against a real server (skipped without RAMIFY_API_URL and RAMIFY_API_KEY; the fork part
needs RAMIFY_TEST_FORK=1)."""

from __future__ import annotations

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from ramify import AuthError, InvalidRequest, Sandbox  # noqa: E402
from ramify.events import Event, events  # noqa: E402

API_URL = os.environ.get("RAMIFY_API_URL")
API_KEY = os.environ.get("RAMIFY_API_KEY")
FORK = os.environ.get("RAMIFY_TEST_FORK") == "1"


def _until(it, pred, limit=500):
    """The first event of it that satisfies pred (the stream is shared with other tests: skip theirs)."""
    for _ in range(limit):
        ev = next(it)
        if pred(ev):
            return ev
    raise AssertionError("no matching event")


@unittest.skipUnless(API_URL and API_KEY, "needs a running ramify server (RAMIFY_API_URL, RAMIFY_API_KEY)")
class EventsTest(unittest.TestCase):
    def test_follow_a_fork_and_resume(self):
        if not FORK:
            self.skipTest("RAMIFY_TEST_FORK=1 not set")
        sb = Sandbox()
        self.addCleanup(sb.close)
        # After an id the server never gave: a missed event first, then the history (so nothing can happen
        # before the stream is open and be lost).
        family = sb.info["family_id"]
        it = events(family=family, after=1)
        self.addCleanup(it.close)
        first = next(it)
        self.assertEqual(first.type, "missed")
        created = _until(it, lambda e: e.type == "created")
        self.assertEqual((created.sandbox, created.status), (sb.id, "running"))
        kids = sb.fork(n=2)
        for k in kids:
            self.addCleanup(k.close)
        forked = _until(it, lambda e: e.type == "forked")
        self.assertEqual(forked.sandbox, sb.id)
        self.assertEqual(forked.children, [k.id for k in kids])
        self.assertEqual(forked.n, 2)
        self.assertGreater(forked.id, created.id)
        kids[1].close()
        destroyed = _until(it, lambda e: e.type == "destroyed")
        self.assertEqual((destroyed.sandbox, destroyed.reason), (kids[1].id, "deleted"))

        # Resuming after the created event gives the same events again, from the server's history; the sandbox
        # filter keeps those that mention sb (the fork, not the child's deletion).
        mine = events(sandbox=sb.id, after=created.id, reconnect=False)
        self.addCleanup(mine.close)
        self.assertEqual(next(mine).id, forked.id)
        again = events(family=family, after=created.id)
        self.addCleanup(again.close)
        self.assertEqual(next(again).id, forked.id)
        self.assertEqual(next(again).id, destroyed.id)

    def test_bad_filter_and_key(self):
        with self.assertRaises(InvalidRequest):
            next(events(sandbox="not-an-id"))
        with self.assertRaises(AuthError):
            next(events(api_key="wrong"))


class ParseTest(unittest.TestCase):
    def test_unknown_fields_are_kept_raw(self):
        ev = Event.from_json({"type": "forked", "id": 3, "children": ["a"], "future_field": 1})
        self.assertEqual((ev.type, ev.id, ev.children), ("forked", 3, ["a"]))
        self.assertEqual(ev.raw["future_field"], 1)


if __name__ == "__main__":
    unittest.main()
