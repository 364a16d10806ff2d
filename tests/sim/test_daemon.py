"""Plugins restarted as the kubelet restarts a DaemonSet pod's container: upstream's back-off sequence, no
restart while the kubelet is down or after the harness stopped the plugin, a crash loop reported as such."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.procs.process import PluginProcess
from pytest_devplug.sim.daemon import KUBELET_BACKOFF, BackOffPolicy, CrashBackOff, PluginDaemon

from ..support import wait_until

#: Exits at once with status 3, saying why first.
CRASHER = [
    sys.executable,
    "-c",
    "import sys; print('F0101 00:00:00.000000 1 main.go:1] no GPUs found', flush=True); sys.exit(3)",
]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_backoff_follows_the_kubelets_sequence() -> None:
    """First exit restarted at once; then 10, 20, 40 ... s after each exit, capped at 300 s."""
    b = CrashBackOff(KUBELET_BACKOFF)
    t = 1000.0
    assert not b.in_backoff_since(t, t) and b.due(t) == t
    b.next(t, t)  # restart 1, at once
    waits = []
    for _ in range(8):
        t += 1.0  # it ran one second, then exited
        assert b.in_backoff_since(t, t) and b.in_backoff_since(t, t + b.delay - 0.01)  # type: ignore[operator]
        assert not b.in_backoff_since(t, t + b.delay)  # type: ignore[operator]
        waits.append(b.due(t) - t)
        t = b.due(t)
        b.next(t - (b.delay or 0), t)
    assert waits == [10, 20, 40, 80, 160, 300, 300, 300]


def test_backoff_starts_over_after_a_run_of_ten_minutes() -> None:
    b = CrashBackOff(KUBELET_BACKOFF)
    b.next(0.0, 0.0)
    b.next(1.0, 11.0)  # two quick exits: 20 s owed by the next
    assert b.delay == 20
    assert b.in_backoff_since(11.0 + 600.0, 11.0 + 600.5)  # ran exactly 600 s: not more than that
    finished = 11.0 + 600.5
    assert not b.in_backoff_since(finished, finished) and b.due(finished) == finished
    b.next(finished, finished)
    assert b.delay == 10


class Kubelet:
    """Stands for the node's kubelet: a new object on every start, ``None`` while down."""

    def __init__(self) -> None:
        self.instance: object | None = object()

    def __call__(self) -> object | None:
        return self.instance

    def restart(self) -> None:
        self.instance = object()


@pytest.fixture
def kubelet() -> Kubelet:
    return Kubelet()


@pytest.fixture
def daemons() -> Iterator[list[PluginDaemon]]:
    made: list[PluginDaemon] = []
    yield made
    for d in made:
        d.stop(timeout=2)


def daemon(
    made: list[PluginDaemon], tmp_path: Path, kubelet: Kubelet, argv: list[str], policy: BackOffPolicy
) -> PluginDaemon:
    proc = PluginProcess(argv, log_path=tmp_path / f"p{len(made)}.log")
    d = PluginDaemon(
        proc, name=f"p{len(made)}", kubelet=kubelet, logger=logging.getLogger("test-daemon"), policy=policy, relist=0.02
    )
    made.append(d)
    d.start()
    return d


def test_a_crash_loop_is_restarted_with_back_off_and_reported(
    daemons: list[PluginDaemon], tmp_path: Path, kubelet: Kubelet
) -> None:
    d = daemon(daemons, tmp_path, kubelet, CRASHER, BackOffPolicy(initial=0.5, maximum=1.0))
    # The first exit is restarted at once; the second waits out the back-off: crash-looping.
    reason = wait_until("the plugin crash-looping", d.exit_reason, lambda r: r is not None, timeout=10)
    assert reason is not None and d.restarts == 1
    assert reason.startswith(
        "exited with status 3 and is crash-looping (CrashLoopBackOff): restarted 1 time by the kubelet"
    ), reason
    assert "back-off 0.5 s" in reason, reason
    wait_until("two more restarts", lambda: d.restarts, lambda n: n >= 3, timeout=10)
    log = d.log()
    assert (
        log.count("no GPUs found") >= 3 and "--- restarted by the kubelet (restartPolicy Always): restart 2" in log
    ), log


def test_nothing_restarts_while_the_kubelet_is_down_and_a_new_kubelet_restarts_at_once(
    daemons: list[PluginDaemon], tmp_path: Path, kubelet: Kubelet
) -> None:
    d = daemon(daemons, tmp_path, kubelet, CRASHER, BackOffPolicy(initial=30.0, maximum=60.0))
    wait_until("in back-off", d.exit_reason, lambda r: r is not None, timeout=10)
    kubelet.instance = None
    assert d.exit_reason() is None  # the kubelet starts it again when it runs: no reason to give up on it
    time.sleep(0.3)
    assert d.restarts == 1 and not d.running
    kubelet.restart()  # a new kubelet remembers no back-off: it restarts the exited container at once
    wait_until("restarted by the new kubelet", lambda: d.restarts, lambda n: n == 2, timeout=5)


def test_the_harness_stop_and_kill_keep_it_down_and_start_is_a_new_pod(
    daemons: list[PluginDaemon], tmp_path: Path, kubelet: Kubelet
) -> None:
    d = daemon(daemons, tmp_path, kubelet, SLEEPER, BackOffPolicy(initial=0.2, maximum=0.2))
    assert d.running and d.exit_reason() is None
    pid = d.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)  # a crash, not the harness's hand: restarted
    wait_until("restart after the crash", lambda: d.restarts, lambda n: n == 1, timeout=5)
    wait_until("running again", lambda: d.running, bool, timeout=5)
    d.kill(signal.SIGKILL)
    assert d.wait(5) == -signal.SIGKILL
    time.sleep(0.3)
    assert not d.running and d.restarts == 1 and d.exit_reason() == "killed by signal 9"
    d.start()
    assert d.running and d.restarts == 0
    d.stop(timeout=2)
    time.sleep(0.3)
    assert not d.running and d.exit_reason() == "killed by signal 15"


def test_a_stop_between_two_crashes_keeps_it_down(
    daemons: list[PluginDaemon], tmp_path: Path, kubelet: Kubelet
) -> None:
    """The harness stopping a crash-looping plugin (remove_plugin, teardown) holds it: no restart after the back-off."""
    d = daemon(daemons, tmp_path, kubelet, CRASHER, BackOffPolicy(initial=0.3, maximum=0.3))
    wait_until("in back-off", d.exit_reason, lambda r: r is not None, timeout=10)
    d.stop(timeout=2)
    restarts = d.restarts
    time.sleep(1.0)
    assert d.restarts == restarts and not d.running and d.exit_reason() == "exited with status 3"


def test_no_two_starts_within_a_relist_period(daemons: list[PluginDaemon], tmp_path: Path, kubelet: Kubelet) -> None:
    """A node never starts a plugin's container again within a second (``genericPlegRelistPeriod``) of its last
    start; the harness may ask at once (kill, then start as a new pod) and a crash is seen within ``relist``, yet both
    starts wait. Each process writes the monotonic clock (system-wide) first thing; ``-S`` keeps its start-up to
    milliseconds. The 1 s is pinned here as a literal (upstream's value in every pinned release), not the constant."""
    starts = tmp_path / "starts"
    recorder = [
        sys.executable,
        "-S",
        "-c",
        f"import time; open({str(starts)!r}, 'a').write(f'{{time.monotonic()}}\\n'); time.sleep(60)",
    ]
    d = daemon(daemons, tmp_path, kubelet, recorder, KUBELET_BACKOFF)

    def seen() -> list[float]:
        return [float(x) for x in starts.read_text().split()] if starts.exists() else []

    wait_until("the first start", seen, lambda t: len(t) == 1, timeout=10)
    d.kill(signal.SIGKILL)
    d.wait(5)
    d.start()  # the harness's new pod, asked for at once
    wait_until("the start as a new pod", seen, lambda t: len(t) == 2, timeout=10)
    pid = d.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)  # a crash: the kubelet's restart, seen within relist
    wait_until("the kubelet's restart", seen, lambda t: len(t) == 3, timeout=10)
    t = seen()
    gaps = [b - a for a, b in zip(t, t[1:], strict=False)]
    assert all(g >= 0.9 for g in gaps), f"starts {gaps} s apart; a node keeps them >= 1 s apart"
