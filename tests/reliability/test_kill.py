"""A pytest run using the fixtures, killed mid-test: SIGKILL, SIGTERM, or a double Ctrl-C. Afterwards no
plugin process lives on, and once the next run has passed nothing is left in the temp dir (no socket,
checkpoint, log or work dir) — a SIGKILLed run cannot clean up, so the next run sweeps what it left."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import default_sigint, wait_until

HOLD = """
import os, time


def test_hold(devplug_plugin, devplug_pod):
    devplug_pod(gpus=1, wait=True)  # a checkpoint and a pod-resources entry exist too
    open(os.environ["DEVPLUG_KILL_MARKER"], "w").write("running")
    time.sleep(120)
"""

QUICK = """
def test_quick(devplug_plugin, devplug_pod):
    assert devplug_plugin.running
    devplug_pod(gpus=1, wait=True)
"""


def plugin_processes(marker: str) -> list[str]:
    """Live processes whose command line mentions ``marker`` (the plugin's dirs are under the run's TMPDIR)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and marker in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(project dir, the runs' TMPDIR): short, so the sim's sockets go under it."""
    tmp = Path(tempfile.mkdtemp(prefix="dpk-", dir="/tmp"))
    (tmp_path / "test_hold.py").write_text(HOLD)
    (tmp_path / "test_quick.py").write_text(QUICK)
    yield tmp_path, tmp
    shutil.rmtree(tmp, ignore_errors=True)


def pytest_run(project: Path, tmp: Path, test_file: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TMPDIR": str(tmp), "DEVPLUG_KILL_MARKER": str(project / "running")}
    return subprocess.Popen(
        default_sigint(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q", test_file]
        ),
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "double SIGINT"])
def test_killed_run_leaves_nothing_and_the_next_run_passes(run_dir: tuple[Path, Path], how: str) -> None:
    project, tmp = run_dir
    proc = pytest_run(project, tmp, "test_hold.py")
    try:
        wait_until(
            "the test to be running", lambda: (project / "running").exists() or proc.poll() is not None, timeout=120
        )
        assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")[-3000:]
        assert plugin_processes(str(tmp)), "no plugin process seen running: the checks below would prove nothing"
        assert any(p.is_socket() for p in tmp.rglob("*")), "no socket seen: the checks below would prove nothing"
        if how == "SIGKILL":
            os.killpg(proc.pid, signal.SIGKILL)
        elif how == "SIGTERM":
            os.killpg(proc.pid, signal.SIGTERM)
        else:  # as a terminal does: the whole foreground group, twice in quick succession
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.3)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)  # a hang fails here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wait_until("every plugin process gone", lambda: not plugin_processes(str(tmp)))
    if how != "SIGKILL":
        assert list(tmp.iterdir()) == [], f"left in TMPDIR after {how}: {list(tmp.rglob('*'))}"
    # The next run passes, and sweeps what a SIGKILLed run had to leave.
    nxt = pytest_run(project, tmp, "test_quick.py")
    out = nxt.communicate(timeout=180)[0].decode(errors="replace")
    assert nxt.returncode == 0, out[-3000:]
    assert list(tmp.iterdir()) == [], f"left in TMPDIR after the next run: {list(tmp.rglob('*'))}"
    assert not plugin_processes(str(tmp))
