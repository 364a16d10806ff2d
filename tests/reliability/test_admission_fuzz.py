"""Fuzzing pod admission on the embedded cluster with the real GPU plugin: random creates and
deletes (some deleted between binding and admission), and after every step no device is held by
two pods, every admitted pod holds what it asked for, and nothing leaks once all are gone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .reliability_support import RELIABILITY, examples
from pytest_devplug.api.podresources import v1_pb2, v1_pb2_grpc
from pytest_devplug.nvml import mock_env
from pytest_devplug.sim.embeddedplane import EmbeddedPlane
from pytest_devplug.errors import NotFoundError
from pytest_devplug.sim.kubelet import SimNode
from pytest_devplug.waiting import wait_for

from ..sim._helpers import gpu, plugin_argv, write_state
from ..support import RESOURCE

GPU = RESOURCE
GPUS = 4


def _pod(name: str, gpus: int, node_name: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": {GPU: gpus}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _assignments(node: SimNode) -> dict[str, list[str]]:
    with grpc.insecure_channel(f"unix://{node.pod_resources_socket}") as ch:
        resp = v1_pb2_grpc.PodResourcesListerStub(ch).List(v1_pb2.ListPodResourcesRequest(), timeout=5)  # type: ignore[no-untyped-call]
    return {p.name: [i for c in p.containers for d in c.devices for i in d.device_ids] for p in resp.pod_resources}


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedPlane, SimNode]]:
    state = tmp_path_factory.mktemp("admission") / "state.json"
    write_state(state, [gpu(i, i % 2, name="A100") for i in range(GPUS)])
    with EmbeddedPlane() as cluster:
        node = cluster.add_node("node-1")
        node.start_plugin(plugin_argv(node.plugin_dir, state, resource=GPU), env=mock_env(str(state)))
        wait_for(
            lambda: node.allocatable().get(GPU), lambda v: v == str(GPUS), what=f"{GPUS} GPUs allocatable", timeout=30
        )
        yield cluster, node


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.integers(0, 5), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("delete"), st.integers(0, 5), st.just(0), st.just(False)),
        st.tuples(st.just("delete-before-admit"), st.integers(0, 5), st.integers(1, 2), st.booleans()),
    ),
    min_size=1,
    max_size=14,
)


@settings(RELIABILITY, max_examples=examples(12))
@given(ops=_ops)
def test_no_double_allocation_no_lost_or_leaked_devices(
    gpu_cluster: tuple[EmbeddedPlane, SimNode], monkeypatch: pytest.MonkeyPatch, ops: list[tuple[str, int, int, bool]]
) -> None:
    cluster, node = gpu_cluster
    admit = node.admit
    doomed: set[str] = set()

    def admit_unless_deleted_meanwhile(p: dict[str, Any]) -> None:
        if p["metadata"]["name"] in doomed:
            cluster.delete_pod(p["metadata"]["name"])  # lands between binding and admission
        admit(p)

    monkeypatch.setattr(node, "admit", admit_unless_deleted_meanwhile)
    asked: dict[str, int] = {}
    try:
        for op, idx, gpus, bypass_scheduler in ops:
            name = f"p{idx}"
            if op == "delete":
                try:
                    cluster.delete_pod(name)
                except NotFoundError:
                    pass
                asked.pop(name, None)
                continue
            if name in asked:
                continue
            if op == "delete-before-admit":
                doomed.add(name)
            try:
                cluster.create_pod(_pod(name, gpus, "node-1" if bypass_scheduler else None))
                asked[name] = gpus
            except NotFoundError:
                assert name in doomed  # deleted before create_pod could return it
            held = _assignments(node)
            ids = [i for devs in held.values() for i in devs]
            assert len(ids) == len(set(ids)), f"a device held twice: {held}"
            assert not doomed & set(held), f"a pod deleted before admission holds devices: {held}"
            for p in cluster.list_pods():
                n = p["metadata"]["name"]
                if p["status"].get("phase") == "Running":
                    assert len(held.get(n, [])) == asked[n], f"{n} asked for {asked[n]}, holds {held.get(n)}"
    finally:
        monkeypatch.undo()
        for p in cluster.list_pods():
            cluster.delete_pod(p["metadata"]["name"])
    # Nothing leaked: a pod asking for every GPU is admitted on the emptied node.
    cluster.create_pod(_pod("all", GPUS, "node-1"))
    try:
        assert cluster.get_pod("all")["status"]["phase"] == "Running", cluster.get_pod("all")["status"]
        assert sorted(_assignments(node)["all"]) == [f"GPU-{i:04d}" for i in range(GPUS)]
    finally:
        cluster.delete_pod("all")
