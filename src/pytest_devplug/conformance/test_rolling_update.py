"""Rolling update (opt-in convention ``rolling-update``): a second instance of the plugin beside the first.

A DaemonSet's default update stops the old pod before it starts the new one, so the kubelet does not require
plugins to survive an overlap; those whose DaemonSet rolls out with ``maxSurge`` must. The kubelet takes the
newest registration of a resource as the one it allocates through (it dials the new endpoint during ``Register``);
from Kubernetes 1.37 it keeps every connected instance (one endpoint per socket) and refuses a second Register on a
socket it holds, so the new instance must serve on a socket of its own (a plugin that reuses one fixed name also
removes the running instance's socket), and the old instance's exit must leave the new registration alone. Before
1.37 the kubelet disconnects the newest plugin when the old one's stream ends, whatever the plugin does: the check
holds from 1.37. Upstream's node e2e
(``device_plugin_multiple_test.go``) watches the node for 30 s after each step; the node is sampled here the
whole time, and for :data:`HOLD_S` after the old instance exited.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pytest_devplug import NodeHandle, PluginHandle, PodFactory
from pytest_devplug.waiting import wait_for
from pytest_devplug.errors import WaitTimeout

#: The kubelet's line for every Register call (embedded: ``... with resource X``;
#: real: ``... resource name" resourceName="X"``).
REGISTRATION = "Got registration request from device plugin with resource"
#: The kubelet's line for every device list a plugin's ListAndWatch stream brings (embedded: ``... plugin X: n
#: devices``; real, at verbosity 2 and above: ``..." resource="X" resourceCapacity=n``).
PUSHED = "State pushed for device plugin"
#: Seconds the node is watched after the first instance's process exited (``retire`` returns then): whatever its
#: exit did to the socket or the stream shows at once.
HOLD_S = 2.0
#: Seconds between two samples of the node.
SAMPLE_S = 0.05
#: Seconds the first instance runs at least before the second starts. A DaemonSet's new pod never comes up within
#: a second of the old one, and plugins name their socket after that: Kubernetes' sample plugin serves on
#: ``dp.<start time in Unix seconds>``, so two instances started in the same second would share one socket.
SURGE_AFTER_S = 1.1


def _logged(node: NodeHandle, line: str, resource: str) -> int:
    """How many of the kubelet's log lines carry ``line`` (:data:`REGISTRATION`, :data:`PUSHED`) for ``resource``."""
    return sum(1 for ln in node.kubelet_log().splitlines() if line in ln and resource in ln)


class _CountWatch:
    """Samples the node's (capacity, allocatable) of a resource in a thread; keeps every sample that is not
    ``want``, with the step of the rollout it happened in."""

    def __init__(self, node: NodeHandle, resource: str, want: tuple[int, int]) -> None:
        self.node, self.resource, self.want = node, resource, want
        self.step = "before the second instance started"
        self.started = time.monotonic()
        self.off: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._errors: list[str] = []

    def mark(self, step: str) -> None:
        self.step = step

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                counts = self.node.counts(self.resource)
            except Exception as exc:  # noqa: BLE001 - reported with the verdict, never lost in a thread
                self._errors.append(f"{type(exc).__name__}: {exc}")
                continue
            self.samples += 1
            if counts != self.want:
                self.off.append(f"{time.monotonic() - self.started:.2f}s {self.step}: {counts}")

    @contextmanager
    def running(self) -> Iterator[_CountWatch]:
        thread = threading.Thread(target=self._run, name="rolling-update-watch", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(5.0)
        if self._errors:
            raise AssertionError(f"reading the node during the rollout failed: {self._errors[:3]}")


@pytest.mark.devplug_convention("rolling-update")
@pytest.mark.devplug_disruptive
def test_convention_rolling_update_without_downtime(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Upstream's zero-downtime rollout, however long the second instance takes to come up: a pod runs on the
    first instance; a second instance starts beside it and registers (the kubelet switches to it) while the node
    keeps n/n; a second pod is allocated through it; the first instance is stopped and the node still keeps n/n
    (its exit does not take the new registration along); both pods keep their devices, and a third pod, made after
    the first is gone, is allocated by the second instance."""
    res, node = devplug_plugin.resource_name, devplug_plugin.node
    # Before 1.37 the first instance's exit disconnects the second whatever the plugin does: nothing to judge there.
    node.require("endpoint-per-socket")
    n = node.capacity(res)
    if n < 2:
        pytest.skip(f"the rollout check runs two pods at once: needs 2 devices of {res}; the plugin lists {n}")
    ids = sorted(set(node.device_ids(res)))
    first = devplug_pod(count=1, wait=True)
    time.sleep(SURGE_AFTER_S)  # the first instance may have been (re)started by the test before this one
    before, pushed = _logged(node, REGISTRATION, res), _logged(node, PUSHED, res)
    watch = _CountWatch(node, res, (n, n))
    with watch.running():
        devplug_plugin.surge()
        watch.mark("while the second instance started")
        try:
            wait_for(
                lambda: _logged(node, REGISTRATION, res),
                lambda k: k > before,
                timeout=node.reregistration_timeout,
                what=f"a Register call for {res} from the second instance",
                give_up=devplug_plugin.crashed,
            )
        except WaitTimeout as exc:
            why = f" ({exc.reason})" if exc.reason else ""
            tail = "\n    ".join(devplug_plugin.log().splitlines()[-12:])
            raise AssertionError(
                f"a second instance of the plugin started beside the running one never registered {res}{why} within "
                f"{node.reregistration_timeout:g}s; the plugin's log (both instances):\n    {tail}"
            ) from None
        watch.mark("after the second instance registered")
        if pushed:  # the kubelet logs the lists it gets: wait for the new instance's first one
            # (a plugin that discovers its devices only when ListAndWatch opens cannot answer an Allocate sent in
            # the milliseconds between its Register and that call; no DaemonSet rollout schedules a pod into them)
            try:
                wait_for(
                    lambda: _logged(node, PUSHED, res),
                    lambda k: k > pushed,
                    timeout=node.reregistration_timeout,
                    what=f"the second instance's first device list for {res} in the kubelet's log",
                    give_up=devplug_plugin.crashed,
                )
            except WaitTimeout as exc:
                raise AssertionError(
                    f"the second instance registered {res} but the kubelet got no device list from it ({exc}): a "
                    "registered plugin must answer ListAndWatch"
                ) from None
        second = devplug_pod(count=1, wait=True)
        now = sorted(set(node.device_ids(res)))
        assert now == ids, f"the second instance lists {now}; the first listed {ids} (running pods refer to those)"
        devplug_plugin.retire()
        watch.mark("after the first instance was stopped")
        time.sleep(HOLD_S)
    assert watch.samples > 0, "the node was never read during the rollout"
    assert not watch.off, (
        f"{res} left {n}/{n} (capacity, allocatable) during the rollout, {len(watch.off)} of {watch.samples} samples: "
        + "; ".join(watch.off[:6])
        + ". The kubelet takes the newest registration: the new instance must serve on a socket of its own and the old "
        "one's exit must leave it registered"
    )
    for pod in (first, second):
        assert pod.phase == "Running" and pod.restart_count == 0, (
            f"{pod.name}: {pod.phase}, restarts {pod.restart_count}"
        )
    held = first.allocated_devices
    assert len(held) == 1 and len(second.allocated_devices) == 1 and held != second.allocated_devices, (
        f"pods hold {held} and {second.allocated_devices} after the rollout"
    )
    first.delete()
    third = devplug_pod(count=1, wait=True)
    assert not set(third.allocated_devices) & set(second.allocated_devices), (
        f"{second.allocated_devices} of {second.name} handed out again after the rollout: {third.allocated_devices}"
    )
