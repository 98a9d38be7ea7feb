#!/usr/bin/env python3
"""A chart coming back: the agent's code plots in the sandbox with matplotlib (plt.show(), as in a notebook),
and the figure returns as a PNG in the execution's results, saved locally in one line. A DataFrame comes back
as an HTML table the same way, and display() streams results while the cell still runs.

    PYTHONPATH=sdk/python/src RAMIFY_API_URL=... RAMIFY_API_KEY=... python3 examples/chart.py [chart.png]
"""
import os
import sys
import tempfile

from ramify import Sandbox

from _checks import check, check_none_left, run  # examples/_checks.py: the self-checks, not part of the pattern

TAG = f"chart-{os.getpid()}"

PLOT = """
import numpy as np, pandas as pd, matplotlib.pyplot as plt
rng = np.random.default_rng(7)
sales = pd.DataFrame({"month": pd.period_range("2026-01", periods=12, freq="M").strftime("%b"),
                      "units": rng.integers(80, 160, 12)})
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.bar(sales.month, sales.units, color="tab:blue")
ax.set_title("units sold per month")
plt.show()
sales.describe().T
"""


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(prefix="ramify-chart-"), "chart.png")
    with Sandbox(metadata={"example": TAG}) as sb:
        ex = sb.run_code(PLOT)
        check(ex.error is None, f"plot failed: {ex.error and ex.error.traceback}")
        chart, table = ex.results  # plt.show()'s display_data, then the trailing DataFrame's execute_result
        chart.save(out)  # the PNG, one line
        with open(out, "rb") as f:
            png = f.read()
        check(png.startswith(b"\x89PNG") and len(png) > 5000, f"not a chart: {len(png)} bytes")
        print(f"chart: {chart.type} {chart.formats()} -> {out} ({len(png)} bytes)")
        check(table.type == "execute_result" and "<table" in (table.html or ""), f"table: {table!r}")
        print(f"table: {table.type} {table.formats()}\n{table.text}")

        # Streamed: each display arrives while the cell still runs, before run_code returns.
        seen = []
        ex = sb.run_code("import time\nfor i in range(3):\n    display(f'step {i}')\n    time.sleep(0.2)",
                         on_result=lambda r: seen.append(r.text))
        check(seen == ["'step 0'", "'step 1'", "'step 2'"] and len(ex.results) == 3, f"streamed: {seen}")
        print(f"streamed displays: {seen}")

    check_none_left(TAG)
    print("ok: the chart came back as a PNG, the table as HTML, displays streamed")


if __name__ == "__main__":
    run(main)
