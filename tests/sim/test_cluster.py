"""EmbeddedPlane: the API surface, pending-pod retries, events, concurrency and clean-up."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.sim.embeddedplane import EmbeddedPlane
from pytest_devplug.errors import ApiError, NotFoundError

from ._helpers import GPU, phase, pod, pod_resources, start_gpu_node, wait_for


@pytest.fixture
def cluster() -> Iterator[EmbeddedPlane]:
    with EmbeddedPlane() as c:
        yield c


def test_crud_and_api_errors(cluster: EmbeddedPlane) -> None:
    cluster.add_node("node-1")
    cluster.create_pod(pod("a", None))
    with pytest.raises(ApiError) as ei:
        cluster.create_pod(pod("a", None))
    assert (ei.value.status, ei.value.reason, ei.value.message) == (409, "AlreadyExists", 'pods "a" already exists')
    with pytest.raises(ApiError) as ei:
        cluster.create_pod(pod("bad", "1.5"))
    assert ei.value.status == 422
    other = pod("a", None)
    other["metadata"]["namespace"] = "team"
    cluster.create_pod(other)
    assert [p["metadata"]["namespace"] for p in cluster.list_pods()] == ["default", "team"]
    assert [p["metadata"]["name"] for p in cluster.list_pods("team")] == ["a"]
    cluster.delete_pod("a")
    with pytest.raises(NotFoundError, match='pods "a" not found'):
        cluster.get_pod("a")
    with pytest.raises(NotFoundError):
        cluster.delete_pod("a")
    with pytest.raises(NotFoundError):
        cluster.node("nope")
    assert [n["metadata"]["name"] for n in cluster.list_nodes()] == ["node-1"]


def test_pending_pod_is_retried_when_devices_free_up(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
    cluster.create_pod(pod("a", 1))
    b = cluster.create_pod(pod("b", 1))
    cond = b["status"]["conditions"][0]
    assert (b["status"]["phase"], cond["type"], cond["status"], cond["reason"]) == (
        "Pending",
        "PodScheduled",
        "False",
        "Unschedulable",
    )
    (ev,) = cluster.events(involved_name="b")
    assert (ev["type"], ev["reason"], ev["source"]["component"]) == ("Warning", "FailedScheduling", "default-scheduler")
    assert (
        ev["message"]
        == cond["message"]
        == (
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: "
            "1 No preemption victims found for incoming pod."
        )
    )
    cluster.delete_pod("a")
    wait_for(lambda: phase(cluster, "b"), lambda v: v == "Running", "pod b running after a was deleted")
    evs = cluster.events(involved_name="b")
    assert evs[-3]["message"] == "Successfully assigned default/b to node-1"
    assert cluster.get_pod("b")["status"]["conditions"][0]["status"] == "True"


def test_taint_change_retries_and_nodes_are_chosen_by_labels(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    start_gpu_node(
        cluster, "gpu-1", tmp_path / "a.json", 1, taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}]
    )
    start_gpu_node(cluster, "gpu-2", tmp_path / "b.json", 1, labels={"pool": "b"})
    assert cluster.create_pod(pod("sel", 1, nodeSelector={"pool": "b"}))["spec"]["nodeName"] == "gpu-2"
    p = cluster.create_pod(pod("x", 1))
    assert "1 node(s) had untolerated taint(s)" in p["status"]["conditions"][0]["message"]
    cluster.update_node("gpu-1", taints=[])
    wait_for(lambda: cluster.get_pod("x")["spec"].get("nodeName"), lambda v: v == "gpu-1", "x bound to gpu-1")


def test_concurrent_creates_and_deletes_never_share_a_device(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    nodes = [start_gpu_node(cluster, f"n{i}", tmp_path / f"{i}.json", 4) for i in range(2)]
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for j in range(6):
                name = f"p{t}-{j}"
                cluster.create_pod(pod(name, 1 + (j % 2)))
                if j % 2:
                    cluster.delete_pod(name)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    for node in nodes:
        held: list[str] = []
        for devs in pod_resources(node).values():
            held += devs.get(GPU, [])
        assert len(held) == len(set(held)), f"a device is held twice on {node.name}: {sorted(held)}"
        assert len(held) <= 4
    running = [p for p in cluster.list_pods() if p["status"]["phase"] == "Running"]
    assert sum(len(pod_resources(n)) for n in nodes) == len(running)


def test_close_stops_plugins_and_removes_the_workdir(tmp_path: Path) -> None:
    c = EmbeddedPlane()
    node = start_gpu_node(c, "node-1", tmp_path / "s.json", 1)
    proc = node.plugin()
    workdir = c.workdir
    c.close()
    assert not proc.running and proc.pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    assert not workdir.exists()
    given = Path(tempfile.mkdtemp(prefix="dpg-", dir="/tmp"))  # short: the node's sockets go under it
    try:
        with EmbeddedPlane(given) as c2:
            c2.add_node("n")
        assert given.exists()  # a caller's dir is left in place
    finally:
        shutil.rmtree(given, ignore_errors=True)


@pytest.mark.parametrize("bound_by", ["scheduler", "nodeName"])
def test_pod_deleted_between_binding_and_admission_is_not_admitted(
    cluster: EmbeddedPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound_by: str
) -> None:
    """Issue 11: the pod was admitted anyway and held its device, so the next pod failed with
    UnexpectedAdmissionError. The deletion now lands exactly between bind and admit."""
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
    admit = node.admit

    def delete_then_admit(p: dict[str, object]) -> None:
        meta = p["metadata"]
        assert isinstance(meta, dict)
        if meta["name"] == "gone":
            cluster.delete_pod("gone")
        admit(p)

    monkeypatch.setattr(node, "admit", delete_then_admit)
    gone = pod("gone", 1, node_name="node-1" if bound_by == "nodeName" else None)
    with pytest.raises(NotFoundError):
        cluster.create_pod(gone)  # create_pod returns the pod, which is gone by then
    assert node.active_pod_uids() == set()
    assert "Pod was deleted before admission" in node.kubelet_log()
    cluster.create_pod(pod("next", 1))
    wait_for(lambda: phase(cluster, "next"), lambda s: s == "Running", "the next pod running on the free GPU")
    assert list(pod_resources(node)) == [("next", "main")]


@pytest.mark.parametrize("name", ["../devplug-escaped-node", "/abs", "a/b", "Node-1", "n" * 254, "node\n"])
def test_node_names_are_validated_before_any_path_is_made(cluster: EmbeddedPlane, name: str) -> None:
    would_be = os.path.normpath(f"{cluster.workdir}/{name}") if "\n" not in name else None
    with pytest.raises(ApiError) as ei:
        cluster.add_node(name)
    assert ei.value.status == 422 and "is invalid: metadata.name: Invalid value: " in ei.value.message
    assert would_be is None or not os.path.lexists(would_be)
    assert [p for p in cluster.workdir.iterdir() if p.is_dir()] == []
    assert cluster.nodes == []
