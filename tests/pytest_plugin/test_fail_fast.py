"""Waits stop at once, with the reason, when their state can no longer come: a plugin process that
exited (status and last log lines), a terminal pod phase, a refused registration."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug import PluginSpec, assert_allocatable, assert_registered, assert_reregisters_after_kubelet_restart
from pytest_devplug.backends.base import NodeSpec
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.handles import ClusterHandle, PluginHandle
from pytest_devplug.waiting import wait_for
from pytest_devplug.errors import WaitAbandoned, WaitTimeout

from ..support import sim_cluster

WIDGET = str(Path(__file__).resolve().parents[1] / "fixture_plugins" / "widget.py")
RESOURCE = "example.com/widget"
TIMEOUT = 20.0  # every wait below must end long before this


def test_wait_for_gives_up_with_the_reason() -> None:
    calls = []

    def give_up() -> str | None:
        calls.append(1)
        return "it can never happen" if len(calls) >= 3 else None

    start = time.monotonic()
    with pytest.raises(WaitAbandoned) as info:
        wait_for(lambda: 0, lambda v: v == 1, timeout=TIMEOUT, what="one", interval=0.01, give_up=give_up)
    assert time.monotonic() - start < 2
    assert info.value.reason == "it can never happen" and info.value.last == 0
    assert isinstance(info.value, WaitTimeout) and "gave up after" in str(info.value)
    # A value that is ok wins over give_up; a plain timeout has no reason.
    assert wait_for(lambda: 1, lambda v: v == 1, timeout=1, what="one", give_up=lambda: "never asked") == 1
    with pytest.raises(WaitTimeout) as timed_out:
        wait_for(lambda: 0, lambda v: v == 1, timeout=0.2, what="one", give_up=lambda: None)
    assert timed_out.value.reason is None


@pytest.fixture
def cluster() -> Iterator[ClusterHandle]:
    with sim_cluster(TIMEOUT) as cluster:
        yield cluster


def deploy(cluster: ClusterHandle, *args: str, standard_paths: bool | None = None) -> PluginHandle:
    node = cluster.ensure_node(NodeSpec("n1"))
    argv = [sys.executable, WIDGET, "--plugin-dir", "{plugin_dir}", *args]
    if standard_paths is not None:
        argv = [sys.executable, WIDGET, *args]
    return cluster.deploy(node, PluginSpec(resource_name=RESOURCE, argv=argv, standard_paths=standard_paths))


def test_registration_wait_stops_when_the_plugin_exits(cluster: ClusterHandle) -> None:
    plugin = deploy(cluster, "--fault", "exit-at-start")
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        assert_registered(plugin)
    assert time.monotonic() - start < 10
    msg = str(info.value).splitlines()[0:4]
    text = "\n".join(msg)
    assert "exited with status 3" in text, text
    assert "cannot open /dev/widgetctl: no such device" in text, text  # the last log lines
    with pytest.raises(AssertionError, match="exited with status 3"):
        plugin.wait_ready()


def test_plugin_that_never_reaches_kubelet_sock_is_told_where_it_listens(
    cluster: ClusterHandle, tmp_path: Path
) -> None:
    """A plugin looking for kubelet.sock elsewhere (as a hard-coded path would) is told where it is."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plugin = deploy(cluster, "--plugin-dir", str(elsewhere), standard_paths=False)
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        assert_registered(plugin)
    assert time.monotonic() - start < 10
    text = str(info.value)
    kubelet_sock = plugin.node.backend.cluster.node("n1").plugin_dir / "kubelet.sock"  # type: ignore[attr-defined]
    assert "the plugin never reached kubelet.sock" in text and f"the kubelet listens on {kubelet_sock}" in text, text
    assert "hard-codes /var/lib/kubelet/device-plugins needs a command without {plugin_dir}" in text, text
    assert "exited with status 1" in text, text  # this plugin gives up itself when Register fails


def test_pod_wait_stops_at_a_terminal_phase(cluster: ClusterHandle) -> None:
    """Allocate returning no container responses fails the pod; waiting for Running stops at once."""
    plugin = deploy(cluster, "--fault", "allocate-empty")
    assert_registered(plugin, count=3)
    pods = cluster.pods(plugin.node, RESOURCE)
    try:
        pod = pods(gpus=1, wait=False)
        start = time.monotonic()
        with pytest.raises(AssertionError) as info:
            pod.wait_running()
        assert time.monotonic() - start < 10
        assert "phase='Failed'" in str(info.value) and "UnexpectedAdmissionError" in str(info.value)
    finally:
        pods.cleanup()


def test_refused_registration_stops_the_wait(cluster: ClusterHandle) -> None:
    plugin = deploy(cluster, "--resource-name", "widget-without-domain", "--retry")
    bad = PluginHandle(plugin.backend, plugin.node, PluginSpec(resource_name="widget-without-domain"))
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        assert_registered(bad)
    assert time.monotonic() - start < 10
    assert "stopped early: the kubelet refused the registration" in str(info.value), str(info.value)
    assert plugin.running  # it retries: the kubelet's refusal, not an exit, ended the wait


def test_a_crash_quotes_its_fatal_line_not_only_the_tail(cluster: ClusterHandle) -> None:
    """A Go-style panic (fatal line, then 120 lines of goroutine dump): the message has the fatal line, and no
    hint about kubelet.sock, which does not apply to a plugin that said why it died."""
    plugin = deploy(cluster, "--fault", "panic-at-start")
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        assert_registered(plugin)
    assert time.monotonic() - start < 10
    text = str(info.value)
    # Restarted once at once, as the kubelet does, then held back: a crash loop, reported with its fatal line.
    assert "exited with status 2 and is crash-looping (CrashLoopBackOff): restarted 1 time by the kubelet" in text, text
    assert (
        "; fatal: panic: listen unix /var/lib/kubelet/device-plugins/widget.sock: bind: address already in use" in text
    ), text
    assert "never reached kubelet.sock" not in text, text
    # The evidence has the restart count as a field of its own, and the crash loop.
    restarts = {e.title: e.text for e in info.value.evidence}["plugin restarts"]  # type: ignore[attr-defined]
    assert restarts.startswith("restarted 1 time by the kubelet since the harness started it"), restarts
    assert "\ncrash-looping: exited with status 2 and is crash-looping (CrashLoopBackOff)" in restarts, restarts


def test_every_wait_gives_up_when_the_plugin_crashed_but_not_when_stopped(cluster: ClusterHandle) -> None:
    plugin = deploy(cluster)
    assert_registered(plugin, count=3)
    plugin.backend.kill_plugin(plugin.node.name)  # a crash, as far as the handle knows
    start = time.monotonic()
    with pytest.raises(AssertionError, match="stopped early: the plugin process killed by signal 9"):
        assert_allocatable(plugin, 2, capacity=3)
    assert time.monotonic() - start < 10
    plugin.start()
    assert_allocatable(plugin, 3, capacity=3)
    plugin.stop()  # the test's own doing: the wait runs until the kubelet saw it
    assert_allocatable(plugin, 0, capacity=3)


def test_plugin_log_has_each_run_once_after_a_restart(cluster: ClusterHandle) -> None:
    plugin = deploy(cluster)
    assert_registered(plugin, count=3)
    plugin.restart()
    assert_allocatable(plugin, 3, capacity=3)
    log = plugin.log()
    starts = [ln for ln in log.splitlines() if ln.startswith("--- start: ")]
    assert len(starts) == 2, log
    assert log.count("--- exited: ") == 1, log


def test_a_plugin_that_exits_when_the_kubelet_restarts_is_restarted_and_registers_again(cluster: ClusterHandle) -> None:
    """Plugins that exit when kubelet.sock changes count on their DaemonSet: the kubelet restarts the container."""
    plugin = deploy(cluster, "--exit-on-kubelet-restart")
    assert_registered(plugin, count=3)
    assert_reregisters_after_kubelet_restart(plugin)
    assert_allocatable(plugin, 3, capacity=3)
    log = plugin.log()
    assert (
        "- exiting to be restarted" in log and "--- restarted by the kubelet (restartPolicy Always): restart 1" in log
    ), log


def test_a_plugin_that_exits_on_a_failed_register_is_restarted_once_the_kubelet_runs(cluster: ClusterHandle) -> None:
    """Started while the kubelet is down, its Register fails and it exits 1; nothing restarts it until the kubelet
    runs (waits do not give up on it meanwhile), which restarts it at once: it registers."""
    plugin = deploy(cluster)
    assert_registered(plugin, count=3)
    plugin.node.stop_kubelet()
    plugin.restart()
    wait_for(
        lambda: plugin.running or "register failed" not in plugin.log(),
        lambda busy: not busy,
        timeout=TIMEOUT,
        what="the plugin exiting on its failed Register",
    )
    assert plugin.crashed() is None, plugin.crashed()
    plugin.node.start_kubelet()
    assert_registered(plugin, count=3)
    assert "--- restarted by the kubelet (restartPolicy Always): restart 1" in plugin.log(), plugin.log()


def test_a_second_instance_is_kept_running_like_the_first_and_retired_for_good(cluster: ClusterHandle) -> None:
    """A rolling update's second instance is a DaemonSet pod too: its crash is restarted by the kubelet (counted in the
    plugin's restarts, no reason for a wait to give up); retired, it stays down, running or crashed when retired."""
    plugin = deploy(cluster)
    assert_registered(plugin, count=3)
    backend, node = plugin.backend, plugin.node.name
    assert cluster.backend is backend and isinstance(backend, SimBackend) and backend.cluster is not None
    backend.surge_plugin(node)
    (second,) = [d for name, d in backend.cluster.node(node).plugins.items() if name.endswith("-2")]
    wait_for(lambda: second.pid, lambda pid: pid is not None, timeout=TIMEOUT, what="the second instance started")
    crashed = second.pid
    assert crashed is not None
    os.kill(crashed, signal.SIGKILL)  # not the harness's hand: a crash
    wait_for(
        lambda: (second.running, second.pid),
        lambda s: s[0] and s[1] != crashed,
        timeout=TIMEOUT,
        what="the kubelet restarting the crashed second instance",
    )
    assert backend.plugin_restarts(node).count == 1, backend.plugin_restarts(node)
    assert plugin.crashed() is None, plugin.crashed()
    second.proc.kill(signal.SIGKILL)  # crashed again: in back-off now, retired before the kubelet restarts it
    how = wait_for(
        lambda: backend.plugin_exit(node),
        lambda h: h is not None,
        timeout=TIMEOUT,
        what="the second instance's crash loop reported",
    )
    assert how is not None and how.startswith("the second instance killed by signal 9 and is crash-looping"), how
    backend.retire_plugin(node, newest=True)
    time.sleep(1.0)  # ten relists of its supervisor
    assert not second.running and second.restarts == 1, second
    assert plugin.running and plugin.crashed() is None, plugin.crashed()
    assert "--- second instance" not in plugin.log(), "a retired instance's log is no longer the plugin's"
