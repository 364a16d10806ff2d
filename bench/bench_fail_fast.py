"""Fail-fast benchmark: how long the conformance suite takes to fail a broken plugin.

    python bench/bench_fail_fast.py [--runs 3]

Runs ``devplug conformance`` (embedded kubelet) against ``tests/fixture_plugins/widget.py`` broken two
ways — ``Allocate`` answering with no container responses, and a plugin that exits at start — and
prints the wall time of each whole command (interpreter start to exit) with pytest's summary line.
Targets (issue 9.7): < 60 s and < 15 s. Not a test: numbers are printed, not asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

WIDGET = Path(__file__).resolve().parents[1] / "tests" / "fixture_plugins" / "widget.py"
CASES = {"allocate-empty": 60.0, "exit-at-start": 15.0}


def run(fault: str) -> tuple[float, str]:
    devplug = os.path.join(os.path.dirname(sys.executable), "devplug")
    cmd = [
        devplug,
        "conformance",
        "--plugin-cmd",
        f"{{python}} {WIDGET} --plugin-dir {{plugin_dir}} --fault {fault}",
        "--resource-name",
        "example.com/widget",
        "--",
        "-q",
        "-p",
        "no:randomly",
    ]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - start
    summary = [ln.strip("= ") for ln in done.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    return elapsed, summary[-1] if summary else f"no summary (exit {done.returncode}): {done.stderr[-300:]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}")
    print("| plugin fault | median | runs (s) | pytest summary | target |")
    print("|---|---|---|---|---|")
    for fault, target in CASES.items():
        results = [run(fault) for _ in range(args.runs)]
        times = [t for t, _ in results]
        print(
            f"| `{fault}` | {statistics.median(times):.1f} s | {', '.join(f'{t:.1f}' for t in times)} | "
            f"{results[-1][1]} | < {target:g} s |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
