"""One scenario, two backends: what a user observes must be the same on the embedded kubelet and on kind.

Each test drives the same steps on both sides (same mock GPUs, same pod names) and compares observations:
node counts, pod phase/reason/message, assigned device IDs, what Allocate injected, checkpoint entries,
API-server rejections and the scheduler's message. Known differences are in docs/guides/backends.md's table.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from pytest_devplug import PodRejectedError
from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.backends.base import parse_checkpoint
from pytest_devplug.handles import PodHandle
from pytest_devplug.waiting import wait_for

from .diff_helpers import REPLICAS, Side

pytestmark = [pytest.mark.kind]


def _both(sides: tuple[Side, Side], fn: Any) -> dict[str, Any]:
    return {s.name: fn(s) for s in sides}


def _same(observed: dict[str, Any], what: str) -> Any:
    assert observed["sim"] == observed["kind"], f"{what} differs between the backends: {observed}"
    return observed["kind"]


_AVAILABLE = re.compile(r"0/(\d+) nodes are available: (.*?)\.(?=\s|$)")
#: What the scheduler says of a node a pod pinned elsewhere cannot go to (filters before resource fit: a taint,
#: the node selector; or, where a PreFilter narrowed the nodes, "didn't satisfy plugin(s) [...]").
_OTHER_NODE = re.compile(r"node\(s\) (had untolerated taint|didn't match Pod's node affinity|didn't satisfy plugin)")
_NOT_HELPFUL = "Preemption is not helpful for scheduling"


def _per_node(message: str) -> str:
    """The scheduler's message as a cluster of the pod's own node alone would give it.

    The pods are pinned to their node (nodeSelector on its hostname), so on a cluster of several nodes every
    other node fails on its taint or the selector, and preemption is "not helpful" there. Dropping those
    counts leaves the pinned node's verdict, comparable with the embedded kubelet's single node.
    """

    def one(m: re.Match[str]) -> str:
        others = int(m[1]) - 1
        kept = []
        for item in m[2].split(", "):
            count, reason = item.split(" ", 1)
            n = int(count)
            if _OTHER_NODE.match(reason):
                continue
            if reason == _NOT_HELPFUL:
                n -= others
            if n:
                kept.append(f"{n} {reason}")
        return f"0/1 nodes are available: {', '.join(kept)}."

    return _AVAILABLE.sub(one, message)


def _pod_outcome(pod: PodHandle) -> dict[str, Any]:
    ids = pod.allocated_devices
    view = pod.view()
    cp = pod.backend.read_checkpoint(pod.node_name or "")
    entries = parse_checkpoint(cp).entries_for(pod.uid) if cp else []
    # The real kubelet hands the plugin a container's device IDs in Go set (map) iteration order, which is
    # random (devicemanager: allocDevices.UnsortedList()); the included plugin answers in request order, so
    # on kind the order of IDs in an env value and of device nodes/mounts varies from run to run. What the
    # container gets is the same set: compare in sorted order (the order difference is in
    # docs/guides/backends.md's table).
    return {
        "phase": pod.phase,
        "devices": ids,
        "envs": {k: ",".join(sorted(v.split(","))) for k, v in view.envs.items()},
        "device_nodes": sorted((d.container_path, d.permissions) for d in view.devices),
        "mounts": sorted((m.container_path, m.read_only) for m in view.mounts),
        # Likewise each NUMA node's device IDs in a checkpoint entry: the entry's content is the set.
        "checkpoint": sorted(
            (e.container_name, e.resource_name, repr({k: sorted(v) for k, v in sorted(e.device_ids.items())}))
            for e in entries
        ),
        "health": pod.device_health,
    }


def test_registration_counts_and_unhealthy_device(sides: tuple[Side, Side]) -> None:
    """Capacity/allocatable after registration, then after an Xid and a lost GPU, then back."""
    res = sides[0].plugin.resource_name
    _same(_both(sides, lambda s: s.plugin.node.counts(res)), "counts after registration")
    _same(_both(sides, lambda s: s.plugin.node.device_ids(res)), "pod-resources allocatable device IDs")
    for s in sides:
        first, second = s.plugin.mock.uuids[:2]
        s.plugin.mock.inject_xid(first, 79)
        s.plugin.mock.set_lost(second)
    counts = _both(sides, lambda s: s.plugin.node.wait_counts(res, capacity=4, allocatable=2, timeout=60))
    _same(counts, "counts after an Xid and a lost GPU")
    _same(_both(sides, lambda s: s.plugin.node.device_ids(res)), "healthy devices after faults")


def test_pod_gets_the_same_devices_and_injections(sides: tuple[Side, Side]) -> None:
    """Same mock GPUs, same requests: the same devices, env, device nodes and checkpoint entries."""
    pods = {}
    for s in sides:
        first = s.pods(gpus=1, name="diff-first", wait=True)
        pods[s.name] = (first, s.pods(gpus=2, name="diff-second", wait=True))
    _same({k: _pod_outcome(v[0]) for k, v in pods.items()}, "one-GPU pod")
    _same({k: _pod_outcome(v[1]) for k, v in pods.items()}, "two-GPU pod (NUMA-packed by the plugin's preference)")
    cps = {}
    for s in sides:
        raw = s.plugin.backend.read_checkpoint(s.plugin.node.name)
        assert raw is not None
        cps[s.name] = {k: sorted(v) for k, v in parse_checkpoint(raw).registered_devices.items()}
    _same(cps, "checkpoint RegisteredDevices")


def _normalize(text: str, *names: str) -> str:
    for n in names:
        text = text.replace(n, "<pod>")
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize(
    "kw",
    [{"requests": 1}, {"limits": 2, "requests": 1}, {"limits": "0.5"}],
    ids=["requests-only", "unequal", "non-integer"],
)
def test_api_server_rejections_read_the_same(sides: tuple[Side, Side], kw: dict[str, Any]) -> None:
    out = {}
    for s in sides:
        with pytest.raises(PodRejectedError) as err:
            s.pods(name="diff-rejected", **kw)
        out[s.name] = (err.value.status, err.value.reason, _normalize(err.value.message, "diff-rejected"))
    _same(out, f"rejection of {kw}")


def test_scheduler_message_for_too_many_gpus(sides: tuple[Side, Side]) -> None:
    """More GPUs than the node has: Pending, PodScheduled=False/Unschedulable, the same FailedScheduling text
    (for the pod's own node: kind's other nodes are counted out, :func:`_per_node`)."""
    res = sides[0].plugin.resource_name
    out = {}
    for s in sides:
        pod = s.pods(gpus=5, name="diff-too-many")
        msg = _per_node(pod.wait_event(f"FailedScheduling: .*Insufficient {re.escape(res)}", timeout=60))
        # the scheduler records the event before it writes the condition (a separate status update)
        cond = wait_for(
            lambda pod=pod: next((c for c in pod.conditions if c.get("type") == "PodScheduled"), None),  # type: ignore[misc]
            lambda c: c is not None,
            timeout=30,
            what=f"{s.name}: the PodScheduled condition of {pod.name}",
        )
        out[s.name] = (pod.phase, pod.node_name, cond.get("status"), cond.get("reason"), msg)
    _same(out, "unschedulable pod")


def test_failing_allocate_fails_admission_the_same_way(sides: tuple[Side, Side]) -> None:
    out = {}
    for s in sides:
        for uuid in s.plugin.mock.uuids:
            s.plugin.mock.fail_allocate(uuid)
        pod = s.pods(gpus=1, name="diff-fail")
        pod.wait_phase("Failed", timeout=60)
        # The plugin's error names its mock-state file, which lives elsewhere on each backend (a temp dir
        # for the sim, the hostPath /var/lib/devplug/... on the kind node): not a kubelet difference.
        message = re.sub(r"in mock state \S+", "in mock state <file>", pod.message or "")
        out[s.name] = (pod.phase, pod.reason, message, pod.allocated_devices)
    _same(out, "pod whose Allocate failed")


def test_checkpoint_and_assignment_survive_kubelet_restart(sides: tuple[Side, Side]) -> None:
    out = {}
    for s in sides:
        pod = s.pods(gpus=1, name="diff-restart", wait=True)
        before = _pod_outcome(pod)
        s.plugin.node.restart_kubelet()
        res = s.plugin.resource_name
        # Allocatable counts healthy devices, allocated or not (devicemanager GetCapacity): 4 of 4 again.
        wait_for(
            lambda s=s, res=res: s.plugin.node.counts(res),
            lambda c: c == (4, 4),
            timeout=60,
            what=f"{s.name}: re-registration",
        )
        out[s.name] = (before, _pod_outcome(pod), pod.restart_count)
    _same(out, "pod across a kubelet restart")
    assert out["kind"][0] == out["kind"][1], f"assignment changed across the restart: {out['kind']}"


def test_sharing_two_ids_one_device_node(shared_sides: tuple[Side, Side]) -> None:
    """Two device IDs sharing one /dev node (time-slicing replicas): the pod gets both IDs, the checkpoint
    keeps the plugin's response as sent (the node once per ID), the container gets the node once
    (the kubelet de-duplicates device specs by container path) — the same view on both backends."""
    out = {}
    for s in shared_sides:
        pod = s.pods(gpus=REPLICAS, name="diff-shared", wait=True)
        raw = s.plugin.backend.read_checkpoint(s.plugin.node.name)
        assert raw is not None, f"{s.name}: no checkpoint"
        (entry,) = parse_checkpoint(raw).entries_for(pod.uid)
        stored = pb.ContainerAllocateResponse.FromString(entry.alloc_resp)
        out[s.name] = {**_pod_outcome(pod), "stored_device_nodes": sorted(d.container_path for d in stored.devices)}
    seen = _same(out, "pod holding both replicas of one GPU")
    assert len(seen["devices"]) == REPLICAS and len({d.split("::")[0] for d in seen["devices"]}) == 1, seen["devices"]
    assert seen["stored_device_nodes"].count("/dev/nvidia0") == REPLICAS, seen["stored_device_nodes"]
    assert [p for p, _ in seen["device_nodes"]].count("/dev/nvidia0") == 1, seen["device_nodes"]


def test_init_and_restartable_init_containers_share_devices_the_same_way(sides: tuple[Side, Side]) -> None:
    """Upstream's restartable-init pod: init-1 and sidecar-2 share a device, main gets another; checkpoint entries
    and pod-resources' containers read the same on both backends (as sets: the kubelet's order is random)."""
    out = {}
    for s in sides:
        body = s.pods.manifest(gpus=1, name="diff-init")
        res = s.plugin.resource_name

        def init(name: str, sidecar: bool) -> dict[str, Any]:
            c: dict[str, Any] = {
                "name": name,
                "image": body["spec"]["containers"][0]["image"],
                "command": ["sleep", "3600"] if sidecar else ["sh", "-c", "true"],
                "resources": {"limits": {res: "1"}},
            }
            if sidecar:
                c["restartPolicy"] = "Always"
            return c

        body["spec"]["initContainers"] = [init("init-1", False), init("sidecar-2", True)]
        pod = s.pods(manifest=body, wait=True)
        raw = s.plugin.backend.read_checkpoint(s.plugin.node.name)
        entries = parse_checkpoint(raw).entries_for(pod.uid) if raw else []
        held = {e.container_name: e.all_device_ids for e in entries}
        listed = sorted(
            (c.name, len(c.device_ids(res)))
            for p in s.plugin.node.pod_resources()
            if p.name == pod.name
            for c in p.containers
        )
        out[s.name] = {
            "phase": pod.phase,
            "containers": sorted(held),
            "sidecar_shares_init": held.get("sidecar-2") == held.get("init-1"),
            "main_apart": not set(held.get("main", [])) & set(held.get("sidecar-2", [])),
            "pod_resources": listed,
        }
    seen = _same(out, "pod with an init and a restartable init container")
    assert seen["sidecar_shares_init"] and seen["main_apart"], seen


def test_abrupt_kill_then_restart_reads_the_same(sides: tuple[Side, Side]) -> None:
    """SIGKILL (sim) / force-delete (kind) of the plugin with a pod running: 4/0, then started again 4/4, the
    pod keeps its device, a new pod gets another."""
    out = {}
    for s in sides:
        res = s.plugin.resource_name
        pod = s.pods(gpus=1, name="diff-kill", wait=True)
        held = pod.allocated_devices
        s.plugin.kill()
        down = wait_for(
            lambda: s.plugin.node.counts(res), lambda c: c == (4, 0), timeout=60, what=f"{s.name}: 4/0 after the kill"
        )
        s.plugin.start()
        up = wait_for(
            lambda: s.plugin.node.counts(res), lambda c: c == (4, 4), timeout=60, what=f"{s.name}: 4/4 after the start"
        )
        other = s.pods(gpus=1, name="diff-kill-2", wait=True)
        out[s.name] = (
            down,
            up,
            pod.phase,
            pod.allocated_devices == held,
            bool(set(other.allocated_devices) - set(held)),
        )
    seen = _same(out, "plugin killed and started again")
    assert seen[2:] == ("Running", True, True), seen
