"""Peer builds nothing used for two weeks leave the cache (``prune_unused`` of ``kind-config/offline/lib.sh``, run at
the end of every ``peers/build*.sh``): every change to a build script names new builds, and the old ones would
otherwise stay forever."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "kind-config" / "offline" / "lib.sh"
DAY = 24 * 3600


def _build(peers: Path, name: str, unused_days: float | None) -> None:
    """A build directory with its lock file; ``unused_days`` None: unfinished (no ``bin/.complete``)."""
    (peers / name / "bin").mkdir(parents=True)
    (peers / f"{name}.lock").touch()
    if unused_days is not None:
        complete = peers / name / "bin" / ".complete"
        complete.touch()
        then = time.time() - unused_days * DAY
        os.utime(complete, (then, then))


def test_builds_unused_for_two_weeks_are_pruned_with_their_locks(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    _build(peers, "stub-plugin-v1.36.3-aaaaaaaaaaaa", 15)
    _build(peers, "stub-plugin-v1.37.2-bbbbbbbbbbbb", 1)
    _build(peers, "gpu-kubelet-plugin-cccccccccccc", None)  # being built, or failed: its own run handles it
    _build(peers, "sriovdp-dddddddddddd", 30)  # held by a concurrent run
    with (peers / "sriovdp-dddddddddddd.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        run = subprocess.run(
            ["bash", "-c", f'. "{LIB}"; prune_unused "$1"', "prune", str(peers)],
            env={**os.environ, "DEVPLUG_CACHE_DIR": str(tmp_path / "cache")},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in peers.iterdir()) == [
        "gpu-kubelet-plugin-cccccccccccc",
        "gpu-kubelet-plugin-cccccccccccc.lock",
        "sriovdp-dddddddddddd",
        "sriovdp-dddddddddddd.lock",
        "stub-plugin-v1.37.2-bbbbbbbbbbbb",
        "stub-plugin-v1.37.2-bbbbbbbbbbbb.lock",
    ]
    assert "pruned" in run.stderr and "stub-plugin-v1.36.3-aaaaaaaaaaaa (unused for over 14 days)" in run.stderr
