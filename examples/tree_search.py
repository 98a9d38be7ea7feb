#!/usr/bin/env python3
"""Tree search: load a data set once, fork 5 children that each test a different hypothesis,
keep the best-scoring branch (merge_into the parent) and close the rest.

    PYTHONPATH=sdk/python/src RAMIFY_API_URL=... RAMIFY_API_KEY=... python3 examples/tree_search.py
"""
import os
import random
from concurrent.futures import ThreadPoolExecutor

from ramify import Sandbox, SandboxDefunct, SandboxNotFound

from _checks import check, check_none_left, run  # examples/_checks.py: the self-checks, not part of the pattern

TAG = f"tree_search-{os.getpid()}"   # metadata label; fork children inherit it

# Five hypotheses about what drives revenue. Each child runs one; `score` (0..1) is how much of the
# revenue's variance the hypothesis explains.
PLANS = {
    "price":         "x = df['price']",
    "units":         "x = df['units']",
    "discount":      "x = df['discount']",
    "region":        "x = df.groupby('region')['revenue'].transform('mean')",
    "price x units": "x = df['price'] * df['units']",
}
SCORE = """
r = float(np.corrcoef(x, df['revenue'])[0, 1])
score = r * r
with open('/root/finding.txt', 'w') as f:
    f.write(f'{plan}: r^2 = {score:.3f}\\n')
score
"""


def make_csv(rows=300, seed=7):
    rnd = random.Random(seed)
    lines = ["region,price,units,discount,revenue"]
    for _ in range(rows):
        region = rnd.choice(["north", "south", "east", "west"])
        price = round(rnd.uniform(5, 50), 2)
        units = rnd.randint(1, 40)
        discount = round(rnd.uniform(0, 0.3), 2)
        revenue = round(price * units * (1 - discount) + rnd.gauss(0, 5), 2)
        lines.append(f"{region},{price},{units},{discount},{revenue}")
    return "\n".join(lines) + "\n"


def main():
    with Sandbox(metadata={"example": TAG}) as parent:
        parent.files.write("/root/data/sales.csv", make_csv())
        r = parent.run_code("import numpy as np, pandas as pd\n"
                            "df = pd.read_csv('/root/data/sales.csv')\nlen(df)")
        check(r.error is None, f"load failed: {r.error}")
        print(f"parent {parent.id}: loaded {r.value} rows into df")

        children = parent.fork(n=len(PLANS))
        print(f"forked {len(children)} children: " + ", ".join(c.id for c in children))
        try:
            def explore(child, name, code):
                return child.run_code(f"plan = {name!r}\n{code}\n{SCORE}")

            with ThreadPoolExecutor(len(children)) as pool:
                results = list(pool.map(explore, children, PLANS, PLANS.values()))
            scores = {}
            for child, name, res in zip(children, PLANS, results):
                check(res.error is None, f"{name}: {res.error}")
                scores[name] = float(res.value)
                check(0.0 <= scores[name] <= 1.0, f"{name}: score {scores[name]} out of range")
                print(f"  {child.id}  {name:<14} r^2 = {scores[name]:.3f}")

            best = max(scores, key=scores.get)
            winner = children[list(PLANS).index(best)]
            check(best == "price x units", f"expected 'price x units' to win, got {best!r}")
            d = parent.diff(winner)
            check(d.get("added") == ["/root/finding.txt"], f"unexpected diff {d}")
            print(f"best: {best!r} ({winner.id}); diff parent -> winner: {d}")

            parent.merge_into(winner)
            print(f"merged {winner.id} into {parent.id}")
        finally:
            for c in children:
                c.close()          # no-op for the merged winner
        print(f"closed the other {len(children) - 1} children")

        # The parent's id now drives the winner's interpreter and files.
        r = parent.run_code("plan, round(score, 3), len(df)")
        check(r.error is None and eval(r.value) == (best, round(scores[best], 3), 300), f"parent state: {r}")
        check(parent.files.read_text("/root/finding.txt").startswith(best), "finding.txt not merged")
        check(winner.defunct, "winner should be defunct after the merge")
        try:
            winner.run_code("1")
            check(False, "the winner's object should refuse calls")
        except SandboxDefunct:
            pass
        for c in children:
            if c is not winner:
                try:
                    Sandbox.connect(c.id)
                    check(False, f"{c.id} still exists")
                except SandboxNotFound:
                    pass
        print(f"parent now holds plan={best!r}: {parent.files.read_text('/root/finding.txt').strip()}")

    check_none_left(TAG)
    print("ok: tree search done, nothing left behind")


if __name__ == "__main__":
    run(main)
