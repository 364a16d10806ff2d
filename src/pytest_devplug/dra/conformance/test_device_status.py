"""What a driver writes into a ResourceClaim's ``status.devices`` (KEP 4817: DRAResourceClaimDeviceStatus, beta and
on from 1.33, GA in 1.37).

The list is shared: the scheduler's binding-condition controllers set conditions on a device's entry, a network
driver its ``networkData``, another driver of the same claim its own entries. A driver may change only what is its
own: its devices' entries, and of those only its fields. A driver that sets the whole list (an ``UpdateStatus`` of
``status.devices = mine``) drops what others wrote, binding conditions included, so a pod waiting on them never binds.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from pytest_devplug.dra.assertions import assert_claim_prepared, assert_driver_registered
from pytest_devplug.dra.handles import ClaimFactory, ClaimHandle, DriverHandle
from pytest_devplug.dra.objects import RESOURCE_API
from pytest_devplug.errors import WaitTimeout
from pytest_devplug.waiting import wait_for

from ._support import waited

#: The condition the check writes on the claim's devices before the driver prepares it, as a controller would.
OBSERVED = "DevplugObserved"
#: How long after the claim is prepared the check waits for the driver's write (drivers write while preparing).
DRIVER_WRITE_S = 2.0
#: What identifies an entry of ``status.devices`` (``shareID``: one share of a device allocated several times).
ENTRY_KEY = ("driver", "pool", "device", "shareID")


def _key(entry: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(entry.get(k, "")) for k in ENTRY_KEY)


def _observed(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per allocated device, carrying only :data:`OBSERVED` (what another writer leaves there)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": OBSERVED,
        "status": "True",
        "reason": "WrittenBeforePrepare",
        "message": "written by pytest-devplug before the driver prepared the claim; the driver must keep it",
        "lastTransitionTime": now,
    }
    return [{**{k: r[k] for k in ENTRY_KEY if k in r}, "conditions": [condition]} for r in results]


def _status_devices(claim: ClaimHandle) -> list[dict[str, Any]]:
    return list((claim.obj.get("status") or {}).get("devices") or [])


@pytest.mark.devplug_disruptive
def test_device_status_keeps_what_others_wrote(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """The claim is allocated while the kubelet is down, and the check writes a condition (:data:`OBSERVED`) on each of
    its devices' ``status.devices`` entries, as a binding-condition controller does; then the kubelet runs and the
    driver prepares the claim. Whatever the driver writes there, the condition must still be there afterwards, and
    every entry it wrote must name a device the claim's allocation gives this driver. A driver that writes nothing
    into ``status.devices`` within :data:`DRIVER_WRITE_S` of the prepare skips the check, saying so."""
    node = devplug_driver.node
    node.require_gate("DRAResourceClaimDeviceStatus", "the devices' status in a ResourceClaim")
    claim = devplug_claims.claim()
    node.stop_kubelet()
    try:
        pod = devplug_claims.pod([claim])
        waited(lambda: pod.node_name or "", bool, f"pod {pod.name} bound to a node", driver=devplug_driver)
        allocation = claim.allocation or {}
        results = [
            r for r in (allocation.get("devices") or {}).get("results") or [] if r.get("driver") == devplug_driver.name
        ]
        assert results, f"the scheduler bound pod {pod.name} with no device of {devplug_driver.name}: {allocation}"
        theirs = _observed(results)
        path = f"{RESOURCE_API}/namespaces/{claim.namespace}/resourceclaims/{claim.name}/status"
        # as the API server keeps it (what the driver's write is told apart from)
        stored = (devplug_claims.rest.patch(path, {"status": {"devices": theirs}}).get("status") or {}).get("devices")
    finally:
        node.start_kubelet()
    assert_driver_registered(devplug_driver, node.reregistration_timeout)
    assert_claim_prepared(pod, devplug_driver, timeout=node.reregistration_timeout)
    try:
        after = wait_for(
            lambda: _status_devices(claim),
            lambda now: now != stored,
            timeout=DRIVER_WRITE_S,
            what=f"{devplug_driver.name} writing claim {claim.name}'s status.devices",
        )
    except WaitTimeout:
        pytest.skip(
            f"{devplug_driver.name} writes nothing into a claim's status.devices (within {DRIVER_WRITE_S:g} s of "
            f"preparing claim {claim.name}): no device status to judge"
        )
    allocated = {_key(r) for r in results}
    for entry in theirs:
        kept = [e for e in after if _key(e) == _key(entry)]
        conditions = [c for e in kept for c in e.get("conditions") or [] if c.get("type") == OBSERVED]
        assert conditions, (
            f"{devplug_driver.name} wrote claim {claim.name}'s status.devices and dropped what another writer had put "
            f"there: the {OBSERVED} condition on device {entry['pool']}/{entry['device']}. status.devices now: "
            f"{after}. A driver may change only its own fields of its own entries (merge them into what is there, "
            "or apply them server-side under its own field manager): binding conditions and other drivers' entries "
            "live in the same list"
        )
    strangers = [e for e in after if e.get("driver") == devplug_driver.name and _key(e) not in allocated]
    assert not strangers, (
        f"{devplug_driver.name} wrote status.devices entries of claim {claim.name} for devices the claim's allocation "
        f"does not give it: {strangers}; allocated to it: {results}"
    )
