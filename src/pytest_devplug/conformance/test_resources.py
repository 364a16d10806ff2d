"""Several resources from one plugin process (``PluginSpec.extra_resource_names``, ``--devplug-resource-name a,b``).

A plugin may advertise more than one extended resource, each registered on its own socket (NVIDIA's mixed MIG
strategy: ``nvidia.com/gpu`` and ``nvidia.com/mig-1g.5gb`` from one process). The kubelet keeps one endpoint per
resource: each must register, list its own devices, answer ``Allocate`` for them, and register again after a
kubelet restart. A plugin that advertises one resource skips these checks at once.
"""

from __future__ import annotations

from functools import partial

import pytest

from pytest_devplug import PluginHandle, PodFactory, assert_registered
from pytest_devplug.backends.base import applied_view
from pytest_devplug.waiting import wait_for
from pytest_devplug.errors import WaitTimeout


def _resources(plugin: PluginHandle) -> tuple[str, ...]:
    names = plugin.resource_names
    if len(names) < 2:
        pytest.skip(
            f"the plugin under test serves one resource ({names[0]}); these checks judge a plugin that serves several "
            "from one process (PluginSpec.extra_resource_names, --devplug-resource-name a,b)"
        )
    return names


def test_every_resource_registers_and_allocates(devplug_pod: PodFactory, devplug_plugin: PluginHandle) -> None:
    """Each resource is registered (capacity = allocatable > 0, its device IDs unique), and one container asking
    for a device of each gets one of each: pod-resources lists them, each among that resource's devices; the
    checkpoint holds one entry (one Allocate answer) per resource, and the container got them all, merged."""
    names, node = _resources(devplug_plugin), devplug_plugin.node
    listed: dict[str, set[str]] = {}
    for res in names:
        cap, alloc = assert_registered(devplug_plugin, resource=res)
        ids = node.device_ids(res)
        assert len(ids) == alloc == cap, f"{res}: pod-resources lists {ids}; the node says {cap}/{alloc}"
        assert len(set(ids)) == len(ids), f"{res}: device IDs listed twice: {ids}"
        listed[res] = set(ids)
    pod = devplug_pod(resources=dict.fromkeys(names, 1), wait=True)
    got = {res: pod.allocated(resource=res) for res in names}
    for res, ids in got.items():
        assert len(ids) == 1 and set(ids) <= listed[res], (
            f"{res}: the container got {ids}; {res} lists {sorted(listed[res])}"
        )
    cp = node.checkpoint()
    assert cp is not None, "no checkpoint after an allocation"
    entries = cp.entries_for(pod.uid, pod.container)
    assert {e.resource_name: e.all_device_ids for e in entries} == got, (
        f"checkpoint entries {[(e.resource_name, e.all_device_ids) for e in entries]}; pod-resources {got}"
    )
    stored, view = applied_view(entries), pod.view()
    # The merge of the answers (the first resource's env wins where two set the same name) decides the values.
    seen = (sorted(view.envs), sorted(map(str, view.devices)), sorted(map(str, view.mounts)), sorted(view.cdi_devices))
    want = (
        sorted(stored.envs),
        sorted(map(str, stored.devices)),
        sorted(map(str, stored.mounts)),
        sorted(stored.cdi_devices),
    )
    assert all(set(a) >= set(b) for a, b in zip(seen, want, strict=True)), (
        f"the container lacks what Allocate answered for {list(names)}: got {seen}, answered {want}"
    )


@pytest.mark.devplug_disruptive
def test_every_resource_reregisters_after_kubelet_restart(devplug_plugin: PluginHandle) -> None:
    """After a kubelet restart every resource comes back to its counts: the plugin registers each one again
    (a plugin that re-registers only its first resource leaves the others at 0)."""
    names, node = _resources(devplug_plugin), devplug_plugin.node
    before = {res: node.counts(res) for res in names}
    node.restart_kubelet()
    missing = {}
    for res in names:
        try:
            wait_for(
                partial(node.counts, res),
                before[res].__eq__,
                timeout=node.reregistration_timeout,
                what=f"{res} back to {before[res]}",
                give_up=devplug_plugin.crashed,
            )
        except WaitTimeout as exc:
            missing[res] = exc.last
    back = [r for r in names if r not in missing]
    assert not missing, (
        f"after a kubelet restart {', '.join(back) or 'no resource'} came back, but not "
        + ", ".join(
            f"{r} ({before[r]} before, {seen} after {node.reregistration_timeout:g}s)" for r, seen in missing.items()
        )
        + ": the plugin must register every resource it serves again"
    )
