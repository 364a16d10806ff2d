"""The real control plane's targets (issue 19): ready < 5 s, memory < 600 MiB, and the conformance suite on
``sim`` + ``real`` in < 2x its time on ``sim`` + ``embedded``.

    python bench/bench_controlplane.py [--runs 5] [--no-conformance]

"Ready" is ``ControlPlane.start()`` returning: etcd and the API server answer their health checks, the
scheduler and controller manager theirs, and the default ServiceAccount exists (pods are admitted). Memory is
the sum of the four components' resident set sizes (VmRSS) after start and after the conformance run.
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pytest_devplug.controlplane import ControlPlane, resolve

READY_TARGET_S = 5.0
MEMORY_TARGET_MIB = 600.0
CONFORMANCE_RATIO_TARGET = 2.0


def rss_mib(pids: dict[str, int]) -> float:
    total_kib = 0
    for pid in pids.values():
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


def conformance(control_plane: str) -> tuple[float, str]:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "pytest_devplug.cli", "conformance", "--control-plane", control_plane, "--", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    summary = (out.stdout.strip().splitlines() or ["(no output)"])[-1]
    return time.monotonic() - t0, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-conformance", action="store_true")
    args = ap.parse_args()
    found = resolve(download=False)
    print(f"binaries: {found.describe()}")
    ready: list[float] = []
    memory: list[float] = []
    for _ in range(args.runs):
        with ControlPlane(found) as cp:
            ready.append(cp.startup_seconds)
            time.sleep(2)  # settle: the controllers' first sync
            memory.append(rss_mib(cp.pids()))
    ok = True
    med = statistics.median(ready)
    print(f"ready: median {med:.2f} s, runs {', '.join(f'{r:.2f}' for r in ready)} (target < {READY_TARGET_S:g} s)")
    ok &= med < READY_TARGET_S
    mem = max(memory)
    print(
        f"memory (4 components, RSS after start): max {mem:.0f} MiB, "
        f"runs {', '.join(f'{m:.0f}' for m in memory)} (target < {MEMORY_TARGET_MIB:g} MiB)"
    )
    ok &= mem < MEMORY_TARGET_MIB
    if not args.no_conformance:
        emb, emb_summary = conformance("embedded")
        real, real_summary = conformance("real")
        ratio = real / emb
        print(f"conformance sim+embedded: {emb:.1f} s ({emb_summary})")
        print(f"conformance sim+real:     {real:.1f} s ({real_summary})")
        print(f"ratio {ratio:.2f} (target < {CONFORMANCE_RATIO_TARGET:g})")
        ok &= ratio < CONFORMANCE_RATIO_TARGET
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
