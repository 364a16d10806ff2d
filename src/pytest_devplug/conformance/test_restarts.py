"""Restarts in the orders upstream's node e2e tests use, judged by what the plugin must do in each.

An abrupt death (SIGKILL; on kind/cluster the plugin pod deleted with grace period 0) leaves the old socket
file behind: the plugin started again must serve on it and register before the kubelet sends it anything.
Device IDs are the plugin's part of the checkpoint: a restarted plugin must list the same ones, or running
pods and the checkpoint refer to devices that no longer exist. A health change must still reach the kubelet
over the stream opened after a kubelet or plugin restart, not only over the first one.
"""

from __future__ import annotations

import pytest

from pytest_devplug import (
    FaultInjector,
    PluginHandle,
    PodFactory,
    PodHandle,
    assert_allocatable,
    assert_reregisters_after_kubelet_restart,
)
from pytest_devplug.faults import fault_domain
from pytest_devplug.report import note_check
from pytest_devplug.waiting import wait_for

from ._support import fault, wait_marked_unhealthy


def _keeps(pod: PodHandle, held: list[str], after: str) -> None:
    """The same pod instance still runs, unrestarted, with the devices it had."""
    assert pod.phase == "Running", f"after {after} the pod should still run: {pod.phase} {pod.reason} {pod.message}"
    assert pod.restart_count == 0, f"after {after} the container restarted {pod.restart_count} times"
    assert pod.allocated_devices == held, f"after {after} pod-resources lists {pod.allocated_devices}, it held {held}"


def _new_pod_gets_a_device(pods: PodFactory, plugin: PluginHandle, pod: PodHandle, held: list[str], after: str) -> None:
    """A new pod is allocated by the plugin as it is now: another device while ``pod`` keeps ``held``; on a
    resource whose every device ``pod`` holds, ``pod`` is deleted first and the new pod gets one of those."""
    node, res = plugin.node, plugin.resource_name
    if node.allocatable(res) - len(held) < 1:
        pod.delete_and_wait_gone()
        other = pods(count=1, wait=True)
        assert other.allocated_devices, f"after {after} and the pod holding {held} was deleted, a new pod got no device"
        return
    other = pods(count=1, wait=True)
    assert other.allocated_devices and not set(other.allocated_devices) & set(held), (
        f"after {after} a new pod got {other.allocated_devices}; {held} are still held"
    )


@pytest.mark.devplug_disruptive
def test_abrupt_kill_then_restart_serves_again(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """SIGKILL: no clean-up runs, the socket file stays. Started again, the plugin registers (the kubelet
    dials it first: it must be serving), its devices come back n/n, the running pod keeps its device and a new
    pod is allocated by the new process (another device; on a one-device resource the first pod's, once it is gone)."""
    res, node = devplug_plugin.resource_name, devplug_plugin.node
    n = node.capacity(res)
    pod = devplug_pod(count=1, wait=True)
    held, ids = pod.allocated_devices, sorted(set(node.device_ids(res)))
    devplug_plugin.kill()
    assert_allocatable(devplug_plugin, 0, capacity=n)
    devplug_plugin.start()
    assert_allocatable(devplug_plugin, n, capacity=n)
    after = sorted(set(node.device_ids(res)))
    assert after == ids, f"after a SIGKILL and start the plugin lists {after}; before it listed {ids}"
    _keeps(pod, held, "the plugin was killed and started again")
    _new_pod_gets_a_device(devplug_pod, devplug_plugin, pod, held, "the plugin was killed and started again")


@pytest.mark.devplug_disruptive
def test_device_ids_stable_across_restarts(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """The plugin lists the same device IDs after it restarts and after a kubelet restart (after a SIGKILL:
    ``test_abrupt_kill_then_restart_serves_again``); the checkpoint's registered devices stay those IDs."""
    res, node = devplug_plugin.resource_name, devplug_plugin.node
    n = node.capacity(res)
    pod = devplug_pod(count=1, wait=True)
    before = sorted(set(node.device_ids(res)))
    steps = [("a plugin restart", devplug_plugin.restart), ("a kubelet restart", node.restart_kubelet)]
    for what, step in steps:
        step()
        assert_allocatable(devplug_plugin, n, capacity=n)
        now = sorted(set(node.device_ids(res)))
        assert now == before, (
            f"after {what} the plugin lists {now}; before it listed {before} (running pods refer to those)"
        )
        cp = node.checkpoint()
        registered = sorted(cp.registered_devices.get(res, ())) if cp is not None else []
        assert registered == before, f"after {what} the checkpoint registers {registered}, not {before}"
        assert set(pod.allocated_devices) <= set(now), (
            f"after {what} the pod holds {pod.allocated_devices}, not among {now}"
        )


@pytest.mark.devplug_disruptive
def test_container_restart_after_kubelet_restart(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Upstream's pod + kubelet restart: after the kubelet restarted, a crashed container comes back with the
    devices and the injections it had (the kubelet re-admits it from the checkpoint)."""
    pod = devplug_pod(count=1, wait=True)
    held, env = pod.allocated_devices, pod.env
    assert_reregisters_after_kubelet_restart(devplug_plugin)
    pod.restart_container()
    wait_for(
        lambda: pod.restart_count,
        lambda c: c >= 1,
        timeout=pod.timeout,
        what="container restart after the kubelet restart",
    )
    pod.wait_running()
    assert pod.allocated_devices == held, f"pod-resources lists {pod.allocated_devices}; the container held {held}"
    assert pod.env == env, f"the restarted container's env {pod.env}; before {env}"


@pytest.mark.devplug_disruptive
def test_kubelet_restart_then_plugin_restart(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """The kubelet restarts (the plugin re-registers by itself), then the plugin restarts: the pod keeps its
    device throughout and a new pod gets another one from the twice-registered plugin (on a one-device resource the
    first pod's, once it is gone)."""
    res, node = devplug_plugin.resource_name, devplug_plugin.node
    n = node.capacity(res)
    pod = devplug_pod(count=1, wait=True)
    held = pod.allocated_devices
    assert_reregisters_after_kubelet_restart(devplug_plugin)
    _keeps(pod, held, "the kubelet restart")
    devplug_plugin.restart()
    assert_allocatable(devplug_plugin, n, capacity=n)
    _keeps(pod, held, "the kubelet restart and then the plugin restart")
    _new_pod_gets_a_device(devplug_pod, devplug_plugin, pod, held, "the kubelet restart and then the plugin restart")


def _health_round_trip(plugin: PluginHandle, faults: FaultInjector, after: str) -> None:
    """Devices of two fault domains Unhealthy (allocatable down by what the plugin marks), then Healthy again:
    back to n of n."""
    n = plugin.node.capacity(plugin.resource_name)
    ids = faults.device_ids
    with fault("tell which devices a fault reaches"):
        first = fault_domain(faults, ids[0])
        rest = [d for d in ids if d not in first]
        second = fault_domain(faults, rest[0]) if rest else []
    if not second:
        pytest.skip(f"needs devices on two separately failing parts of hardware; the plugin lists {ids}")
    with fault("mark a device unhealthy"):
        faults.set_unhealthy(first[0])
    try:
        wait_marked_unhealthy(plugin, first, capacity=n)
    except AssertionError as exc:
        raise AssertionError(f"after {after} a device turning Unhealthy no longer reaches the kubelet: {exc}") from None
    faults.set_unhealthy(second[0])
    wait_marked_unhealthy(plugin, second, capacity=n, faulted=tuple(first))
    with fault("mark a device healthy again"):
        faults.set_healthy(first[0])
        faults.set_healthy(second[0])
    try:
        assert_allocatable(plugin, n, capacity=n)
    except AssertionError as exc:
        raise AssertionError(
            f"after {after} devices that are Healthy again must bring allocatable back to {n}/{n}: {exc}"
        ) from None


@pytest.mark.devplug_disruptive
def test_health_reported_after_kubelet_and_plugin_restarts(
    devplug_plugin: PluginHandle, devplug_faults: FaultInjector
) -> None:
    """The stream the plugin opens for a restarted kubelet, and the health watch of a restarted plugin, carry
    health changes as the first ones did; devices Healthy again bring allocatable back to n of n each time."""
    n = devplug_plugin.node.capacity(devplug_plugin.resource_name)
    assert_reregisters_after_kubelet_restart(devplug_plugin)
    _health_round_trip(devplug_plugin, devplug_faults, "a kubelet restart")
    devplug_plugin.restart()
    assert_allocatable(devplug_plugin, n, capacity=n)
    _health_round_trip(devplug_plugin, devplug_faults, "a kubelet restart and then a plugin restart")


@pytest.mark.devplug_disruptive
def test_pods_deleted_while_kubelet_down_free_their_devices(
    devplug_pod: PodFactory, devplug_plugin: PluginHandle
) -> None:
    """Upstream's orphaned pods: pods deleted while the kubelet is down give their devices back once it runs
    again; the plugin is asked to Allocate them for new pods, and must."""
    res, node = devplug_plugin.resource_name, devplug_plugin.node
    n = node.capacity(res)
    pod = devplug_pod(count=n, wait=True)
    node.stop_kubelet()
    try:
        pod.delete()
    finally:
        node.start_kubelet()
    assert (pod.name, pod.namespace) not in [(p.name, p.namespace) for p in node.pod_resources()], (
        "deleted pod still listed"
    )
    assert_allocatable(devplug_plugin, n, capacity=n)
    again = devplug_pod(count=n, wait=True)
    assert len(set(again.allocated_devices)) == n, f"a new pod asking for all {n} devices got {again.allocated_devices}"


@pytest.mark.devplug_disruptive
def test_node_reboot_then_plugin_comes_back(
    devplug_pod: PodFactory, devplug_plugin: PluginHandle, request: pytest.FixtureRequest
) -> None:
    """Upstream's reboot order: containers gone, the kubelet re-admits the pod before the plugin re-registered,
    so the pod fails admission (``UnexpectedAdmissionError``). The plugin, started afterwards on a node whose
    kubelet cleaned the plugin directory and whose ``/run`` (so ``/var/run/cdi``) the reboot emptied, registers the
    same device IDs and serves new pods: CDI devices it answers must resolve from a spec it wrote again. Staged on
    kind and clusters (the report says so)."""
    res, node = devplug_plugin.resource_name, devplug_plugin.node
    n = node.capacity(res)
    pod = devplug_pod(count=1, wait=True)
    before = sorted(set(node.device_ids(res)))
    note_check(request.node, "reboot", node.reboot())
    assert pod.wait_phase("Failed") == "Failed"
    assert pod.reason == "UnexpectedAdmissionError", (
        f"re-admitted before the plugin registered: {pod.reason} {pod.message}"
    )
    devplug_plugin.start()
    assert_allocatable(devplug_plugin, n, capacity=n)
    assert sorted(set(node.device_ids(res))) == before, (
        f"after the reboot the plugin lists {node.device_ids(res)}; before {before}"
    )
    devplug_pod(count=n, wait=True)
