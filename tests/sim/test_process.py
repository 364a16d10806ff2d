"""Plugin subprocesses: lifecycle, logs, process groups, and no leaks on exit or SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_devplug.procs import workdir
from pytest_devplug.sim.embeddedplane import EmbeddedPlane
from pytest_devplug.sim.devicemanager import DeviceManager
from pytest_devplug.errors import PluginProcessError, SocketPathTooLongError
from pytest_devplug.procs.process import PluginProcess, live_processes

from ..support import WAIT, default_sigint, short_dir, wait_until

PY = sys.executable


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[..., PluginProcess]]:
    made: list[PluginProcess] = []

    def make(code: str, *args: str) -> PluginProcess:
        p = PluginProcess([PY, "-c", textwrap.dedent(code), *args], log_path=tmp_path / f"p{len(made)}.log")
        made.append(p)
        return p

    yield make
    for p in made:
        if p.running:
            p.stop(timeout=2)


def test_start_log_stop_runs_argv_as_given(procs: Callable[..., PluginProcess]) -> None:
    """Placeholders are the harness's (``PluginSpec.command``): the process runs its argv untouched."""
    p = procs(
        """
        import sys, time
        print("out", sys.argv[1], flush=True)
        print("err", file=sys.stderr, flush=True)
        time.sleep(60)
    """,
        "{plugin_dir}",
    )
    assert p.argv[-1] == "{plugin_dir}"
    assert p.pid is None and not p.running and p.returncode is None
    p.start()
    assert p.running and p in live_processes()
    wait_until("both streams in the log", p.log, lambda t: "out {plugin_dir}" in str(t) and "err" in str(t))
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
    wait_until("TERM handler installed", p.log, lambda t: "\nready" in str(t))
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
    text = wait_until("child pid", p.log, lambda t: "CHILDPID " in str(t))
    child = int(str(text).split("CHILDPID ")[1].split()[0])
    assert alive(child)
    p.stop()
    wait_until(f"child {child} gone", lambda: alive(child), lambda a: a is False)


SCRIPT = """
import sys, time
from pathlib import Path
from pytest_devplug.procs.process import PluginProcess
d = Path(sys.argv[1])
p = PluginProcess([sys.executable, "-c", "import time; time.sleep(60)"], log_path=d / "plugin.log")
p.start()
print(p.pid, flush=True)
if sys.argv[2] == "wait":
    time.sleep(60)
"""


@pytest.mark.parametrize("how", ["exit", "sigterm", "sigint", "sigkill"])
def test_no_leak_when_the_harness_exits_or_is_signalled(tmp_path: Path, how: str) -> None:
    proc = subprocess.Popen(
        default_sigint([PY, "-c", SCRIPT, str(tmp_path), "exit" if how == "exit" else "wait"]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        elif how == "sigint":
            proc.send_signal(signal.SIGINT)
        elif how == "sigkill":  # no handler runs: the parent-death signal takes the plugin along
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=WAIT)  # a hang fails here; a loaded machine may take seconds to stop the plugin first
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_until(f"plugin {pid} gone after harness {how}", lambda: alive(pid), lambda a: a is False)
    if how == "sigterm":
        assert proc.returncode == -signal.SIGTERM  # the previous (default) disposition still applies


def test_unstartable_command_is_a_plugin_process_error(tmp_path: Path) -> None:
    p = PluginProcess([str(tmp_path / "missing-binary")], log_path=tmp_path / "x.log")
    with pytest.raises(PluginProcessError, match="cannot start plugin"):
        p.start()
    assert not p.running and p.stop() is None


HARNESS = """
import signal, sys, time
from pathlib import Path
from pytest_devplug.procs import workdir
from pytest_devplug.procs.process import PluginProcess
if sys.argv[1] == "ignore-sigint":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
d = workdir.create()
p = PluginProcess([sys.executable, "-c", "import time; time.sleep(60)"], log_path=d / "plugin.log")
p.start()
try:
    print(p.pid, d, flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("teardown", flush=True)
    time.sleep(60)  # a teardown that hangs (as a gRPC channel close could)
"""


def start_harness(mode: str, tmp: Path) -> tuple[subprocess.Popen[str], int, Path]:
    proc = subprocess.Popen(
        default_sigint([PY, "-c", HARNESS, mode]),
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert proc.stdout is not None
    pid, work = proc.stdout.readline().split()
    return proc, int(pid), Path(work)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with short_dir("dpp-") as d:
        yield d


RESTART_AFTER_KILL_ALL = """
import sys
from pathlib import Path
from pytest_devplug.procs import process
from pytest_devplug.errors import PluginProcessError
p = process.PluginProcess([sys.executable, "-c", "import time; time.sleep(60)"], log_path=Path(sys.argv[1]) / "p.log")
p.start()
process.kill_all()
try:
    p.start()
except PluginProcessError as exc:
    print("refused:", exc)
"""


def test_no_plugin_starts_once_the_run_is_ending(short_tmp: Path) -> None:
    """After the signal path killed the plugins, a supervisor's immediate restart is refused: it would run the
    plugin again and re-create its dirs after the work dir was removed."""
    done = subprocess.run(
        [PY, "-c", RESTART_AFTER_KILL_ALL, str(short_tmp)], capture_output=True, text=True, timeout=60
    )
    assert "refused: not starting" in done.stdout and "the run is ending" in done.stdout, done.stdout + done.stderr


def test_sigterm_removes_the_work_dir_and_the_plugins(short_tmp: Path) -> None:
    proc, pid, work = start_harness("plain", short_tmp)
    try:
        assert work.parent == short_tmp and (work / "plugin.log").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_until(f"plugin {pid} gone", lambda: alive(pid), lambda a: a is False)
    assert not work.exists()


def test_second_sigint_during_teardown_exits_at_once_and_cleans_up(short_tmp: Path) -> None:
    proc, pid, work = start_harness("plain", short_tmp)
    try:
        assert proc.stdout is not None
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "teardown"
        wait_until(f"plugin {pid} killed by the first SIGINT", lambda: alive(pid), lambda a: a is False)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 128 + signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not work.exists()


def test_ignored_sigint_stays_ignored(short_tmp: Path) -> None:
    """pytest in the background of a script (SIGINT ignored): a SIGINT must not kill the plugins."""
    proc, pid, work = start_harness("ignore-sigint", short_tmp)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None and alive(pid)  # no handler replaced SIG_IGN
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    wait_until(f"plugin {pid} gone", lambda: alive(pid), lambda a: a is False)


def test_sweep_removes_only_dirs_whose_owner_is_provably_gone(short_tmp: Path) -> None:
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    me = os.getpid()
    start = open(f"/proc/{me}/stat").read().rsplit(")", 1)[1].split()[19]
    dirs = {}
    for name, record in {
        "dead": f"{dead.pid} 12345",  # that pid has exited
        "reused": f"{me} {int(start) + 1}",  # a live pid, but started at another time: not the owner
        "live": f"{me} {start}",
        "garbled": "not a record",
    }.items():
        d = short_tmp / f"devplug-{name}"
        (d / "c").mkdir(parents=True)
        (d / workdir.OWNER_FILE).write_text(record)
        dirs[name] = d
    unowned = short_tmp / "devplug-unowned"
    unowned.mkdir()
    removed = workdir.sweep(short_tmp)
    assert sorted(p.name for p in removed) == ["devplug-dead", "devplug-reused"]
    assert [p.name for p in sorted(short_tmp.iterdir())] == ["devplug-garbled", "devplug-live", "devplug-unowned"]


def test_work_dir_after_a_crash_is_swept_by_the_next_run(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    proc, pid, work = start_harness("plain", short_tmp)
    proc.kill()
    proc.wait()
    wait_until(f"plugin {pid} gone", lambda: alive(pid), lambda a: a is False)
    assert work.exists()  # a SIGKILLed run cannot clean up after itself...
    mine = workdir.create()
    try:
        assert not work.exists()  # ...the next one does
        assert mine.parent == short_tmp and mine.exists()
    finally:
        workdir.remove(mine)


GRANDCHILD_HARNESS = """
import sys, time
from pytest_devplug.procs import workdir
from pytest_devplug.procs.process import PluginProcess
d = workdir.create()
code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print('CHILD', c.pid, flush=True); time.sleep(120)")
p = PluginProcess([sys.executable, "-c", code], log_path=d / "plugin.log")
p.start()
while "CHILD " not in p.log():
    time.sleep(0.05)
print(p.pid, p.log().split("CHILD ")[1].split()[0], d, flush=True)
time.sleep(120)
"""


def test_next_run_kills_what_a_killed_runs_plugin_left(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The death signal reaches the plugin, not the plugin's own children: the next run's sweep does."""
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    proc = subprocess.Popen(
        [PY, "-c", GRANDCHILD_HARNESS], stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(short_tmp)}
    )
    assert proc.stdout is not None
    plugin, child, work = proc.stdout.readline().split()
    proc.kill()
    proc.wait()
    wait_until(f"plugin {plugin} gone", lambda: alive(int(plugin)), lambda a: a is False)
    try:
        assert alive(int(child))  # the plugin's child outlived the run...
        mine = workdir.create()
        wait_until(f"plugin child {child} gone", lambda: alive(int(child)), lambda a: a is False)  # ...not the sweep
        assert not Path(work).exists()
        workdir.remove(mine)
    finally:
        if alive(int(child)):
            os.kill(int(child), signal.SIGKILL)


def test_long_temp_dir_still_gives_working_sockets(monkeypatch: pytest.MonkeyPatch, short_tmp: Path) -> None:
    long_tmp = short_tmp / ("x" * 90)
    long_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_tmp))
    assert workdir.base_dir() == Path("/tmp")
    with EmbeddedPlane() as cluster:
        assert len(str(cluster.workdir)) < 40
        node = cluster.add_node("n1")
        assert (node.plugin_dir / "kubelet.sock").is_socket()


def test_too_long_socket_path_is_a_clear_error(short_tmp: Path) -> None:
    deep = short_tmp / ("d" * 100)
    deep.mkdir()
    with pytest.raises(SocketPathTooLongError) as info:
        DeviceManager(deep).start()
    msg = str(info.value)
    assert str(deep / "kubelet.sock") in msg and "107-byte limit" in msg
