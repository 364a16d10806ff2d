"""Faults: failing prepares and unprepares, retried by the kubelet, and device health reaching the pod status.

A driver may report health instead as KEP-5055 device taints in its ResourceSlices (NVIDIA's DRA driver: an Xid
taints the GPU ``gpu.nvidia.com/xid=79:NoSchedule``); where the release keeps such taints, that report is judged too.

These need the driver's cooperation to fail on purpose (the ``devplug_dra_faults`` fixture, or health the driver
reports itself); without an injector they skip naming the contract. The kubelet retries a failed prepare after
its pod worker's back-off (10 s; 0.5 s where the backend can shorten it) while the pod stays Pending with
``FailedPrepareDynamicResources``; a failed unprepare is retried until it succeeds, also across a kubelet restart.
"""

from __future__ import annotations

import pytest

from pytest_devplug.dra.assertions import assert_claim_prepared, assert_driver_registered
from pytest_devplug.dra.faults import DRAFaultInjector
from pytest_devplug.errors import FaultNotSupportedError, WaitTimeout
from pytest_devplug.dra.handles import ClaimFactory, ClaimPodHandle, DriverHandle
from pytest_devplug.waiting import wait_for

from ._support import UNSCHEDULABLE_TEXT, consistently, fault, scheduled_condition, short_dra_timings, succeeded, waited


def _backoff(periods: dict[str, float]) -> float:
    """The longest wait before the kubelet's pod worker retries a failed sync (its back-off, jittered up to 1.5x)."""
    return 1.5 * periods["retry_period"]


def _waiting_reasons(pod: ClaimPodHandle) -> list[str | None]:
    return [(c.get("state") or {}).get("waiting", {}).get("reason") for c in pod.status.get("containerStatuses") or []]


def _failed_prepare(pod: ClaimPodHandle, driver: DriverHandle) -> str:
    event = pod.wait_event(r"^FailedPrepareDynamicResources: Failed to prepare dynamic resources: ")
    assert pod.phase == "Pending", f"a pod whose claims failed to prepare is {pod.phase}"
    # A real kubelet records the event at once but posts the pod's status from its status manager, later (on a
    # loaded node its first GET of the pod can even be refused until the node authorizer has seen the binding).
    try:
        waiting = wait_for(
            lambda: _waiting_reasons(pod), bool, timeout=pod.timeout, what=f"container statuses of pod {pod.name}"
        )
    except WaitTimeout as exc:
        waiting = exc.last or []
    assert waiting and all(w == "ContainerCreating" for w in waiting), (
        f"its containers must wait in ContainerCreating: {waiting}"
    )
    return event


@pytest.mark.devplug_disruptive
def test_failed_prepare_keeps_pod_pending_then_runs(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle, devplug_dra_faults: DRAFaultInjector
) -> None:
    """Upstream "must run pod if NodePrepareResources fails and then succeeds": while the driver fails the prepare,
    the pod stays Pending with the driver's error in a FailedPrepareDynamicResources event; once it succeeds the
    kubelet's retry runs the pod."""
    with short_dra_timings(devplug_driver, retry_period=0.5) as periods:
        with fault("fail NodePrepareResources"):
            devplug_dra_faults.fail_prepare()
        pod = devplug_claims.pod()
        _failed_prepare(pod, devplug_driver)
        devplug_dra_faults.fail_prepare(False)
        assert_claim_prepared(pod, devplug_driver, timeout=devplug_driver.node.timeout + _backoff(periods))


@pytest.mark.devplug_disruptive
def test_prepare_retried_after_kubelet_restart(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle, devplug_dra_faults: DRAFaultInjector
) -> None:
    """Upstream "must retry NodePrepareResources after Kubelet restart": a prepare that failed before the kubelet
    stopped is retried by the new kubelet, and the pod runs."""
    node = devplug_driver.node
    with fault("fail NodePrepareResources"):
        devplug_dra_faults.fail_prepare()
    pod = devplug_claims.pod()
    _failed_prepare(pod, devplug_driver)
    node.stop_kubelet()
    try:
        devplug_dra_faults.fail_prepare(False)
    finally:
        node.start_kubelet()
    assert_driver_registered(devplug_driver, node.reregistration_timeout)
    assert_claim_prepared(pod, devplug_driver, timeout=node.reregistration_timeout)


def _failing_unprepare(claims: ClaimFactory, driver: DriverHandle, faults: DRAFaultInjector) -> tuple[str, int]:
    """A running pod whose claim the driver refuses to unprepare, deleted; (claim UID, call index before)."""
    claim = claims.claim()
    pod = claims.pod([claim], wait=True)
    assert_claim_prepared(pod, driver)
    with fault("fail NodeUnprepareResources"):
        faults.fail_unprepare()
    uid, since = claim.uid, len(driver.node.dra_calls())
    pod.delete()
    failed = waited(
        lambda: [c for c in driver.node.dra_calls("NodeUnprepareResources", since=since) if uid in c.claim_uids],
        bool,
        "a NodeUnprepareResources call for the deleted pod's claim",
        driver=driver,
    )
    assert claim.prepared() is not None, f"the claim left dra_manager_state though its unprepare failed ({failed})"
    return uid, since


@pytest.mark.devplug_disruptive
def test_failed_unprepare_is_retried(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle, devplug_dra_faults: DRAFaultInjector
) -> None:
    """Upstream "must call NodeUnprepareResources for deleted pod": an unprepare the driver fails keeps the claim in
    the kubelet's checkpoint and is retried until the driver succeeds."""
    with short_dra_timings(devplug_driver, retry_period=0.5) as periods:
        uid, since = _failing_unprepare(devplug_claims, devplug_driver, devplug_dra_faults)
        devplug_dra_faults.fail_unprepare(False)
        waited(
            lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since),
            bool,
            "the unprepare retried until it succeeded",
            driver=devplug_driver,
            timeout=devplug_driver.node.timeout + _backoff(periods),
        )


@pytest.mark.devplug_disruptive
def test_unprepare_retried_after_kubelet_restart(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle, devplug_dra_faults: DRAFaultInjector
) -> None:
    """Upstream "must retry NodeUnprepareResources after Kubelet restart": an unprepare that failed before the kubelet
    restarted is retried by the new kubelet (its reconcile loop, 1 s here) from the checkpoint."""
    node = devplug_driver.node
    with short_dra_timings(devplug_driver, retry_period=0.5, reconcile_period=1.0) as periods:
        uid, since = _failing_unprepare(devplug_claims, devplug_driver, devplug_dra_faults)
        node.stop_kubelet()
        try:
            devplug_dra_faults.fail_unprepare(False)
        finally:
            node.start_kubelet()
        waited(
            lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since),
            bool,
            "the unprepare retried by the restarted kubelet",
            driver=devplug_driver,
            timeout=node.reregistration_timeout + periods["reconcile_period"],
        )


#: The health services a kubelet of 1.37+ watches, in its order of preference (``healthServicesSupportedByKubelet``).
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


def _health_service(driver: DriverHandle) -> None:
    """Skip where the driver reports no health or the node's release reports none; fail a driver whose health a
    1.37+ kubelet never watches because GetInfo does not list its service (``pickHealthService``)."""
    kube = driver.node.require_gate(
        "ResourceHealthStatus", "the kubelet watches DRA device health and reports it in allocatedResourcesStatus"
    )
    served = [s for s in HEALTH_SERVICES if driver.health(s) is not None]
    if not served:
        pytest.skip(
            f"{driver.name} serves neither {' nor '.join(HEALTH_SERVICES)} (NodeWatchResources is unimplemented): "
            "it reports no device health"
        )
    if kube.has("dra-health-v1"):
        listed = driver.listed_services() or ()
        if not any(s in listed for s in HEALTH_SERVICES):
            raise AssertionError(
                f"{driver.name} serves {', '.join(served)} but lists no health service in GetInfo (supported_versions "
                f"{list(listed)}): a kubelet of {kube.name} watches only a health service the driver lists "
                "(pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go, pickHealthService), so its device health never "
                "reaches a pod's status; list it as the kubeletplugin helper v0.37 does"
            )


def test_device_health_reaches_pod_status(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle, devplug_dra_faults: DRAFaultInjector
) -> None:
    """Upstream "should reflect device health changes in the Pod's status": the device of a running pod's claim reads
    Healthy in ``allocatedResourcesStatus`` (``claim:<name>/<request>``), Unhealthy once the driver's health stream
    reports it so, and Healthy again where the injector can make it recover."""
    _health_service(devplug_driver)
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim], wait=True, same_names=True)
    (allocated,) = claim.allocated
    waited(
        lambda: pod.claim_health,
        lambda h: bool(h) and set(h.values()) == {"Healthy"},
        "the claim's device Healthy in the pod status",
        driver=devplug_driver,
    )
    with fault("report a device Unhealthy"):
        devplug_dra_faults.set_unhealthy(allocated.pool, allocated.device)
    waited(
        lambda: pod.claim_health,
        lambda h: set(h.values()) == {"Unhealthy"},
        f"device {allocated.pool}/{allocated.device} Unhealthy in the pod status",
        driver=devplug_driver,
    )
    try:
        devplug_dra_faults.set_healthy(allocated.pool, allocated.device)
    except FaultNotSupportedError:
        return  # recovery is beyond this injector; the transition to Unhealthy was judged
    waited(
        lambda: pod.claim_health,
        lambda h: set(h.values()) == {"Healthy"},
        "the device Healthy again in the pod status",
        driver=devplug_driver,
    )


@pytest.mark.devplug_disruptive
def test_device_health_unknown_after_driver_stops(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """Upstream "should update health to Unknown when plugin stops and recover upon restart": with the driver gone its
    devices read Unknown in the pod status; started again, it reports them Healthy again."""
    _health_service(devplug_driver)
    pod = devplug_claims.pod([devplug_claims.claim()], wait=True, same_names=True)
    waited(
        lambda: pod.claim_health,
        lambda h: bool(h) and set(h.values()) == {"Healthy"},
        "the claim's device Healthy in the pod status",
        driver=devplug_driver,
    )
    devplug_driver.stop()
    waited(
        lambda: pod.claim_health,
        lambda h: set(h.values()) == {"Unknown"},
        "the device Unknown once the driver stopped",
        driver=devplug_driver,
    )
    devplug_driver.start()
    assert_driver_registered(devplug_driver)
    waited(
        lambda: pod.claim_health,
        lambda h: set(h.values()) == {"Healthy"},
        "the device Healthy again after the driver restarted",
        driver=devplug_driver,
    )


#: Taint effects that keep new claims off a device.
KEEPS_CLAIMS_OFF = ("NoSchedule", "NoExecute")
#: The standard attribute that names a device's hardware (``k8s.io/dynamic-resource-allocation/deviceattribute``):
#: devices that share it (a GPU and its MIG devices, or its shared replicas) go Unhealthy together.
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"


def _taints(driver: DriverHandle) -> dict[tuple[str, str], list[dict[str, str]]]:
    """(pool, device) -> the taints the driver publishes on it, for the devices that have any."""
    out: dict[tuple[str, str], list[dict[str, str]]] = {}
    for s in driver.slices():
        for name in s.devices:
            taints = s.device(name).get("taints") or []
            if taints:
                out[(s.pool, name)] = [{k: str(t.get(k, "")) for k in ("key", "value", "effect")} for t in taints]
    return out


def _pci_bus_ids(driver: DriverHandle) -> dict[tuple[str, str], str]:
    """(pool, device) -> its standard PCI bus ID attribute, for the devices that publish one."""
    out: dict[tuple[str, str], str] = {}
    for s in driver.slices():
        for name in s.devices:
            value = ((s.device(name).get("attributes") or {}).get(PCI_BUS_ID) or {}).get("string")
            if value:
                out[(s.pool, name)] = str(value)
    return out


@pytest.mark.devplug_disruptive
def test_device_health_reported_as_device_taints(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle, devplug_dra_faults: DRAFaultInjector
) -> None:
    """KEP-5055 device taints as the health report, for a driver with no health stream (NVIDIA's DRA driver with its
    NVMLDeviceHealthCheck gate): once a running pod's device turns Unhealthy the driver's slice taints that device
    with an effect that keeps new claims off it (NoSchedule or NoExecute), taints no device on other hardware (those
    sharing its ``resource.kubernetes.io/pciBusID`` may be tainted with it), and the scheduler places no new claim on
    it: a claim for every device of the pool stays Unschedulable. Taints the driver published before the fault (e.g.
    an informational one) are its own business. A driver that reports neither way is skipped, saying so."""
    driver = devplug_driver
    if any(driver.health(s) is not None for s in HEALTH_SERVICES):
        pytest.skip(
            f"{driver.name} reports device health through its health stream "
            "(judged by test_device_health_reaches_pod_status)"
        )
    driver.node.require_gate("DRADeviceTaints", "device taints in ResourceSlices; an API server without it drops them")
    devices = driver.devices()
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim], wait=True)
    (allocated,) = claim.allocated
    target = (allocated.pool, allocated.device)
    before = _taints(driver)

    def added() -> dict[tuple[str, str], list[dict[str, str]]]:
        """The taints published since the fault, by device."""
        now = _taints(driver)
        return {k: new for k, v in now.items() if (new := [t for t in v if t not in before.get(k, [])])}

    with fault("report a device Unhealthy"):
        devplug_dra_faults.set_unhealthy(*target)
    try:
        wait_for(added, bool, timeout=driver.node.timeout, what="a new device taint in the slices")
    except WaitTimeout:
        pytest.skip(
            f"{driver.name} serves no health service and tainted no device within {driver.node.timeout:g} s of "
            f"{target[0]}/{target[1]} turning Unhealthy: it reports no device health"
        )
    tainted = waited(added, lambda t: target in t, f"device {target[0]}/{target[1]} tainted", driver=driver)
    effects = {t["effect"] for t in tainted[target]}
    assert effects & set(KEEPS_CLAIMS_OFF), (
        f"{driver.name} tainted the Unhealthy device {target[0]}/{target[1]} with {tainted[target]}: "
        f"no effect keeps new claims off it ({' or '.join(KEEPS_CLAIMS_OFF)})"
    )
    bus = _pci_bus_ids(driver)
    same = {k for k, b in bus.items() if target in bus and b == bus[target]}
    others = {f"{p}/{d}": t for (p, d), t in tainted.items() if (p, d) != target and (p, d) not in same}
    assert not others, (
        f"{driver.name} tainted devices other than the Unhealthy {target[0]}/{target[1]} and those on its hardware "
        f"({PCI_BUS_ID} {bus.get(target, 'not published')}): {others}"
    )
    pod.delete()
    claim.delete()  # every device free again, one of them tainted
    pool = [d for p, d in devices if p == allocated.pool]
    every = devplug_claims.claim(count=len(pool))
    blocked = devplug_claims.pod([every])
    cond = scheduled_condition(blocked, driver)
    assert not every.allocated and cond.get("reason") == "Unschedulable", (
        f"the scheduler allocated {[f'{d.pool}/{d.device}' for d in every.allocated]} to a claim "
        f"for all {len(pool)} devices of pool {allocated.pool}, one of them tainted {tainted[target]} "
        f"(PodScheduled {cond})"
    )
    assert UNSCHEDULABLE_TEXT in str(cond.get("message")), f"the scheduler says {cond.get('message')!r}"
    consistently(
        lambda: (blocked.phase, every.allocation),
        lambda s: s == ("Pending", None),
        "the pod Pending, its claim unallocated while a device it needs is tainted",
    )
