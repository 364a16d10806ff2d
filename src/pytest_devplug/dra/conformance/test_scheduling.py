"""What the scheduler does with the driver's slices: no allocation beyond what they describe, one allocation shared.

The real kube-scheduler allocates claims from the published ResourceSlices: a claim no published device can
satisfy leaves its pod unschedulable (the driver is never asked), and a claim shared by pods is allocated and
prepared once, then unprepared when its last pod goes.
"""

from __future__ import annotations

from pytest_devplug.dra.assertions import assert_claim_prepared
from pytest_devplug.dra.handles import ClaimFactory, DriverHandle

from ._support import consistently, succeeded, waited

#: What kube-scheduler's DynamicResources plugin says of a node whose devices cannot satisfy a pod's claims.
UNSCHEDULABLE_TEXT = "cannot allocate all claims"


def test_unsatisfiable_claim_stays_unschedulable(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """A claim for one device more than the driver publishes: the pod stays Pending and unbound with the scheduler's
    ``Unschedulable`` condition naming the claims, the claim stays unallocated, and the driver is never asked."""
    n = len(devplug_driver.devices())
    claim = devplug_claims.claim(count=n + 1)
    pod = devplug_claims.pod([claim])
    cond = waited(lambda: pod.scheduled_condition or {}, lambda c: c.get("status") == "False",
                  "the scheduler's PodScheduled=False condition", driver=devplug_driver)  # fmt: skip
    assert cond.get("reason") == "Unschedulable", f"PodScheduled condition {cond}"
    assert UNSCHEDULABLE_TEXT in str(cond.get("message")), f"the scheduler says {cond.get('message')!r}, not {UNSCHEDULABLE_TEXT!r}"
    consistently(lambda: (pod.phase, pod.node_name, claim.allocation), lambda s: s == ("Pending", None, None),
                 f"the pod Pending and unbound, its claim for {n + 1} devices unallocated")  # fmt: skip
    uid = claim.uid
    asked = [c for c in devplug_driver.node.dra_calls(driver=devplug_driver.name) if uid in c.claim_uids]
    assert not asked, f"the driver was asked about an unallocated claim: {asked}"


def test_shared_claim(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """Two pods naming one ResourceClaim run on its one allocation: the kubelet prepares it once, both pods are in its
    checkpoint entry and get the same CDI devices; deleting one pod unprepares nothing, deleting the last one
    unprepares the claim."""
    node = devplug_driver.node
    claim = devplug_claims.claim()
    first = devplug_claims.pod([claim], wait=True)
    second = devplug_claims.pod([claim], wait=True)
    (a,) = assert_claim_prepared(first, devplug_driver)
    (b,) = assert_claim_prepared(second, devplug_driver)
    assert b.pod_uids == {first.uid, second.uid}, f"the claim's pods are {sorted(b.pod_uids)}, want both {first.uid}, {second.uid}"
    assert sorted(first.cdi_devices) == sorted(second.cdi_devices), f"pods sharing a claim got {first.cdi_devices} and {second.cdi_devices}"
    uid = claim.uid
    prepares = succeeded(devplug_driver, "NodePrepareResources", uid)
    assert len(prepares) == 1, f"a shared claim is prepared once; the kubelet prepared it {len(prepares)} times"
    since = len(node.dra_calls())
    first.delete()
    waited(lambda: claim.prepared(), lambda p: p is not None and p.pod_uids == {second.uid},
           f"only pod {second.uid} left in the claim's checkpoint entry", driver=devplug_driver)  # fmt: skip
    unprepared = [c for c in node.dra_calls("NodeUnprepareResources", since=since) if uid in c.claim_uids]
    assert not unprepared, f"the claim was unprepared while pod {second.name} still uses it: {unprepared}"
    second.delete()
    waited(lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since), bool,
           "the claim unprepared once its last pod was deleted", driver=devplug_driver)  # fmt: skip
    assert a.claim_uid == b.claim_uid == uid
