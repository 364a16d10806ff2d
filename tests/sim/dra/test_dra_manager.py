"""The DRA manager: prepare / unprepare for pods against fake drivers, the checkpoint it keeps, what
containers get, and health -> allocatedResourcesStatus."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from .dra_fakes import FakeClaims, FakeDriver, device, pod

from pytest_devplug.api.drahealth import v1alpha1_pb2 as hpb
from pytest_devplug.kubeletmodel import dracheckpoint as cp
from pytest_devplug.errors import DRAManagerError, DRAPluginCallError, DRAPrepareError
from pytest_devplug.sim.dra.manager import DRAManager
from pytest_devplug.waiting import wait_for

T = 10.0
DRIVER = "gpu.example.com"


@pytest.fixture
def driver(dra_kubelet: Any, dra_drivers: Callable[..., FakeDriver]) -> FakeDriver:
    d = dra_drivers(DRIVER, health=True)
    wait_for(lambda: dra_kubelet.plugins.usable(DRIVER), bool, timeout=T, what="the driver registered and connected")
    return d


def _checkpoint(k: Any) -> list[cp.ClaimInfoState]:
    return cp.read_checkpoint(k.manager.checkpoint_path) or []


def test_prepare_is_done_once_and_checkpointed(dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims) -> None:
    p = pod("p", "pod-1", "c")
    dra_claims.claim("c", "claim-1", DRIVER, p)
    driver.devices["claim-1"] = [device("node-1", "gpu-0", "example.com/gpu=gpu-0", requests=("gpu",))]
    dra_kubelet.manager.prepare_resources(p)
    dra_kubelet.manager.prepare_resources(p)  # the pod worker syncs again: nothing new to prepare
    assert driver.calls.dra == [("v1", "prepare", ["claim-1"])]
    (entry,) = _checkpoint(dra_kubelet)
    assert (entry.claim_uid, entry.claim_name, entry.namespace, entry.pod_uids) == (
        "claim-1",
        "c",
        "default",
        {"pod-1"},
    )
    assert entry.driver_state == {DRIVER: [cp.PreparedDevice("node-1", "gpu-0", ["gpu"], ["example.com/gpu=gpu-0"])]}
    assert dra_kubelet.manager.container_cdi_devices(p, "ctr") == ["example.com/gpu=gpu-0"]


def test_after_kubelet_restart_prepare_is_called_again_and_unprepare_still_works(
    dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims
) -> None:
    p = pod("p", "pod-1", "c")
    dra_claims.claim("c", "claim-1", DRIVER, p)
    dra_kubelet.manager.prepare_resources(p)
    before = dra_kubelet.manager.checkpoint_path.read_bytes()
    dra_kubelet.restart()
    assert dra_kubelet.manager.checkpoint_path.read_bytes() == before  # restored, not rewritten
    assert dra_kubelet.manager.pod_might_need_to_unprepare("pod-1")
    assert not dra_kubelet.manager.prepared("default", "c")
    wait_for(lambda: dra_kubelet.plugins.usable(DRIVER), bool, timeout=T, what="re-registered after the restart")
    dra_kubelet.manager.prepare_resources(p)
    assert [c[1] for c in driver.calls.dra] == ["prepare", "prepare"]  # drivers must be idempotent
    dra_kubelet.manager.unprepare_resources(p)
    dra_kubelet.manager.unprepare_resources(p)  # again: nothing left to do
    assert [c[1] for c in driver.calls.dra] == ["prepare", "prepare", "unprepare"]
    assert _checkpoint(dra_kubelet) == [] and driver.prepared == set()


def test_shared_claim_is_unprepared_with_its_last_pod(
    dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims
) -> None:
    a, b = pod("a", "pod-a", "shared"), pod("b", "pod-b", "shared")
    dra_claims.claim("shared", "claim-s", DRIVER, a, b)
    dra_kubelet.manager.prepare_resources(a)
    dra_kubelet.manager.prepare_resources(b)
    assert driver.calls.dra == [("v1", "prepare", ["claim-s"])]
    assert _checkpoint(dra_kubelet)[0].pod_uids == {"pod-a", "pod-b"}
    dra_kubelet.manager.unprepare_resources(a)
    assert len(driver.calls.dra) == 1
    dra_kubelet.manager.unprepare_resources(b)
    assert driver.calls.dra[-1] == ("v1", "unprepare", ["claim-s"])
    assert _checkpoint(dra_kubelet) == []


def test_reconcile_unprepares_pods_deleted_while_the_kubelet_was_down(
    dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims
) -> None:
    p = pod("p", "pod-1", "c")
    dra_claims.claim("c", "claim-1", DRIVER, p)
    dra_kubelet.manager.prepare_resources(p)
    dra_kubelet.restart()
    wait_for(lambda: dra_kubelet.plugins.usable(DRIVER), bool, timeout=T, what="re-registered")
    assert dra_kubelet.manager.reconcile(active_pod_uids=set()) == []
    assert driver.calls.dra[-1] == ("v1", "unprepare", ["claim-1"])
    assert _checkpoint(dra_kubelet) == []


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("unreserved", "pod p (pod-1) is not allowed to use ResourceClaim c (claim-1)"),
        ("unallocated", "ResourceClaim c: not allocated"),
        ("missing", 'fetch ResourceClaim c: resourceclaims.resource.k8s.io "c" not found'),
        ("unregistered", "DRA driver other.example.com is not registered"),
    ],
)
def test_validation_failures_change_nothing(
    dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims, setup: str, message: str
) -> None:
    p = pod("p", "pod-1", "c")
    if setup == "unreserved":
        dra_claims.claim("c", "claim-1", DRIVER)
    elif setup == "unallocated":
        dra_claims.claim("c", "claim-1", DRIVER, p, allocated=False)
    elif setup == "unregistered":
        dra_claims.claim("c", "claim-1", "other.example.com", p)
    with pytest.raises(DRAPrepareError) as err:
        dra_kubelet.manager.prepare_resources(p)
    assert str(err.value) == f"prepare dynamic resources: {message}"
    assert driver.calls.dra == [] and _checkpoint(dra_kubelet) == []
    assert not dra_kubelet.manager.pod_might_need_to_unprepare("pod-1")


def test_claim_from_a_template_must_be_owned_by_the_pod(
    dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims
) -> None:
    p = pod("p", "pod-1")
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "tmpl"}]
    p["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    with pytest.raises(DRAPrepareError, match='pod "default/p": ResourceClaim not created yet'):
        dra_kubelet.manager.prepare_resources(p)
    p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]}
    dra_claims.claim("p-gpu-x1", "claim-t", DRIVER, p)
    with pytest.raises(DRAPrepareError, match="not created for pod default/p"):
        dra_kubelet.manager.prepare_resources(p)
    dra_claims.claim("p-gpu-x1", "claim-t", DRIVER, p, owner=p)
    dra_kubelet.manager.prepare_resources(p)
    assert driver.calls.dra == [("v1", "prepare", ["claim-t"])]
    p["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = None  # no claim needed
    assert dra_kubelet.manager.container_cdi_devices(p, "ctr") == []


def test_driver_failures_fail_the_prepare_and_a_retry_finishes_it(
    dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims
) -> None:
    p = pod("p", "pod-1", "c1", "c2")
    dra_claims.claim("c1", "claim-1", DRIVER, p)
    dra_claims.claim("c2", "claim-2", DRIVER, p)
    driver.devices["claim-1"] = [device("node-1", "gpu-0", "example.com/gpu=gpu-0")]
    driver.claim_errors["claim-2"] = "device busy"
    with pytest.raises(DRAPrepareError, match="NodePrepareResources failed for ResourceClaim c2: device busy"):
        dra_kubelet.manager.prepare_resources(p)
    # the pod is tracked before the driver was called, so a deleted pod can still be unprepared
    assert {e.claim_name for e in _checkpoint(dra_kubelet)} == {"c1", "c2"}
    del driver.claim_errors["claim-2"]
    driver.skip.add("claim-2")
    with pytest.raises(DRAPrepareError, match="NodePrepareResources skipped 1 ResourceClaims"):
        dra_kubelet.manager.prepare_resources(p)
    driver.skip.clear()
    dra_kubelet.manager.prepare_resources(p)
    assert driver.calls.dra[-1] == ("v1", "prepare", ["claim-1", "claim-2"])
    devices = {e.claim_name: e.driver_state for e in _checkpoint(dra_kubelet)}
    assert devices["c1"] == {
        DRIVER: [cp.PreparedDevice("node-1", "gpu-0", None, ["example.com/gpu=gpu-0"])]
    }  # kept once
    assert dra_kubelet.manager.prepared("default", "c1") and dra_kubelet.manager.prepared("default", "c2")


def test_a_gone_driver_fails_unprepare_and_the_claim_stays_tracked(
    dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims
) -> None:
    p = pod("p", "pod-1", "c")
    dra_claims.claim("c", "claim-1", DRIVER, p)
    dra_kubelet.manager.prepare_resources(p)
    plugin = dra_kubelet.plugins.get_plugin(DRIVER)
    driver.stop()
    wait_for(
        lambda: dra_kubelet.plugins.registered(), lambda r: DRIVER not in r, timeout=T, what="the driver deregistered"
    )
    # the store forgets the plugin before it closes the plugin's connection: wait for both
    wait_for(lambda: plugin.closed, bool, timeout=T, what="the gone driver's connection closed")
    with pytest.raises(
        DRAPrepareError, match="unprepare dynamic resources: DRA driver gpu.example.com is not registered"
    ):
        dra_kubelet.manager.unprepare_resources(p)
    assert _checkpoint(dra_kubelet)[0].pod_uids == {"pod-1"}  # kept for the retry
    # a call that was already on its way when the plugin went away fails as grpc-go's closed connection does
    with pytest.raises(DRAPluginCallError, match="code = Canceled desc = grpc: the client connection is closing"):
        plugin.node_unprepare_resources([])


def test_corrupt_checkpoint_stops_the_manager(dra_kubelet: Any, dra_claims: FakeClaims) -> None:
    path = dra_kubelet.manager.checkpoint_path
    doc = json.loads(path.read_text())
    doc["Checksum"] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(DRAManagerError, match="checksum mismatch"):
        DRAManager(path.parent, dra_kubelet.plugins, dra_claims)


def test_health_reaches_allocated_resources_status(
    dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims
) -> None:
    p = pod("p", "pod-1", "c", request="gpu")
    dra_claims.claim("c", "claim-1", DRIVER, p)
    driver.devices["claim-1"] = [
        device("node-1", "gpu-0", "example.com/gpu=gpu-0", requests=("gpu",)),
        device("node-1", "gpu-1"),
    ]
    dra_kubelet.manager.prepare_resources(p)

    def status() -> list[dict[str, Any]]:
        return dra_kubelet.manager.allocated_resources_status(p, "ctr")

    assert status() == [
        {
            "name": "claim:c/gpu",
            "resources": [
                {"resourceID": "example.com/gpu=gpu-0", "health": "Unknown"},
                {"resourceID": f"{DRIVER}/node-1/gpu-1", "health": "Unknown"},
            ],
        }
    ]
    driver.send_health(("node-1", "gpu-0", hpb.UNHEALTHY), ("node-1", "gpu-1", hpb.HEALTHY))
    seen = wait_for(
        status, lambda s: s[0]["resources"][0]["health"] == "Unhealthy", timeout=T, what="Unhealthy reported"
    )
    assert [r["health"] for r in seen[0]["resources"]] == ["Unhealthy", "Healthy"]
    driver.end_health_stream()
    wait_for(
        status,
        lambda s: {r["health"] for r in s[0]["resources"]} == {"Unknown"},
        timeout=T,
        what="Unknown after the stream ended",
    )
    # the kubelet opens the stream again (every 5 s upstream; 0.1 s here)
    wait_for(lambda: driver.calls.health_streams, lambda n: n >= 2, timeout=T, what="the stream re-opened")
    driver.send_health(("node-1", "gpu-0", hpb.HEALTHY))
    wait_for(status, lambda s: s[0]["resources"][0]["health"] == "Healthy", timeout=T, what="Healthy again")


@pytest.mark.parametrize("messages", [True, False], ids=["ResourceHealthStatusMessage-on", "off"])
def test_health_message_reaches_the_status_only_with_its_gate(
    dra_kubelet: Any, driver: FakeDriver, dra_claims: FakeClaims, messages: bool
) -> None:
    """A device's health message goes into ``allocatedResourcesStatus`` only with ResourceHealthStatusMessage (on
    by default from 1.36; 1.35 has no such field)."""
    dra_kubelet.manager.health_messages = messages
    p = pod("p", "pod-1", "c")
    dra_claims.claim("c", "claim-1", DRIVER, p)
    driver.devices["claim-1"] = [device("node-1", "gpu-0", "example.com/gpu=gpu-0")]
    dra_kubelet.manager.prepare_resources(p)
    driver.send_health(("node-1", "gpu-0", hpb.UNHEALTHY, "Xid 79: fell off the bus"))
    (entry,) = wait_for(
        lambda: dra_kubelet.manager.allocated_resources_status(p, "ctr"),
        lambda s: s[0]["resources"][0]["health"] == "Unhealthy",
        timeout=T,
        what="Unhealthy reported",
    )
    want = {"resourceID": "example.com/gpu=gpu-0", "health": "Unhealthy"}
    assert entry["resources"] == [{**want, "message": "Xid 79: fell off the bus"} if messages else want]
