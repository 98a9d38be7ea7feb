"""How the examples check themselves; not an example (scripts/test-examples skips files starting with "_").

Every example labels its sandboxes with metadata {"example": TAG}, raises AssertionError through check() when
a result is wrong, ends by making sure no sandbox with its label is left, and is started with run(main),
which turns a failed check into "FAILED: ..." on stderr and exit status 1.

The examples import it with `from _checks import ...`: `python3 examples/x.py` puts examples/ on sys.path.
"""
import sys

from ramify import Sandbox


def check(cond, msg):
    """Raise AssertionError(msg) unless cond (a plain `assert` would be skipped under python3 -O)."""
    if not cond:
        raise AssertionError(msg)


def check_none_left(tag):
    """Fail if a sandbox labelled {"example": tag} still exists (fork children inherit the label)."""
    left = Sandbox.list(metadata={"example": tag})
    check(not left, f"sandboxes left behind: {[s.id for s in left]}")


def run(main):
    """Call main(); on a failed check print it and exit with status 1."""
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
