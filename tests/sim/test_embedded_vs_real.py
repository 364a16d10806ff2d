"""The embedded control plane (``EmbeddedPlane``) against the real one (``RealPlane`` on kube-apiserver, kube-scheduler
and kube-controller-manager v1.34): the same steps on both, and what a user sees must be the same.

The API-facing scenarios: pod validation and the extended-resource limits table, scheduling and its messages,
node status, events, admission failures. A drift in ``sim/apiserver.py`` or ``sim/scheduler.py`` fails here;
where the two differ, the real one is right. Runs in every ``nox -s tests`` (no Docker): the binaries come from
the same resolution as ``--devplug-control-plane real`` (``nox -s tests`` fills the cache first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from pytest_devplug.controlplane import ControlPlane
from pytest_devplug.sim.realplane import RealPlane
from pytest_devplug.sim.embeddedplane import EmbeddedPlane
from pytest_devplug.sim.controlplanes import SimControlPlane
from pytest_devplug.errors import ApiError

from ..support import control_plane_binaries
from ._helpers import GPU, allocatable, phase, pod, start_gpu_node, wait_for

Sides = dict[str, SimControlPlane]


@pytest.fixture(scope="module")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane(control_plane_binaries()) as cp:
        yield cp


@pytest.fixture
def sides(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Sides]:
    client = control_plane.client()
    try:
        with EmbeddedPlane() as embedded, RealPlane(client, timeout=20) as real:
            yield {"embedded": embedded, "real": real}
    finally:
        core = kubernetes.client.CoreV1Api(client)
        core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
        core.delete_collection_namespaced_event("default")
        client.close()


def _same(sides: Sides, what: str, observe: Callable[[SimControlPlane], Any]) -> Any:
    seen = {name: observe(c) for name, c in sides.items()}
    assert seen["embedded"] == seen["real"], f"{what} differs: embedded {seen['embedded']!r}, real {seen['real']!r}"
    return seen["real"]


def _outcome(c: SimControlPlane, manifest: dict[str, Any]) -> tuple[Any, ...]:
    try:
        created = c.create_pod(manifest)
    except ApiError as exc:
        return ("refused", exc.status, exc.reason, exc.message)
    return ("created", created["spec"]["containers"][0]["resources"])


LIMITS_TABLE = [
    ("limit-only", pod("limit-only", 1)),
    ("requests-only", pod("requests-only", None, requests=1)),
    ("unequal", pod("unequal", 1, requests=2)),
    ("non-integer", pod("non-integer", "500m")),
    ("fraction", pod("fraction", "1.5")),
    ("zero", pod("zero", 0)),
    ("leading-space", pod("leading-space", " 1")),
    ("trailing-newline", pod("trailing-newline", "1\n")),
    ("not-a-quantity", pod("not-a-quantity", "two")),
]


def test_pod_validation_and_the_limits_table(sides: Sides) -> None:
    for name, manifest in LIMITS_TABLE:
        _same(sides, f"the API server's answer to {name}", lambda c: _outcome(c, manifest))
    _same(sides, "a second pod of the same name", lambda c: _outcome(c, pod("limit-only", 1)))


def test_node_names_are_validated(sides: Sides) -> None:
    def add(c: SimControlPlane) -> tuple[Any, ...]:
        try:
            c.add_node("Bad_Name")
        except ApiError as exc:
            return (exc.status, exc.reason, exc.message)
        return ("added",)

    _same(sides, "the refusal of an invalid node name", add)


def _scheduled(c: SimControlPlane, name: str) -> tuple[str, str, str, str]:
    cond = next(x for x in c.get_pod(name)["status"].get("conditions", []) if x["type"] == "PodScheduled")
    return (c.get_pod(name)["status"]["phase"], cond["status"], cond.get("reason", ""), cond.get("message", ""))


def _event(c: SimControlPlane, pod_name: str, reason: str) -> tuple[str, str, str]:
    ev = wait_for(
        lambda: [e for e in c.events(namespace="default", involved_name=pod_name) if e["reason"] == reason],
        bool,
        f"a {reason} event of {pod_name}",
    )
    return (ev[-1]["type"], ev[-1]["reason"], ev[-1]["message"])


def test_scheduling_insufficient_then_bound_when_freed(sides: Sides, tmp_path: Path) -> None:
    for name, c in sides.items():
        start_gpu_node(c, "node-1", tmp_path / f"{name}.json", 1)
        c.create_pod(pod("a", 1))
        wait_for(lambda: phase(c, "a"), lambda v: v == "Running", f"{name}: a running")
        c.create_pod(pod("b", 1))
    wait_for(lambda: _scheduled(sides["real"], "b")[1], lambda v: v == "False", "real: b unschedulable")
    _same(sides, "the unschedulable pod's PodScheduled condition", lambda c: _scheduled(c, "b"))
    _same(sides, "the FailedScheduling event", lambda c: _event(c, "b", "FailedScheduling"))
    for name, c in sides.items():
        c.delete_pod("a")
        wait_for(lambda: phase(c, "b"), lambda v: v == "Running", f"{name}: b running once a is gone")
    _same(sides, "the Scheduled event", lambda c: _event(c, "b", "Scheduled"))


def test_scheduling_messages_for_taints_and_selectors(sides: Sides, tmp_path: Path) -> None:
    taint = {"key": "gpu", "value": "true", "effect": "NoSchedule"}
    for name, c in sides.items():
        start_gpu_node(c, "tainted", tmp_path / f"{name}-t.json", 1, taints=[taint])
        start_gpu_node(c, "pool-b", tmp_path / f"{name}-b.json", 1, labels={"pool": "b"})
        c.create_pod(pod("nowhere", 1, nodeSelector={"pool": "c"}))
        c.create_pod(pod("too-many", 2))
    for p in ("nowhere", "too-many"):
        wait_for(lambda: _scheduled(sides["real"], p)[1], lambda v: v == "False", f"real: {p} unschedulable")
        _same(sides, f"why {p} is not scheduled", lambda c: _scheduled(c, p))
    _same(
        sides,
        "where a selected pod goes",
        lambda c: c.create_pod(pod("sel", 1, nodeSelector={"pool": "b"}))["spec"].get("nodeName"),
    )


def test_node_status_follows_the_device_manager(sides: Sides, tmp_path: Path) -> None:
    nodes = {name: start_gpu_node(c, "node-1", tmp_path / f"{name}.json", 2) for name, c in sides.items()}
    _same(sides, "capacity/allocatable after registration", lambda c: allocatable(c, "node-1"))
    _same(sides, "the node's labels", lambda c: c.get_node("node-1")["metadata"]["labels"])
    for name, node in nodes.items():
        node.plugin().stop()
        wait_for(
            lambda: allocatable(sides[name], "node-1"),
            lambda v: v == ("2", "0"),
            f"{name}: 2/0 after the plugin stopped",
        )
    _same(sides, "capacity/allocatable once the plugin is gone", lambda c: allocatable(c, "node-1"))
    _same(
        sides,
        "the Ready condition",
        lambda c: [(x["type"], x["status"], x["reason"]) for x in c.get_node("node-1")["status"]["conditions"]],
    )


def test_kubelet_events_and_admission_failures(sides: Sides, tmp_path: Path) -> None:
    for name, c in sides.items():
        start_gpu_node(c, "node-1", tmp_path / f"{name}.json", 1)
        c.create_pod(pod("ok", 1))
        wait_for(lambda: phase(c, "ok"), lambda v: v == "Running", f"{name}: ok running")
        c.create_pod(pod("pinned", 2, node_name="node-1"))
        wait_for(lambda: phase(c, "pinned"), lambda v: v == "Failed", f"{name}: pinned rejected")
    _same(
        sides, "the kubelet's events of a started pod", lambda c: [_event(c, "ok", r) for r in ("Created", "Started")]
    )

    def rejection(c: SimControlPlane) -> tuple[Any, ...]:
        st = c.get_pod("pinned")["status"]
        return (st["phase"], st.get("reason"), st.get("message"), _event(c, "pinned", st.get("reason", "")))

    _same(sides, "the admission failure of a pod bound past the scheduler", rejection)
    _same(sides, "deleting a pod that is not there", lambda c: _outcome_of(lambda: c.delete_pod("nope")))


def _outcome_of(fn: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        fn()
    except ApiError as exc:  # the type too: the backend maps NotFoundError, and only it, to ObjectNotFoundError
        return (type(exc).__name__, exc.status, exc.reason, exc.message)
    return ("ok",)


def test_resource_name_is_listed_on_the_real_node(sides: Sides, tmp_path: Path) -> None:
    """What a person sees with kubectl: the Node object carries the device plugin's resource."""
    start_gpu_node(sides["real"], "node-1", tmp_path / "s.json", 2)
    node = sides["real"].get_node("node-1")
    assert (node["status"]["capacity"][GPU], node["status"]["allocatable"][GPU]) == ("2", "2")


def test_a_pod_deleted_gracefully_by_another_client_is_stopped_and_removed(
    control_plane: ControlPlane, sides: Sides, tmp_path: Path
) -> None:
    """A graceful delete from another client (an eviction controller, ``kubectl delete``) only sets the pod's
    ``deletionTimestamp``; the node's kubelet stops the pod and removes the object (grace 0, its UID as the
    precondition). Without that the pod stays Terminating for good and its device is never freed."""
    real = sides["real"]
    node = start_gpu_node(real, "node-1", tmp_path / "real.json", 1)
    uid = real.create_pod(pod("doomed", 1))["metadata"]["uid"]
    wait_for(lambda: phase(real, "doomed"), lambda v: v == "Running", "doomed running")
    with control_plane.client() as client:  # another client than the plane's own
        kubernetes.client.CoreV1Api(client).delete_namespaced_pod("doomed", "default", grace_period_seconds=30)

    def present() -> bool:
        try:
            real.get_pod("doomed")
        except ApiError:
            return False
        return True

    wait_for(present, lambda there: not there, "the gracefully deleted pod removed by its kubelet", timeout=15)
    assert uid not in node.active_pod_uids(), "the kubelet still runs the deleted pod"
    real.create_pod(pod("next", 1))
    wait_for(lambda: phase(real, "next"), lambda v: v == "Running", "the next pod running on the freed GPU")
