"""The kubelet's DRA side wired into the embedded kubelet (``sim/dra/kubeletside.py`` + SimNode's hooks), against
fake drivers and a fake API: pods with claims start only once prepared, get the CDI edits, failed prepares are
retried with upstream's event, claims are unprepared when pods go (also while the kubelet was down), restarts
prepare again."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_devplug.api.drahealth import v1alpha1_pb2 as hpb
from pytest_devplug.sim.dra.kubeletside import DRATimings, NodeDRA
from pytest_devplug.sim.kubelet import SimNode

from ...support import wait_until
from .dra_fakes import FakeClaims, FakeDriver, FakeWiper, device, pod

DRIVER = "gpu.example.com"
CDI_ID = "k8s.gpu.example.com/gpu=gpu-0"


class FakeApi(FakeClaims, FakeWiper):
    def __init__(self) -> None:
        FakeClaims.__init__(self)
        FakeWiper.__init__(self)


class World:
    """One SimNode whose kubelet has a NodeDRA on a fake API; ``bound`` are the pods the API has bound to it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.api = FakeApi()
        self.bound: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.node = SimNode("node-1", root, control_plane=self)
        self.node.dra = NodeDRA(
            "node-1",
            root,
            self.api,
            endpoint_paths={},
            on_change=lambda: None,
            event_sink=lambda p, t, r, m: self.events.append((p["metadata"]["name"], r, m)),
            timings=DRATimings(retry_period=0.1, reconcile_period=0.2),
            logger=self.node.logger,
        )
        cdi = root / "etc-cdi"  # /etc/cdi: the fake driver writes no spec, so this one must outlive a reboot
        cdi.mkdir(parents=True, exist_ok=True)
        spec = {
            "cdiVersion": "0.6.0",
            "kind": "k8s.gpu.example.com/gpu",
            "devices": [{"name": "gpu-0", "containerEdits": {"env": ["GPU_DEVICE_0=gpu-0"]}}],
        }
        (cdi / "k8s.gpu.example.com-gpu.json").write_text(json.dumps(spec))
        self.node.start_kubelet()

    # the node's control plane (sim.kubelet.ControlPlaneLink): the pods in ``bound``, nothing published
    def pods_bound_to(self, node: str) -> list[dict[str, Any]]:
        return list(self.bound.values())

    def pod_bound(self, uid: str, node: str) -> bool:
        return uid in self.bound

    def set_pod_status(self, node: str, uid: str, status: dict[str, Any]) -> None:
        pass

    def record_event(self, node: str, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        pass

    def node_changed(self, node: str) -> None:
        pass

    @property
    def dra(self) -> NodeDRA:
        assert self.node.dra is not None
        return self.node.dra

    def pod_with_claim(
        self, driver: FakeDriver, name: str = "p", uid: str = "pod-uid-1", claim_uid: str = "claim-uid-1"
    ) -> dict[str, Any]:
        p = pod(name, uid, "c1")
        self.api.claim("c1", claim_uid, DRIVER, p)
        driver.devices[claim_uid] = [device("node-1", "gpu-0", CDI_ID, requests=("gpu",))]
        self.bound[uid] = p
        return p

    def running(self, uid: str) -> bool:
        status = self.node.pod_status(uid)
        return status is not None and status["phase"] == "Running"


@pytest.fixture
def world(dra_root: Path) -> Iterator[World]:
    w = World(dra_root)
    yield w
    w.node.close()


@pytest.fixture
def driver(dra_drivers: Callable[..., FakeDriver], world: World) -> FakeDriver:
    d = dra_drivers(DRIVER, health=True)
    wait_until("the fake driver registered and connected", lambda: world.dra.usable(DRIVER))
    return d


def test_pod_starts_once_its_claim_is_prepared_with_the_cdi_edits(world: World, driver: FakeDriver) -> None:
    p = world.pod_with_claim(driver)
    world.node.admit(p)
    wait_until("the pod running", lambda: world.running("pod-uid-1"))
    rec = world.node.container("pod-uid-1", "ctr")
    assert rec.options.cdi_devices == (CDI_ID,)
    assert rec.options.envs["GPU_DEVICE_0"] == "gpu-0"
    (info,) = world.dra.claim_infos()
    assert (info.claim_name, info.pod_uids) == ("c1", {"pod-uid-1"})
    assert [c.method for c in world.dra.calls] == ["NodePrepareResources"]


def test_failed_prepare_keeps_the_pod_pending_and_is_retried(world: World, driver: FakeDriver) -> None:
    p = world.pod_with_claim(driver)
    driver.claim_errors["claim-uid-1"] = "no GPU today"
    world.node.admit(p)
    wait_until(
        "two failed attempts", lambda: len([c for c in world.dra.calls if c.method == "NodePrepareResources"]) >= 2
    )
    status = world.node.pod_status("pod-uid-1")
    assert status is not None and status["phase"] == "Pending"
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert (
        "p",
        "FailedPrepareDynamicResources",
        "Failed to prepare dynamic resources: prepare dynamic resources: "
        "NodePrepareResources failed for ResourceClaim c1: no GPU today",
    ) in world.events
    assert world.dra.pending() == {
        "pod-uid-1": "prepare dynamic resources: NodePrepareResources failed for ResourceClaim c1: no GPU today"
    }
    del driver.claim_errors["claim-uid-1"]
    wait_until("the pod running after the retry", lambda: world.running("pod-uid-1"))
    assert world.dra.pending() == {}


def test_deleted_pod_is_unprepared_and_a_failed_unprepare_retried(world: World, driver: FakeDriver) -> None:
    p = world.pod_with_claim(driver)
    world.node.admit(p)
    wait_until("the pod running", lambda: world.running("pod-uid-1"))
    driver.unprepare_errors["claim-uid-1"] = "busy"
    del world.bound["pod-uid-1"]
    world.node.kill_pod("pod-uid-1")
    wait_until(
        "two failed unprepares", lambda: len([c for c in world.dra.calls if c.method == "NodeUnprepareResources"]) >= 2
    )
    assert [i.claim_name for i in world.dra.claim_infos()] == ["c1"]
    del driver.unprepare_errors["claim-uid-1"]
    wait_until("the claim unprepared", lambda: not world.dra.claim_infos())
    assert "claim-uid-1" not in driver.prepared


def test_pod_deleted_while_kubelet_down_is_unprepared_once_it_runs(world: World, driver: FakeDriver) -> None:
    p = world.pod_with_claim(driver)
    world.node.admit(p)
    wait_until("the pod running", lambda: world.running("pod-uid-1"))
    world.node.stop_kubelet()
    del world.bound["pod-uid-1"]
    world.node.kill_pod("pod-uid-1")
    assert [i.claim_name for i in world.dra.claim_infos()] == []  # the kubelet is down: nothing to ask
    world.node.start_kubelet()
    wait_until("the claim unprepared by the reconcile loop", lambda: "claim-uid-1" not in driver.prepared)
    assert not world.dra.claim_infos()


def test_restart_asks_nothing_for_a_running_pod_and_a_reboot_prepares_again(world: World, driver: FakeDriver) -> None:
    """Claims are prepared on the way to a new sandbox (``kuberuntime_manager.go``): a restart beside the running
    sandbox keeps the pod running without a call; a reboot, which takes the sandbox, prepares the claim again."""
    p = world.pod_with_claim(driver)
    world.node.admit(p)
    wait_until("the pod running", lambda: world.running("pod-uid-1"))

    def prepares() -> int:
        return len([c for c in world.dra.calls if c.method == "NodePrepareResources" and not c.error])

    first_id = world.node.container("pod-uid-1", "ctr").container_id
    world.node.restart_kubelet()  # returns once the pod is re-admitted: nothing was queued for it
    assert world.running("pod-uid-1") and not world.dra.pending() and prepares() == 1
    assert world.node.container("pod-uid-1", "ctr").container_id == first_id
    world.node.reboot()
    wait_until("the claim prepared again after the reboot", lambda: prepares() == 2)
    wait_until("the pod running again", lambda: world.running("pod-uid-1"))
    assert world.node.container("pod-uid-1", "ctr").container_id != first_id


def test_pod_created_and_deleted_while_kubelet_down_is_never_prepared(world: World, driver: FakeDriver) -> None:
    world.node.stop_kubelet()
    p = world.pod_with_claim(driver)
    world.node.admit(p)  # deferred: the kubelet is down
    del world.bound["pod-uid-1"]
    world.node.start_kubelet()
    wait_until("the driver registered again", lambda: world.dra.usable(DRIVER))
    assert not [c for c in world.dra.calls if "claim-uid-1" in c.claim_uids]


def test_health_reaches_the_claims_allocated_resources_status(world: World, driver: FakeDriver) -> None:
    p = world.pod_with_claim(driver)
    world.node.admit(p)
    wait_until("the pod running", lambda: world.running("pod-uid-1"))

    def claim_status() -> list[Any]:
        status = world.node.pod_status("pod-uid-1") or {}
        return list(status["containerStatuses"][0].get("allocatedResourcesStatus") or [])

    assert claim_status() == [{"name": "claim:c1", "resources": [{"resourceID": CDI_ID, "health": "Unknown"}]}]
    driver.send_health(("node-1", "gpu-0", hpb.UNHEALTHY))
    wait_until("Unhealthy in the pod status", lambda: claim_status()[0]["resources"][0]["health"] == "Unhealthy")


def test_refused_registration_is_retried(world: World, dra_drivers: Callable[..., FakeDriver]) -> None:
    world.dra.refuse_next_registration("refused on purpose")
    driver = dra_drivers(DRIVER)
    wait_until("registered after the refusal", lambda: world.dra.usable(DRIVER))
    failed = [e for e in world.node.registration_events() if e.kind == "failed"]
    assert [e.detail for e in failed] == [
        "RegisterPlugin error -- plugin validation failed with err: refused on purpose"
    ]
    assert driver.calls.statuses[0] == (False, failed[0].detail) and driver.calls.statuses[-1] == (True, "")


def test_blocked_prepare_keeps_the_pod_pending(world: World, driver: FakeDriver) -> None:
    """Upstream "must keep pod in pending state if NodePrepareResources times out": while the driver does not answer,
    the pod stays Pending (the other pods of the node are admitted meanwhile); it runs once the driver answers."""
    driver.prepare_gate.clear()
    try:
        world.node.admit(world.pod_with_claim(driver))
        other = pod("q", "pod-uid-2")
        other["spec"] = {"containers": [{"name": "ctr"}]}
        world.bound["pod-uid-2"] = other
        world.node.admit(other)
        assert world.running("pod-uid-2"), "a pod without claims waited for another pod's prepare"
        wait_until("the prepare in flight", lambda: "pod-uid-1" in world.dra.pending())
        status = world.node.pod_status("pod-uid-1")
        assert status is not None and status["phase"] == "Pending"
    finally:
        driver.prepare_gate.set()
    wait_until("the pod running once the driver answered", lambda: world.running("pod-uid-1"))


def test_kubelet_start_returns_once_its_slice_wipe_went_through(world: World) -> None:
    """The startup wipe runs in the background and is retried after 1 s when the API fails: the embedded kubelet's
    start returns only after it went through, so a driver started next never has its first slices wiped by it (a
    driver on kubeletplugin then publishes again only after its resync: up to a minute of a pod Pending)."""
    world.node.stop_kubelet()
    world.api.fail = 1
    started = time.monotonic()
    world.node.start_kubelet()
    assert time.monotonic() - started >= 0.9, "start_kubelet returned before the retried wipe"
    assert world.dra.wipes() == [None], world.dra.wipes()
