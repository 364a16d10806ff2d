"""Peer plugins on the embedded kubelet: how long each takes to register again after a kubelet restart.

    python bench/bench_peers.py [--runs 3]

Each peer (built or found cached by peers/build.sh) runs with its plain command line, so in the
node's private mount namespace at the kubelet's standard paths; the time is from `restart_kubelet()`
returning (the resource at 0) to its allocatable count back. Not a test: numbers are printed, not
asserted. Build times are measured by hand (see bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pytest_devplug.sim.embeddedplane import EmbeddedPlane

ROOT = Path(__file__).resolve().parents[1]
#: peer -> (resource, device count)
PEERS = {"sample-device-plugin": ("example.com/resource", 2), "stub-plugin": ("example.com/stub", 4)}


def build(name: str) -> str:
    out = subprocess.run(["bash", str(ROOT / "peers" / "build.sh"), name], capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


def wait_allocatable(c: EmbeddedPlane, resource: str, want: int, timeout: float) -> float:
    """Polls (1 ms) until the node's allocatable for ``resource`` is ``want``; the monotonic time it was."""
    deadline = time.monotonic() + timeout
    while c.get_node("node-1")["status"]["allocatable"].get(resource) != str(want):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{resource}: allocatable not {want} after {timeout}s")
        time.sleep(0.001)
    return time.monotonic()


def measure(name: str, runs: int) -> list[float]:
    resource, count = PEERS[name]
    binary = build(name)
    times = []
    with EmbeddedPlane(grace_period=300.0) as c:
        node = c.add_node("node-1")
        node.start_plugin([binary], standard_paths=True)
        wait_allocatable(c, resource, count, 30.0)
        for _ in range(runs):
            node.restart_kubelet()
            t0 = time.monotonic()
            times.append(wait_allocatable(c, resource, count, 60.0) - t0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for name in PEERS:
        times = measure(name, args.runs)
        runs = ", ".join(f"{t:.2f}" for t in times)
        print(f"{name}: kubelet restart -> re-registered: median {statistics.median(times):.2f} s (runs: {runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
