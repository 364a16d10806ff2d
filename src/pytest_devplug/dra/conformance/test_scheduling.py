"""What the scheduler does with the driver's slices: no allocation beyond what they describe, one allocation shared,
none of a tainted device.

The real kube-scheduler allocates claims from the published ResourceSlices: a claim no published device can
satisfy leaves its pod unschedulable (the driver is never asked), a claim shared by pods is allocated and
prepared once, then unprepared when its last pod goes, and a device with a ``NoSchedule`` taint goes only to a
claim that tolerates it.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_devplug.dra.assertions import assert_claim_prepared
from pytest_devplug.dra.handles import ClaimFactory, DriverHandle
from pytest_devplug.dra.objects import RESOURCE_API
from pytest_devplug.errors import ObjectNotFoundError, RestError, WaitTimeout
from pytest_devplug.waiting import wait_for

from ._support import UNSCHEDULABLE_TEXT, consistently, devices_together, scheduled_condition, succeeded, waited

#: The taint the device-taint check puts on the driver's devices, and the toleration of it.
TAINT = {"key": "devplug.example/conformance", "value": "tainted", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
#: How long the check waits for kube-controller-manager to report a DeviceTaintRule before going on without.
RULE_SEEN_S = 10.0


def test_unsatisfiable_claim_stays_unschedulable(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """A claim for one device more than the driver publishes: the pod stays Pending and unbound with the scheduler's
    ``Unschedulable`` condition naming the claims, the claim stays unallocated, and the driver is never asked."""
    n = len(devplug_driver.devices())
    claim = devplug_claims.claim(count=n + 1)
    pod = devplug_claims.pod([claim])
    cond = waited(
        lambda: pod.scheduled_condition or {},
        lambda c: c.get("status") == "False",
        "the scheduler's PodScheduled=False condition",
        driver=devplug_driver,
    )
    assert cond.get("reason") == "Unschedulable", f"PodScheduled condition {cond}"
    assert UNSCHEDULABLE_TEXT in str(cond.get("message")), (
        f"the scheduler says {cond.get('message')!r}, not {UNSCHEDULABLE_TEXT!r}"
    )
    consistently(
        lambda: (pod.phase, pod.node_name, claim.allocation),
        lambda s: s == ("Pending", None, None),
        f"the pod Pending and unbound, its claim for {n + 1} devices unallocated",
    )
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
    assert b.pod_uids == {first.uid, second.uid}, (
        f"the claim's pods are {sorted(b.pod_uids)}, want both {first.uid}, {second.uid}"
    )
    assert sorted(first.cdi_devices) == sorted(second.cdi_devices), (
        f"pods sharing a claim got {first.cdi_devices} and {second.cdi_devices}"
    )
    uid = claim.uid
    prepares = succeeded(devplug_driver, "NodePrepareResources", uid)
    assert len(prepares) == 1, f"a shared claim is prepared once; the kubelet prepared it {len(prepares)} times"
    since = len(node.dra_calls())
    first.delete()
    waited(
        lambda: claim.prepared(),
        lambda p: p is not None and p.pod_uids == {second.uid},
        f"only pod {second.uid} left in the claim's checkpoint entry",
        driver=devplug_driver,
    )
    unprepared = [c for c in node.dra_calls("NodeUnprepareResources", since=since) if uid in c.claim_uids]
    assert not unprepared, f"the claim was unprepared while pod {second.name} still uses it: {unprepared}"
    second.delete()
    waited(
        lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since),
        bool,
        "the claim unprepared once its last pod was deleted",
        driver=devplug_driver,
    )
    assert a.claim_uid == b.claim_uid == uid


def test_devices_prepared_again_for_a_new_claim_after_cleanup(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle
) -> None:
    """KEP-5970's resource reuse: a claim for every device the driver publishes on the node runs its pod; once the
    pod and the claim are gone (the claim unprepared), a new claim for the same devices is allocated, prepared and
    runs. A driver that keeps an unprepared device marked in use refuses the second prepare. Devices that share
    counters (a GPU and its partitions) cannot all be allocated at once: the claim then asks for as many as the
    counters allow together."""
    n = len(devices_together(devplug_driver))
    first = devplug_claims.claim(count=n)
    pod = devplug_claims.pod([first], wait=True)
    assert_claim_prepared(pod, devplug_driver)
    used = sorted(f"{d.pool}/{d.device}" for d in first.allocated)
    uid, since = first.uid, len(devplug_driver.node.dra_calls())
    pod.delete_and_wait_gone()
    waited(
        lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since),
        bool,
        f"claim {first.name} for all {n} devices unprepared after its pod was deleted",
        driver=devplug_driver,
    )
    first.delete()
    second = devplug_claims.claim(count=n)
    again = devplug_claims.pod([second], wait=True)
    assert_claim_prepared(again, devplug_driver)
    reused = sorted(f"{d.pool}/{d.device}" for d in second.allocated)
    assert reused == used, f"a second claim for all {n} devices got {reused}; the first one had {used}"


def _rule_seen(driver: DriverHandle, rule: str) -> None:
    """Wait until kube-controller-manager's device-taint-eviction controller reported on ``rule`` (its
    ``EvictionInProgress`` condition of the rule's generation): the rule reached the informers watching
    DeviceTaintRules, the scheduler's among them. Where that controller does not run, go on after
    :data:`RULE_SEEN_S`: the scheduler's informer gets a new object within milliseconds."""

    def observed() -> bool:
        obj: dict[str, Any] = driver.dra.rest.get(f"{RESOURCE_API}/devicetaintrules/{rule}")
        gen = (obj.get("metadata") or {}).get("generation")
        return any(
            c.get("type") == "EvictionInProgress" and c.get("observedGeneration") == gen
            for c in (obj.get("status") or {}).get("conditions") or []
        )

    try:
        wait_for(
            observed, bool, timeout=RULE_SEEN_S, what=f"kube-controller-manager to report on DeviceTaintRule {rule}"
        )
    except WaitTimeout:
        return


def test_device_taint_keeps_claims_off_tainted_devices(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle
) -> None:
    """Device taints (DRADeviceTaintRules, GA in 1.37): with a ``NoSchedule`` DeviceTaintRule on the driver's devices
    on this node, a claim that does not tolerate it is not allocated (its pod stays Pending, Unschedulable, and the
    driver is never asked), a claim that tolerates it is allocated, prepared and runs, and once the rule is gone the
    first pod runs too. NVIDIA's DRA driver reports unhealthy GPUs as such taints; a scheduler one release behind its
    API server (1.36 has the rules off) hands tainted devices out."""
    node = devplug_driver.node
    node.require_gate("DRADeviceTaintRules", "DeviceTaintRules the scheduler honours")
    pools = sorted({s.pool for s in devplug_driver.slices()})
    assert pools, f"driver {devplug_driver.name} publishes no ResourceSlice on node {node.name}"
    try:
        rules = [devplug_claims.taint_rule(pool, TAINT) for pool in pools]
    except RestError as exc:
        if exc.not_found:
            pytest.skip(f"the API server serves no resource.k8s.io/v1 DeviceTaintRules ({exc})")
        raise
    for rule in rules:
        _rule_seen(devplug_driver, rule)
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim])
    cond = scheduled_condition(pod, devplug_driver)
    allocated = [f"{d.pool}/{d.device}" for d in claim.allocated]
    assert not allocated, (
        f"the scheduler allocated {', '.join(allocated)} to claim {claim.name}, which does not tolerate the "
        f"{TAINT['key']}={TAINT['value']}:{TAINT['effect']} taint of DeviceTaintRule(s) {', '.join(rules)} on every "
        f"device of {devplug_driver.name} in pool(s) {', '.join(pools)} (PodScheduled {cond.get('status')})"
    )
    assert cond.get("reason") == "Unschedulable", f"PodScheduled condition {cond}"
    assert UNSCHEDULABLE_TEXT in str(cond.get("message")), (
        f"the scheduler says {cond.get('message')!r}, not {UNSCHEDULABLE_TEXT!r}"
    )
    consistently(
        lambda: (pod.phase, pod.node_name, claim.allocation),
        lambda s: s == ("Pending", None, None),
        "the pod Pending and unbound, its claim unallocated while every device is tainted",
    )
    uid = claim.uid
    asked = [c for c in node.dra_calls(driver=devplug_driver.name) if uid in c.claim_uids]
    assert not asked, f"the driver was asked about a claim the taint keeps unallocated: {asked}"

    tolerant = devplug_claims.claim(tolerations=[TOLERATION])
    runs = devplug_claims.pod([tolerant], wait=True)
    assert_claim_prepared(runs, devplug_driver)
    runs.delete()
    tolerant.delete()  # frees its device for the first pod on a one-device driver
    for rule in rules:
        devplug_claims.untaint(rule)
    pod.wait_running()
    assert_claim_prepared(pod, devplug_driver)


#: The taint the eviction check puts on the driver's devices: every pod using one without tolerating it is evicted.
EVICT = {"key": "devplug.example/conformance", "value": "evict", "effect": "NoExecute"}


def test_noexecute_taint_evicts_the_pod_and_unprepares_its_claim(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle
) -> None:
    """Device taints with effect ``NoExecute`` (DRADeviceTaintRules, GA in 1.37): kube-controller-manager's
    device-taint-eviction controller deletes a pod whose claim holds a tainted device it does not tolerate; the
    kubelet stops the pod and asks the driver to unprepare the claim, which must remove the CDI spec files its
    prepare wrote. NVIDIA's DRA driver reports a lost GPU this way."""
    node = devplug_driver.node
    node.require_gate("DRADeviceTaintRules", "DeviceTaintRules, whose NoExecute taints the eviction controller acts on")
    before = set(node.cdi_spec_files())
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim], wait=True)
    assert_claim_prepared(pod, devplug_driver)
    written = sorted(set(node.cdi_spec_files()) - before)
    pools = sorted({a.pool for a in claim.allocated if a.driver == devplug_driver.name})
    uid, since = claim.uid, len(node.dra_calls())
    rules: list[str] = []
    try:
        try:
            rules += [devplug_claims.taint_rule(pool, EVICT) for pool in pools]
        except RestError as exc:
            if exc.not_found:
                pytest.skip(f"the API server serves no resource.k8s.io/v1 DeviceTaintRules ({exc})")
            raise

        def still_there() -> bool:
            try:
                pod.backend.get_pod(pod.name, pod.namespace)
            except ObjectNotFoundError:
                return False
            return True

        waited(
            still_there,
            lambda present: not present,
            f"pod {pod.name} evicted for the {EVICT['key']}={EVICT['value']}:NoExecute taint of DeviceTaintRule(s) "
            f"{', '.join(rules)} on its device's pool(s) {', '.join(pools)}",
            driver=devplug_driver,
        )
        waited(
            lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since),
            bool,
            f"claim {claim.name} unprepared after its pod was evicted",
            driver=devplug_driver,
        )
    finally:
        for rule in rules:
            devplug_claims.untaint(rule)
    left = sorted(set(written) & set(node.cdi_spec_files()))
    assert not left, (
        f"{devplug_driver.name} unprepared claim {claim.name} after its pod was evicted for a NoExecute device taint, "
        f"but left the CDI spec file(s) its prepare wrote: {left}"
    )


#: The namespace label the API server requires of a claim asking for admin access (DRAAdminAccess, since 1.33).
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"


def test_admin_access_leaves_the_pod_using_the_device_alone(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle
) -> None:
    """Admin access (DRAAdminAccess: beta and on from 1.34, GA in 1.36): a monitoring pod's claim with
    ``adminAccess`` is allocated a device another pod already uses (the scheduler skips its in-use check for it),
    and the driver prepares it beside the user's claim. Preparing and then unpreparing the admin claim must leave the
    user's claim as it was: still prepared in the kubelet's checkpoint, its CDI spec files on the node, its
    CDI devices resolving for a new container of that claim. A driver that keeps its preparations per device rather
    than per claim refuses the admin claim or, unpreparing it, takes the user's device state with it."""
    node = devplug_driver.node
    node.require_gate("DRAAdminAccess", "claims with adminAccess on devices in use")
    user_claim = devplug_claims.claim()
    user = devplug_claims.pod([user_claim], wait=True)
    assert_claim_prepared(user, devplug_driver)
    (used,) = [(a.pool, a.device) for a in user_claim.allocated if a.driver == devplug_driver.name]
    specs = set(node.cdi_spec_files())
    path = f"/api/v1/namespaces/{devplug_claims.namespace}"
    labels = (devplug_claims.rest.get(path).get("metadata") or {}).get("labels") or {}
    if labels.get(ADMIN_ACCESS_LABEL) != "true":
        devplug_claims.rest.patch(path, {"metadata": {"labels": {ADMIN_ACCESS_LABEL: "true"}}})
    try:
        request = {"deviceClassName": devplug_claims.default_class, "count": 1, "adminAccess": True}
        admin_claim = devplug_claims.claim(requests=[{"name": "admin", "exactly": request}])
        admin = devplug_claims.pod([admin_claim], wait=True)
    finally:
        if labels.get(ADMIN_ACCESS_LABEL) != "true":
            devplug_claims.rest.patch(path, {"metadata": {"labels": {ADMIN_ACCESS_LABEL: None}}})
    granted = [(a.pool, a.device) for a in admin_claim.allocated if a.driver == devplug_driver.name]
    if granted != [used]:
        pytest.skip(
            f"the scheduler gave the admin claim {granted}, not the device in use {used} (its counters, shared with "
            "the device in use, may be spent): no device to judge sharing on"
        )
    assert_claim_prepared(admin, devplug_driver)
    uid, since = admin_claim.uid, len(node.dra_calls())
    admin.delete()
    waited(
        lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since),
        bool,
        "the admin claim unprepared after its pod was deleted",
        driver=devplug_driver,
    )
    gone = sorted(specs - set(node.cdi_spec_files()))
    assert not gone, (
        f"{devplug_driver.name} unprepared admin claim {admin_claim.name} on device {used}, and the CDI spec file(s) "
        f"of claim {user_claim.name}, which pod {user.name} still uses on that device, are gone: {gone}"
    )
    # A new container of the user's claim gets its CDI devices from the spec files as they are now.
    try:
        assert_claim_prepared(user, devplug_driver)
        assert_claim_prepared(devplug_claims.pod([user_claim]), devplug_driver)
    except AssertionError as exc:
        raise AssertionError(
            f"after admin claim {admin_claim.name} on device {used} was prepared and unprepared, claim "
            f"{user_claim.name} of pod {user.name} on that device is no longer usable: {exc}"
        ) from None
