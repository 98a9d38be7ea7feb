#!/usr/bin/env python3
"""A template reused: prepare a sandbox once (import pandas, load a data set, fit a small model), save it as a
template, and start several sandboxes from it, each with the data and the model already in its interpreter
and its files on disk, so each task starts where the preparation left off instead of redoing it.

    PYTHONPATH=sdk/python/src RAMIFY_API_URL=... RAMIFY_API_KEY=... python3 examples/template_reuse.py
"""
import os
import time

from ramify import NotFound, Sandbox

from _checks import check, check_none_left, run  # examples/_checks.py: the self-checks, not part of the pattern

TAG = f"template-{os.getpid()}"
NAME = f"example-prepared-{os.getpid()}"

PREPARE = """
import numpy as np, pandas as pd
rng = np.random.default_rng(0)
df = pd.DataFrame({"x": rng.normal(size=200_000)})
df["y"] = 3 * df.x + 1 + rng.normal(scale=0.1, size=len(df))
slope, intercept = np.polyfit(df.x, df.y, 1)          # the "model", fitted once
df.to_csv("/root/data.csv", index=False)               # and a file on disk
"""

# Each task uses what the preparation left: the fitted model, the data frame, the file.
TASKS = [("round(float(slope * 10 + intercept))", "31"), ("round(float(df.y.mean()))", "1"),
         ("len(pd.read_csv('/root/data.csv'))", "200000")]


def main():
    with Sandbox(metadata={"example": TAG}) as prep:
        ex = prep.run_code(PREPARE)
        check(ex.error is None, f"prepare failed: {ex.error and ex.error.traceback}")
        t = prep.save_template(NAME)  # prep keeps running
        print(f"template {t['name']}: {t['size'] / 1e6:.1f} MB, capture held the sandbox {t['capture_ms']:.0f} ms")
    try:
        for task, want in TASKS:
            start = time.monotonic()
            with Sandbox(template=NAME, metadata={"example": TAG}) as sb:  # a new sandbox, prepared state in it
                took = time.monotonic() - start
                ex = sb.run_code(task)
                check(ex.error is None and ex.value == want, f"{task}: {ex.value} {ex.error and ex.error.traceback}")
                print(f"{sb.id} (started in {took:.2f} s): {task} = {ex.value}")
    finally:
        Sandbox.delete_template(NAME)
    try:
        Sandbox.get_template(NAME)
        check(False, "the template is still there after delete_template")
    except NotFound:
        pass
    check_none_left(TAG)
    print("ok: three sandboxes started from one prepared template")


if __name__ == "__main__":
    run(main)
