"""Topology Manager: hint generation and policy merges (upstream cases), and NUMA-aligned
admission through the device manager with the real GPU plugin (2 GPUs per NUMA node)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .dm_helpers import GPU, DmMockState, DmWaiter, dm_capacity_probe, dm_gpu
from pytest_devplug.sim.devicemanager import DeviceManager
from pytest_devplug.errors import AdmissionError
from pytest_devplug.kubeletmodel.views import ContainerSpec, PodSpecView
from pytest_devplug.procs.process import PluginProcess
from pytest_devplug.sim.topology import (
    TopologyHint,
    device_hints,
    filter_by_affinity,
    generate_device_hints,
    iterate_masks,
    mask_of,
    merge_hints,
)

Make = Callable[..., tuple[DeviceManager, DmWaiter]]
M0, M1, M01 = mask_of([0]), mask_of([1]), mask_of([0, 1])
NODES = {"a": [0], "b": [0], "c": [1], "d": [1]}


def test_iterate_masks_by_size_then_combination() -> None:
    assert list(iterate_masks([0, 1, 2])) == [0b001, 0b010, 0b100, 0b011, 0b101, 0b110, 0b111]


def test_device_hints_preferred_is_narrowest_possible() -> None:
    hints = generate_device_hints([0, 1], NODES, {"a", "b", "c", "d"}, set(), 2)
    assert hints == [TopologyHint(M0, True), TopologyHint(M1, True), TopologyHint(M01, False)]
    # node 0 full: only node 1 alone still fits, and single-node stays the preferred width
    assert generate_device_hints([0, 1], NODES, {"c", "d"}, set(), 2) == [
        TopologyHint(M1, True),
        TopologyHint(M01, False),
    ]
    # 3 devices need both nodes: that is then the preferred width
    assert generate_device_hints([0, 1], NODES, set(NODES), set(), 3) == [TopologyHint(M01, True)]


def test_device_hints_must_cover_reusable_devices() -> None:
    assert generate_device_hints([0, 1], NODES, {"c", "d"}, {"a"}, 2) == [TopologyHint(M01, False)]


def test_a_resource_s_hints_as_get_topology_hints_decides_them() -> None:
    free = {"available": set(NODES), "reusable": set()}
    assert device_hints([0, 1], {"x": [], "y": []}, allocated=set(), request=1, **free) is None  # no topology
    assert device_hints([0, 1], NODES, allocated=set(), request=5, **free) == []  # cannot fit
    # devices held since before a restart are hinted alone, and a changed request fits nothing
    assert device_hints([0, 1], NODES, allocated={"c"}, request=1, **free) == [
        TopologyHint(M1, True),
        TopologyHint(M01, False),
    ]
    assert device_hints([0, 1], NODES, allocated={"c"}, request=2, **free) == []
    assert device_hints([0, 1], NODES, allocated=set(), available={"c"}, reusable={"a"}, request=2) == [
        TopologyHint(M01, False)
    ]


def test_filter_by_affinity_splits_free_devices_by_the_container_s_hint() -> None:
    nodes = {**NODES, "e": [], "f": [0, 1]}
    free = {"a", "c", "e", "f"}
    assert filter_by_affinity(TopologyHint(M0, True), nodes, free) == ({"a", "f"}, {"c"}, {"e"})
    assert filter_by_affinity(None, nodes, free) == (set(), set(), free)
    assert filter_by_affinity(TopologyHint(None, True), nodes, free) == (set(), set(), free)


@pytest.mark.parametrize(
    ("policy", "hints", "best", "admit"),
    [
        ("none", [TopologyHint(M01, False)], TopologyHint(None, True), True),
        ("best-effort", [TopologyHint(M0, True), TopologyHint(M1, True)], TopologyHint(M0, True), True),
        ("best-effort", [TopologyHint(M01, False)], TopologyHint(M01, False), True),
        ("best-effort", [], TopologyHint(M01, False), True),
        ("restricted", [TopologyHint(M01, False)], TopologyHint(M01, False), False),
        ("restricted", [TopologyHint(M1, True), TopologyHint(M01, False)], TopologyHint(M1, True), True),
        ("restricted", None, TopologyHint(M01, True), True),
        ("single-numa-node", [TopologyHint(M01, True)], TopologyHint(None, False), False),
        ("single-numa-node", [TopologyHint(M1, True), TopologyHint(M01, False)], TopologyHint(M1, True), True),
        ("single-numa-node", None, TopologyHint(None, True), True),
    ],
)
def test_policy_merge(policy: str, hints: list[TopologyHint] | None, best: TopologyHint, admit: bool) -> None:
    assert merge_hints(policy, [0, 1], [{GPU: hints}]) == (best, admit)


def test_merge_across_resources_ands_masks() -> None:
    providers = [
        {
            "x/a": [TopologyHint(M0, True), TopologyHint(M01, False)],
            "x/b": [TopologyHint(M1, True), TopologyHint(M01, False)],
        }
    ]
    # no preferred permutation agrees on one node; among the non-preferred merges upstream keeps the
    # narrowest one as wide as the widest provider's narrowest hint (1 node): node 0
    assert merge_hints("best-effort", [0, 1], providers) == (TopologyHint(M0, False), True)
    assert merge_hints("restricted", [0, 1], providers)[1] is False


def test_unknown_policy_is_refused(dm_dir: object) -> None:
    with pytest.raises(ValueError, match="unknown topology manager policy 'strict'"):
        merge_hints("strict", [0, 1], [])


def pod(uid: str, n: int) -> tuple[PodSpecView, ContainerSpec]:
    c = ContainerSpec("c", {GPU: n})
    return PodSpecView(uid, f"pod-{uid}", "default", (c,)), c


@pytest.fixture
def dm_numa(
    dm_state: DmMockState, dm_plugin: Callable[..., PluginProcess]
) -> Callable[[str], tuple[DeviceManager, DmWaiter]]:
    dm_state.write([dm_gpu(0, 0), dm_gpu(1, 0), dm_gpu(2, 1), dm_gpu(3, 1)])
    started: list[bool] = []

    def make(policy: str, make_dm: Make) -> tuple[DeviceManager, DmWaiter]:
        dm, w = make_dm(topology_policy=policy)
        if not started:
            dm_plugin()
            started.append(True)
        w.until("4 GPUs registered", dm_capacity_probe(dm), lambda s: s == (4, 4))
        return dm, w

    return make  # type: ignore[return-value]


def test_single_numa_node_aligns_and_rejects_spanning(
    dm_numa: Callable[..., tuple[DeviceManager, DmWaiter]], dm_make: Make
) -> None:
    dm, _ = dm_numa("single-numa-node", dm_make)
    p, c = pod("u1", 2)
    dm.admit_container(p, c)
    devs = dm.container_devices("u1", "c")[GPU]
    assert {dm.device_numa(GPU, d)[0] for d in devs} in ({0}, {1})
    assert dm.get_affinity("u1", "c") is not None
    q, c3 = pod("u2", 3)
    with pytest.raises(AdmissionError) as exc:
        dm.admit_container(q, c3)
    assert (exc.value.reason, exc.value.message) == (
        "TopologyAffinityError",
        "Resources cannot be allocated with Topology locality",
    )
    assert "u2" not in dm.pod_devices()


def test_single_numa_node_on_a_machine_without_the_devices_numa_node(
    dm_state: DmMockState, dm_plugin: Callable[..., PluginProcess], dm_make: Make
) -> None:
    """Devices on NUMA 0 and 1, machine with node 0 only (kind on a 1-NUMA host, seen there at -v=4):
    hints are built over the machine's nodes, so the NUMA-1 devices fit no single-node mask; a request the
    NUMA-0 devices hold is admitted, and once they are taken (or for more) TopologyAffinityError."""
    dm_state.write([dm_gpu(0, 0), dm_gpu(1, 0), dm_gpu(2, 1), dm_gpu(3, 1)])
    dm, w = dm_make(topology_policy="single-numa-node", numa_nodes=1)
    dm_plugin()
    w.until("4 GPUs registered", dm_capacity_probe(dm), lambda s: s == (4, 4))
    p, c = pod("u1", 2)
    dm.admit_container(p, c)
    assert {dm.device_numa(GPU, d)[0] for d in dm.container_devices("u1", "c")[GPU]} == {0}
    for uid, n in (("u2", 2), ("u3", 1)):  # NUMA 1's two free devices do not count
        q, cq = pod(uid, n)
        with pytest.raises(AdmissionError) as exc:
            dm.admit_container(q, cq)
        assert exc.value.reason == "TopologyAffinityError"


def test_restricted_rejects_when_only_wider_than_needed_is_free(
    dm_numa: Callable[..., tuple[DeviceManager, DmWaiter]], dm_make: Make
) -> None:
    dm, _ = dm_numa("restricted", dm_make)
    dm.sources_ready = True
    a, ca = pod("a", 2)
    dm.admit_container(a, ca)
    assert dm.container_devices("a", "c") == {GPU: ["GPU-0000", "GPU-0001"]}  # both on node 0
    b, cb = pod("b", 1)
    dm.admit_container(b, cb)
    assert dm.container_devices("b", "c") == {GPU: ["GPU-0002"]}  # node 1
    dm.remove_stale_pods({"b"})
    c, cc = pod("c", 1)
    dm.admit_container(c, cc)
    assert dm.container_devices("c", "c") == {GPU: ["GPU-0000"]}
    # one GPU free on each node: two GPUs fit only across nodes, which is wider than preferred
    d, cd = pod("d", 2)
    with pytest.raises(AdmissionError) as exc:
        dm.admit_container(d, cd)
    assert exc.value.reason == "TopologyAffinityError"
    best = merge_hints("best-effort", dm.numa_nodes, [dm.get_topology_hints(d, cd)])
    assert best == (TopologyHint(M01, False), True)


def test_best_effort_packs_then_spans(dm_numa: Callable[..., tuple[DeviceManager, DmWaiter]], dm_make: Make) -> None:
    dm, _ = dm_numa("best-effort", dm_make)
    p, c = pod("u1", 1)
    dm.admit_container(p, c)
    q, c1 = pod("u2", 1)
    dm.admit_container(q, c1)
    # the second single-GPU container lands on the same node as the first (narrowest, fewest free first)
    nodes = [dm.device_numa(GPU, dm.container_devices(u, "c")[GPU][0])[0] for u in ("u1", "u2")]
    assert nodes[0] == nodes[1]
    r, c2 = pod("u3", 2)
    dm.admit_container(r, c2)  # best-effort admits even when it must span
    assert len(dm.container_devices("u3", "c")[GPU]) == 2
