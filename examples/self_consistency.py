#!/usr/bin/env python3
"""Self-consistency voting: the same question answered 5 ways (5 seeds) in 5 fork children that all start
from the parent's loaded data; the majority answer wins.

The "question" is which bucket of a large data set holds the most values; each child answers it from a
different random sample (its seed), the way an agent's sampled reasoning paths answer one prompt.

    PYTHONPATH=sdk/python/src RAMIFY_API_URL=... RAMIFY_API_KEY=... python3 examples/self_consistency.py
"""
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from ramify import Sandbox

from _checks import check, check_none_left, run  # examples/_checks.py: the self-checks, not part of the pattern

TAG = f"self_consistency-{os.getpid()}"
SEEDS = [11, 22, 33, 44, 55]

SETUP = """
import numpy as np
rng = np.random.default_rng(0)
# 1M values over 5 buckets; 'C' is the most common (30%), 'B' the runner-up (25%).
buckets = np.array(list('ABCDE'))
data = rng.choice(buckets, size=1_000_000, p=[0.15, 0.25, 0.30, 0.20, 0.10])
data.size
"""

ANSWER = """
seed = {seed}
sample = np.random.default_rng(seed).choice(data, size=150, replace=False)
values, counts = np.unique(sample, return_counts=True)
answer = str(values[counts.argmax()])
answer
"""


def main():
    with Sandbox(metadata={"example": TAG}) as parent:
        r = parent.run_code(SETUP)
        check(r.error is None, f"setup: {r.error}")
        print(f"parent {parent.id}: {r.value} values loaded")

        children = parent.fork(n=len(SEEDS))
        try:
            with ThreadPoolExecutor(len(children)) as pool:
                results = list(pool.map(lambda c, s: c.run_code(ANSWER.format(seed=s)), children, SEEDS))
            answers = []
            for child, seed, res in zip(children, SEEDS, results):
                check(res.error is None, f"seed {seed}: {res.error}")
                answers.append(eval(res.value))
                print(f"  {child.id}  seed {seed}: {answers[-1]}")
            # The children answered independently: each has its own `seed`, the parent has none.
            seeds_seen = [eval(c.run_code("seed").value) for c in children]
            check(seeds_seen == SEEDS, f"children's seeds {seeds_seen}")
            check(parent.run_code("'seed' in globals()").value == "False", "a child's variable leaked into the parent")
        finally:
            for c in children:
                c.close()

        votes = Counter(answers)
        majority, count = votes.most_common(1)[0]
        print(f"votes: {dict(votes)} -> majority {majority!r} ({count}/{len(answers)})")
        check(count > len(answers) // 2, "no majority")
        # Check the vote against the exact answer, computed on all the data in the parent.
        exact = eval(parent.run_code("v, c = np.unique(data, return_counts=True); str(v[c.argmax()])").value)
        check(majority == exact, f"majority {majority!r} != exact answer {exact!r}")
        parent.run_code(f"answer = {majority!r}")
        print(f"exact answer on all the data: {exact!r} (the vote agrees); stored as `answer` in the parent")

    check_none_left(TAG)
    print("ok: majority vote done, nothing left behind")


if __name__ == "__main__":
    run(main)
