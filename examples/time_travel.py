#!/usr/bin/env python3
"""Time-travel debugging: a session runs step by step; before the risky step 3 it keeps a checkpoint (a fork
child left idle). Step 3 fails half-way and leaves the session's state corrupted, so instead of retrying in
place we fork the checkpoint into 3 children, try a different fix in each, and merge the one that works back
into the session's id. The session never sees the failed experiments.

    PYTHONPATH=sdk/python/src RAMIFY_API_URL=... RAMIFY_API_KEY=... python3 examples/time_travel.py
"""
import json
import os
from concurrent.futures import ThreadPoolExecutor

from ramify import Sandbox

from _checks import check, check_none_left, run  # examples/_checks.py: the self-checks, not part of the pattern

TAG = f"time_travel-{os.getpid()}"

EVENTS = [{"user": u, "amount": a} for u, a in
          [("ann", 10), ("bob", 4), ("ann", 2.5), ("cat", 7), ("bob", 1)]]
LINES = [json.dumps(e) for e in EVENTS]
LINES.insert(2, '{"user": "dan", "amount": 3')           # truncated line: bad JSON
LINES.insert(4, '{"user": "cat", "amount": "7.5"}')      # amount as a string
RAW = "\n".join(LINES) + "\n"
EXPECTED = {"ann": 12.5, "bob": 5.0, "cat": 14.5}         # the bad-JSON line is skipped

STEP1 = "lines = open('/root/events.jsonl').read().splitlines()\nlen(lines)"
STEP2 = """
import json
totals = {}
log = open('/root/progress.log', 'a')
log.write('step 2: totals initialised\\n'); log.flush()
"""
STEP3 = """
log.write('step 3: aggregating\\n'); log.flush()
for line in lines:
    e = json.loads(line)
    totals[e['user']] = totals.get(e['user'], 0) + e['amount']
log.write('step 3: done\\n'); log.flush()
"""
# Three candidate fixes for step 3, each tried in its own child of the checkpoint.
FIXES = {
    "skip bad JSON": STEP3.replace("    e = json.loads(line)\n",
                                   "    try:\n        e = json.loads(line)\n    except ValueError:\n        continue\n"),
    "coerce amounts": STEP3.replace("+ e['amount']", "+ float(e['amount'])"),
    "skip bad JSON and coerce amounts": STEP3.replace(
        "    e = json.loads(line)\n", "    try:\n        e = json.loads(line)\n    except ValueError:\n        continue\n"
    ).replace("+ e['amount']", "+ float(e['amount'])"),
}


def main():
    with Sandbox(metadata={"example": TAG}) as session:
        session.files.write("/root/events.jsonl", RAW)
        r = session.run_code(STEP1)
        check(r.error is None, f"step 1: {r.error}")
        print(f"session {session.id}: step 1 read {r.value} lines")
        r = session.run_code(STEP2)
        check(r.error is None, f"step 2: {r.error}")
        print("step 2: totals initialised")

        # Checkpoint before the risky step: a fork child that we leave idle.
        checkpoint = session.fork(n=1)[0]
        print(f"checkpoint taken: {checkpoint.id}")
        fixes = []
        try:
            r = session.run_code(STEP3)
            check(r.error is not None and r.error.name == "JSONDecodeError", f"step 3 should fail: {r}")
            partial = session.run_code("totals").value
            print(f"step 3 failed: {r.error.name}: {r.error.value}; session state is now corrupted: totals = {partial}")
            check(partial != "{}", "step 3 should have left partial totals behind")

            # Travel back: 3 children of the checkpoint, one fix each, in parallel.
            fixes = checkpoint.fork(n=len(FIXES))
            with ThreadPoolExecutor(len(fixes)) as pool:
                results = list(pool.map(lambda c, code: c.run_code(code + "\ntotals"), fixes, FIXES.values()))
            winner = None
            for child, name, res in zip(fixes, FIXES, results):
                ok = res.error is None and eval(res.value) == EXPECTED
                outcome = f"totals = {res.value}" if res.error is None else f"{res.error.name}: {res.error.value}"
                print(f"  {child.id}  {name:<34} {'works' if ok else 'fails'}: {outcome}")
                if ok and winner is None:
                    winner = (name, child)
            check(winner is not None, "no fix worked")
            name, child = winner
            check(name == "skip bad JSON and coerce amounts", f"unexpected winner {name!r}")

            d = session.diff(child)
            check(d["modified"] == ["/root/progress.log"], f"diff: {d}")
            session.merge_into(child)
            print(f"merged fix {name!r} ({child.id}) into the session {session.id}")
        finally:
            for c in fixes + [checkpoint]:
                c.close()

        # The session keeps its id and continues from the fixed state; the failed attempt left no trace.
        r = session.run_code("max(totals, key=totals.get), totals")
        check(r.error is None and eval(r.value) == ("cat", EXPECTED), f"step 4: {r}")
        log = session.files.read_text("/root/progress.log")
        check(log.count("step 3: aggregating") == 1 and log.endswith("step 3: done\n"), f"progress.log: {log!r}")
        print(f"step 4 in the session: top user = {eval(r.value)[0]!r}; progress.log:\n  " + log.strip().replace("\n", "\n  "))

    check_none_left(TAG)
    print("ok: recovered from the step-3 error via the checkpoint, nothing left behind")


if __name__ == "__main__":
    run(main)
