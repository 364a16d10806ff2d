"""Move each release rule of ``kubeletmodel/releases.py`` by one release, one move at a time, and list the behaviour
tests that catch it.

For every rule in ``RULES`` the moves are: one minor earlier, one minor later, one patch either way where the rule
came in a patch release, and off at the default release. Each move runs the release-rule behaviour tests
(``tests/sim/test_release_rules.py``, less the test that compares the tests' releases with the table, which reads
the table and is no behaviour test) with the rule moved, in a pytest process of its own; a move is caught when at
least one of them fails. Exit status 1 when a move is caught by none.

    python tools/rule_mutants.py                      # every rule, every move
    python tools/rule_mutants.py endpoint-per-socket  # one rule
    python tools/rule_mutants.py --tests tests/sim    # more tests than the default

The same file is the pytest plugin that makes the move inside that process (``-p rule_mutants``, the move in
``DEVPLUG_RULE_MUTANT=<rule>=<first tag>``): the table is edited in memory, as editing the file would.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = "DEVPLUG_RULE_MUTANT"
DEFAULT_TESTS = ["tests/sim/test_release_rules.py"]
#: Reads the table itself: it catches every move by construction, so it does not count.
NOT_BEHAVIOUR = "test_every_rule_is_judged_here_at_its_release"
OFF = "v1.99.0"


def pytest_configure(config: pytest.Config) -> None:
    """Apply the move named in ``DEVPLUG_RULE_MUTANT`` to ``RULES`` before any test runs."""
    move = os.environ.get(ENV)
    if not move:
        return
    from pytest_devplug.kubeletmodel.releases import RULES

    name, _, tag = move.partition("=")
    if name not in RULES:
        raise pytest.UsageError(f"{ENV}={move}: no rule {name!r}; known: {', '.join(RULES)}")
    RULES[name] = dataclasses.replace(RULES[name], first_in=(tag,))


def moves(first_in: tuple[str, ...], lowest: int, default: int) -> list[tuple[str, str]]:
    """(what, the rule's new first tag) for each move of a rule first in ``first_in[0]``."""
    minor, patch = (int(x) for x in re.fullmatch(r"v1\.(\d+)\.(\d+)", first_in[0]).groups())  # type: ignore[union-attr]
    out = []
    if minor - 1 >= lowest:
        out.append((f"one minor earlier (1.{minor - 1})", f"v1.{minor - 1}.0"))
    out.append((f"one minor later (1.{minor + 1})", f"v1.{minor + 1}.0"))
    if patch:
        out.append((f"one patch earlier (1.{minor}.{patch - 1})", f"v1.{minor}.{patch - 1}"))
        out.append((f"one patch later (1.{minor}.{patch + 1})", f"v1.{minor}.{patch + 1}"))
    if minor <= default:
        out.append((f"off at the default release (1.{default})", OFF))
    return out


def caught_by(rule: str, tag: str, tests: list[str]) -> tuple[list[str], str]:
    """The behaviour tests that fail with ``rule`` first in ``tag``, and the run's last line."""
    env = dict(os.environ, **{ENV: f"{rule}={tag}"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tools"), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "pytest", "-p", "rule_mutants", "-p", "no:cacheprovider", "-q", "--tb=no", "-rf"]
    argv += ["-k", f"not {NOT_BEHAVIOUR}", *tests]
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    failed = sorted({line.split()[1] for line in run.stdout.splitlines() if line.startswith("FAILED ")})
    last = (run.stdout.strip().splitlines() or [run.stderr.strip()])[-1]
    if run.returncode not in (0, 1):  # 2+: interrupted, a usage or collection error: no verdict
        raise SystemExit(f"{rule} moved to {tag}: pytest exited {run.returncode}: {last}\n{run.stderr[-2000:]}")
    return failed, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rules", nargs="*", help="rule names (default: every rule)")
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS, help="test paths to run for each move")
    args = parser.parse_args(argv)
    from pytest_devplug.kubeletmodel.releases import DEFAULT_VERSION, RULES, releases

    unknown = sorted(set(args.rules) - set(RULES))
    if unknown:
        parser.error(f"no rule {', '.join(unknown)}; known: {', '.join(RULES)}")
    lowest = min(r.number for r in releases().values())
    default = int(DEFAULT_VERSION.split(".")[1])
    uncaught = []
    for name in args.rules or list(RULES):
        rule = RULES[name]
        print(f"{name} (first in {', '.join(rule.first_in)}; {rule.change})", flush=True)
        for what, tag in moves(rule.first_in, lowest, default):
            started = time.monotonic()
            failed, last = caught_by(name, tag, args.tests)
            took = time.monotonic() - started
            print(f"  {what}: {'caught by ' + str(len(failed)) if failed else 'NOT CAUGHT'} ({last}; {took:.0f} s)")
            for test in failed:
                print(f"    {test}")
            if not failed:
                uncaught.append(f"{name} {what}")
    print("every move caught" if not uncaught else "not caught: " + "; ".join(uncaught))
    return 1 if uncaught else 0


if __name__ == "__main__":
    sys.exit(main())
