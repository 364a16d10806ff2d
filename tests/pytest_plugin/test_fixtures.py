"""The fixtures on the included GPU plugin: isolation between tests, evidence on failure, Ctrl-C cleanup."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ..support import default_sigint

pytest_plugins = ["pytester"]


def test_faults_do_not_leak_into_the_next_test(pytester: pytest.Pytester) -> None:
    """A test that breaks GPUs and stops the plugin leaves the next one a clean, fully healthy plugin."""
    pytester.makepyfile(
        """
        import pytest
        from pytest_devplug import assert_allocatable

        def test_break_things(devplug_plugin, devplug_pod):
            devplug_pod(gpus=1, wait=True)
            devplug_plugin.mock.inject_xid(devplug_plugin.mock.uuids[0])
            devplug_plugin.mock.fail_allocate(devplug_plugin.mock.uuids[1])
            assert_allocatable(devplug_plugin, 3, capacity=4)
            devplug_plugin.stop()
            assert_allocatable(devplug_plugin, 0, capacity=4)

        def test_next_one_is_clean(devplug_plugin, devplug_pod, devplug_node):
            assert devplug_plugin.running
            assert devplug_node.counts("nvidia.com/gpu") == (4, 4)
            assert devplug_node.pod_resources() == []  # the earlier test's pod is gone
            state = devplug_plugin.mock.state
            assert state["events"] == [] and not any(g["fail_allocate"] or g["lost"] for g in state["gpus"])
            assert len(devplug_pod(gpus=4, wait=True).allocated_devices) == 4
        """
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120).assert_outcomes(passed=2)


def test_failures_carry_evidence_sections(pytester: pytest.Pytester) -> None:
    """Helper failures say expected/seen and attach plugin log, kubelet log, node status, events, checkpoint;
    a plain assert in a devplug test gets the same sections."""
    pytester.makepyfile(
        """
        from pytest_devplug import assert_allocatable

        def test_helper_fails(devplug_plugin, devplug_pod):
            devplug_pod(gpus=1, wait=True)
            assert_allocatable(devplug_plugin, 99, timeout=0.3)

        def test_plain_assert_fails(devplug_plugin, devplug_pod):
            pod = devplug_pod(gpus=1, wait=True)
            assert pod.phase == "Pending"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["E *expected nvidia.com/gpu on node devplug-node: allocatable 99; saw (capacity, allocatable) = (4, 4)*"]
    )
    out = result.stdout.str()
    for title in ("node status", "plugin log", "kubelet log", "checkpoint"):
        assert out.count(f" devplug: {title} ") == 2, title  # once per failed test
    assert out.count(" devplug: pod events ") == 2
    assert "ListAndWatch" in out  # the GPU plugin's own log lines are in the section


def _leftover_processes(sid: int, marker: str) -> list[str]:
    """Live processes of session ``sid``, or whose command line mentions ``marker`` (plugins run in
    sessions of their own, with ``--plugin-dir`` under the run's temp dir)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z" and (int(fields[3]) == sid or marker in cmdline):
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_an_ability_the_backend_lacks_is_a_skip_quoting_why(pytester: pytest.Pytester) -> None:
    """UnsupportedOperationError (sim answers only some exec commands) gives no verdict on the plugin."""
    pytester.makepyfile(
        test_a="""
        def test_uname(devplug_pod):
            devplug_pod(count=1, wait=True).exec("uname", "-a")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", timeout=120)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*test_uname: *uname*"])


def test_ctrl_c_leaves_no_process_socket_or_temp_dir(tmp_path: Path) -> None:
    """Interrupt ``devplug conformance`` mid-run (SIGINT to its process group, as a terminal does)."""
    tmp = Path(tempfile.mkdtemp(prefix="dpc-", dir="/tmp"))  # short: Unix socket paths live under it
    devplug = os.path.join(os.path.dirname(sys.executable), "devplug")
    proc = subprocess.Popen(
        default_sigint([devplug, "conformance", "--", "-v", "-p", "no:randomly"]),
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    seen, deadline = b"", time.monotonic() + 60
    try:
        while b"PASSED" not in seen and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 1)[0]:
                seen += os.read(proc.stdout.fileno(), 65536)
        assert b"PASSED" in seen, seen.decode(errors="replace")[-3000:]
        assert _leftover_processes(-1, str(tmp)), "no plugin process seen running: the check below would prove nothing"
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = _leftover_processes(proc.pid, str(tmp))
    assert left == [], f"processes left behind: {left}"
    leftovers = list(tmp.rglob("*"))
    tmp.rmdir()
    assert leftovers == [], f"left in TMPDIR: {leftovers}"
