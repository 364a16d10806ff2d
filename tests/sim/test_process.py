"""Plugin subprocesses: lifecycle, logs, process groups, and no leaks on exit or SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_devplug.sim.errors import PluginProcessError
from pytest_devplug.sim.process import PluginProcess, live_processes

PY = sys.executable


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(what: str, probe: Callable[[], object], ok: Callable[[object], bool], timeout: float = 10.0) -> object:
    deadline = time.monotonic() + timeout
    seen = probe()
    while not ok(seen):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last seen: {seen!r}")
        time.sleep(0.05)
        seen = probe()
    return seen


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[..., PluginProcess]]:
    made: list[PluginProcess] = []

    def make(code: str, *args: str) -> PluginProcess:
        p = PluginProcess([PY, "-c", textwrap.dedent(code), *args], plugin_dir=tmp_path / "dp",
                          log_path=tmp_path / f"p{len(made)}.log")
        made.append(p)
        return p

    yield make
    for p in made:
        if p.running:
            p.stop(timeout=2)


def test_start_log_stop_and_placeholder(procs: Callable[..., PluginProcess], tmp_path: Path) -> None:
    p = procs("""
        import sys, time
        print("out", sys.argv[1], flush=True)
        print("err", file=sys.stderr, flush=True)
        time.sleep(60)
    """, "{plugin_dir}")
    assert p.argv[-1] == str(tmp_path / "dp")
    assert p.pid is None and not p.running and p.returncode is None
    p.start()
    assert p.running and p in live_processes()
    wait_for("both streams in the log", p.log, lambda t: f"out {tmp_path / 'dp'}" in str(t) and "err" in str(t))
    with pytest.raises(PluginProcessError, match="already running"):
        p.start()
    assert p.stop() == -signal.SIGTERM
    assert not p.running and p.returncode == -signal.SIGTERM
    assert p not in live_processes()


def test_stop_escalates_to_sigkill(procs: Callable[..., PluginProcess]) -> None:
    p = procs("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("rea" + "dy", flush=True)  # split so that the start header cannot match
        time.sleep(60)
    """)
    p.start()
    wait_for("TERM handler installed", p.log, lambda t: "\nready" in str(t))
    assert p.stop(timeout=0.5) == -signal.SIGKILL


def test_kill_wait_restart(procs: Callable[..., PluginProcess]) -> None:
    p = procs("import time; time.sleep(60)")
    p.start()
    first = p.pid
    assert p.wait(timeout=0.1) is None
    p.kill(signal.SIGKILL)
    assert p.wait(timeout=5) == -signal.SIGKILL
    p.restart()
    assert p.running and p.pid != first
    assert p.log().count("--- start:") == 2


def test_stop_kills_the_whole_process_group(procs: Callable[..., PluginProcess]) -> None:
    p = procs("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("CHILD" + "PID", child.pid, flush=True)
        time.sleep(60)
    """)
    p.start()
    text = wait_for("child pid", p.log, lambda t: "CHILDPID " in str(t))
    child = int(str(text).split("CHILDPID ")[1].split()[0])
    assert alive(child)
    p.stop()
    wait_for(f"child {child} gone", lambda: alive(child), lambda a: a is False)


SCRIPT = """
import sys, time
from pathlib import Path
from pytest_devplug.sim.process import PluginProcess
d = Path(sys.argv[1])
p = PluginProcess([sys.executable, "-c", "import time; time.sleep(60)"], plugin_dir=d, log_path=d / "plugin.log")
p.start()
print(p.pid, flush=True)
if sys.argv[2] == "wait":
    time.sleep(60)
"""


@pytest.mark.parametrize("how", ["exit", "sigterm", "sigint"])
def test_no_leak_when_the_harness_exits_or_is_signalled(tmp_path: Path, how: str) -> None:
    proc = subprocess.Popen([PY, "-c", SCRIPT, str(tmp_path), "exit" if how == "exit" else "wait"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        elif how == "sigint":
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_for(f"plugin {pid} gone after harness {how}", lambda: alive(pid), lambda a: a is False)
    if how == "sigterm":
        assert proc.returncode == -signal.SIGTERM  # the previous (default) disposition still applies


def test_unstartable_command_is_a_plugin_process_error(tmp_path: Path) -> None:
    p = PluginProcess([str(tmp_path / "missing-binary")], plugin_dir=tmp_path, log_path=tmp_path / "x.log")
    with pytest.raises(PluginProcessError, match="cannot start plugin"):
        p.start()
    assert not p.running and p.stop() is None
