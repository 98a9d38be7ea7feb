#!/usr/bin/env python3
"""Multi-attempt code synthesis: 5 candidate implementations of one function (some buggy), each written
into its own fork child and run against the same test suite; the candidate whose tests pass is merged
into the parent, the others are closed.

    PYTHONPATH=sdk/python/src RAMIFY_API_URL=... RAMIFY_API_KEY=... python3 examples/code_synthesis.py
"""
import os
from concurrent.futures import ThreadPoolExecutor

from ramify import Sandbox

from _checks import check, check_none_left, run  # examples/_checks.py: the self-checks, not part of the pattern

TAG = f"code_synthesis-{os.getpid()}"

TESTS = '''\
import unittest
from solution import merge_intervals

class TestMergeIntervals(unittest.TestCase):
    def test_empty(self):
        self.assertEqual(merge_intervals([]), [])
    def test_disjoint(self):
        self.assertEqual(merge_intervals([(1, 2), (4, 5)]), [(1, 2), (4, 5)])
    def test_overlap(self):
        self.assertEqual(merge_intervals([(1, 3), (2, 6), (8, 10)]), [(1, 6), (8, 10)])
    def test_touching(self):
        self.assertEqual(merge_intervals([(1, 2), (2, 3)]), [(1, 3)])
    def test_unsorted(self):
        self.assertEqual(merge_intervals([(8, 10), (1, 3), (2, 4)]), [(1, 4), (8, 10)])
    def test_contained(self):
        self.assertEqual(merge_intervals([(1, 10), (2, 3)]), [(1, 10)])
    def test_input_untouched(self):
        xs = [(3, 4), (1, 2)]
        merge_intervals(xs)
        self.assertEqual(xs, [(3, 4), (1, 2)])
'''

# What a model might propose. Only one is right.
CANDIDATES = {
    "no-sort": '''
def merge_intervals(xs):
    out = []
    for a, b in xs:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
''',
    "strict-overlap": '''
def merge_intervals(xs):
    out = []
    for a, b in sorted(xs):
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
''',
    "sorts-in-place": '''
def merge_intervals(xs):
    xs.sort()
    out = []
    for a, b in xs:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
''',
    "correct": '''
def merge_intervals(xs):
    out = []
    for a, b in sorted(xs):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
''',
    "syntax-error": '''
def merge_intervals(xs)
    return sorted(xs)
''',
}


def main():
    with Sandbox(metadata={"example": TAG}, env={"PYTHONDONTWRITEBYTECODE": "1"}) as parent:
        # Set-up paid once: the test suite (and whatever else the task needs) lives in the parent.
        parent.files.write("/root/work/test_solution.py", TESTS)
        children = parent.fork(n=len(CANDIDATES))
        print(f"parent {parent.id}: test suite written; forked {len(children)} children")
        try:
            def attempt(child, src):
                child.files.write("/root/work/solution.py", src)
                return child.exec("python3 -m unittest -q test_solution 2>&1", cwd="/root/work", timeout_s=60)

            with ThreadPoolExecutor(len(children)) as pool:
                results = list(pool.map(attempt, children, CANDIDATES.values()))
            passing = []
            for child, name, res in zip(children, CANDIDATES, results):
                last = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
                print(f"  {child.id}  {name:<15} exit {res.exit_code}  {last}")
                if res.exit_code == 0:
                    passing.append((name, child))
            check([n for n, _ in passing] == ["correct"], f"expected only 'correct' to pass, got {passing}")
            name, winner = passing[0]

            d = parent.diff(winner, paths=["/root/work"])
            check(d == {"added": ["/root/work/solution.py"], "removed": [], "modified": []}, f"diff: {d}")
            parent.merge_into(winner)
            print(f"kept {name!r}: merged {winner.id} into {parent.id}")
        finally:
            for c in children:
                c.close()

        # The parent now has the passing solution; its tests pass there too.
        res = parent.exec(["python3", "-m", "unittest", "-q", "test_solution"], cwd="/root/work")
        check(res.exit_code == 0, f"tests fail in the parent after the merge: {res.stdout}{res.stderr}")
        r = parent.run_code("import sys; sys.path.insert(0, '/root/work')\n"
                            "from solution import merge_intervals\nmerge_intervals([(5, 7), (1, 2), (2, 4)])")
        check(r.error is None and r.value == "[(1, 4), (5, 7)]", f"parent run: {r}")
        print(f"parent runs the kept solution: merge_intervals([(5, 7), (1, 2), (2, 4)]) = {r.value}")

    check_none_left(TAG)
    print("ok: 1 of 5 candidates passed and was kept, nothing left behind")


if __name__ == "__main__":
    run(main)
