"""Kubelet restarts and node reboots around prepared claims, in the orders upstream's ``dra_test.go`` uses.

The kubelet keeps its claims in ``dra_manager_state``. A restart beside running pods asks the driver nothing (claims
are prepared on the way to creating a pod's sandbox); a reboot, which takes the sandboxes and empties ``/run``, makes
it prepare every claim again, and the answer must be the first one with its CDI spec back in place. Pods deleted
while the kubelet was down are unprepared once it runs again, and a pod that was never started is never prepared.
"""

from __future__ import annotations

import pytest

from pytest_devplug.dra.assertions import (
    assert_claim_prepared,
    assert_dra_checkpoint_survives_kubelet_restart,
    assert_driver_registered,
)
from pytest_devplug.dra.handles import ClaimFactory, ClaimPodHandle, DriverHandle, nested_spec_hint
from pytest_devplug.report import note_check

from ._support import consistently, short_dra_timings, succeeded, waited


@pytest.mark.devplug_disruptive
def test_checkpoint_survives_kubelet_restart(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """The kubelet restarts with a pod running: it reads its claims back from ``dra_manager_state``, prepares them
    again (the driver answers as before) and the pod keeps running with the same claim state."""
    pod = devplug_claims.pod(wait=True)
    assert_claim_prepared(pod, devplug_driver)
    assert_dra_checkpoint_survives_kubelet_restart(devplug_driver, [pod])


@pytest.mark.devplug_disruptive
def test_unprepare_for_pod_deleted_while_kubelet_down(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle
) -> None:
    """Upstream "must call NodeUnprepareResources for deleted pod after Kubelet restart": a pod deleted while the
    kubelet is down has its claim unprepared by the kubelet's reconcile loop once it runs again (its period, 60 s,
    shortened to 1 s where the backend can)."""
    node = devplug_driver.node
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim], wait=True)
    assert_claim_prepared(pod, devplug_driver)
    uid, since = claim.uid, len(node.dra_calls())
    with short_dra_timings(devplug_driver, reconcile_period=1.0) as periods:
        node.stop_kubelet()
        try:
            pod.delete()
        finally:
            node.start_kubelet()
        waited(
            lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since),
            bool,
            f"NodeUnprepareResources of claim {uid} succeeding after the kubelet came back",
            driver=devplug_driver,
            timeout=node.reregistration_timeout + periods["reconcile_period"],
        )
        waited(
            claim.prepared,
            lambda p: p is None,
            "the deleted pod's claim gone from dra_manager_state",
            driver=devplug_driver,
        )


def _bound(pod: ClaimPodHandle, driver: DriverHandle) -> str:
    return waited(lambda: pod.node_name or "", bool, f"pod {pod.name} bound to a node by the scheduler", driver=driver)


@pytest.mark.devplug_disruptive
def test_pod_created_while_kubelet_down_runs(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """Upstream "must process pod created when kubelet is not running": a pod scheduled while the kubelet is down
    stays Pending; once the kubelet runs (and has wiped and the driver re-published the node's slices) its claim is
    prepared and it runs."""
    node = devplug_driver.node
    node.stop_kubelet()
    try:
        pod = devplug_claims.pod()
        _bound(pod, devplug_driver)
        assert pod.phase == "Pending", f"a pod bound while the kubelet is down is {pod.phase}"
    finally:
        node.start_kubelet()
    assert_driver_registered(devplug_driver, node.reregistration_timeout)
    assert_claim_prepared(pod, devplug_driver, timeout=node.reregistration_timeout)


@pytest.mark.devplug_disruptive
def test_pod_deleted_while_kubelet_down_is_never_prepared(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle
) -> None:
    """Upstream "must not call NodePrepareResources for deleted pod after Kubelet restart": a pod bound and deleted
    while the kubelet is down is never prepared, and its claim never enters the kubelet's checkpoint."""
    node = devplug_driver.node
    claim = devplug_claims.claim()
    node.stop_kubelet()
    try:
        doomed = devplug_claims.pod([claim])
        _bound(doomed, devplug_driver)
        doomed.delete()
    finally:
        node.start_kubelet()
    assert_driver_registered(devplug_driver, node.reregistration_timeout)
    uid = claim.uid
    consistently(
        lambda: [c for c in node.dra_calls("NodePrepareResources", driver=devplug_driver.name) if uid in c.claim_uids],
        lambda calls: not calls,
        f"no NodePrepareResources of claim {uid} (its pod was deleted before the kubelet saw it)",
    )
    assert claim.prepared() is None, (
        f"the claim of a pod deleted before it was admitted is in dra_manager_state: {claim.prepared()}"
    )


@pytest.mark.devplug_disruptive
def test_unprepare_after_a_restart_removes_the_claims_cdi_specs(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle
) -> None:
    """Prepare, then the driver killed and started fresh (in a second round: the kubelet restarted), then the pod
    deleted: the kubelet's NodeUnprepareResources succeeds and every CDI spec file the prepare wrote (listed before
    and after it) is gone from the node. A driver that keeps its prepared claims only in memory (its checkpoint not
    read back at start) forgets them at a restart and leaves their specs behind (dra-example-driver #249,
    kubernetes/kubernetes#116411)."""
    node = devplug_driver.node

    def driver_restart() -> None:
        devplug_driver.kill()
        devplug_driver.start()
        devplug_driver.wait_usable()

    def kubelet_restart() -> None:
        node.restart_kubelet()
        assert_driver_registered(devplug_driver, node.reregistration_timeout)

    for what, restart in (
        ("the driver was killed and started again", driver_restart),
        ("the kubelet restarted", kubelet_restart),
    ):
        before = set(node.cdi_spec_files())
        claim = devplug_claims.claim()
        pod = devplug_claims.pod([claim])
        assert_claim_prepared(pod, devplug_driver)
        written = sorted(set(node.cdi_spec_files()) - before)
        restart()
        uid, since = claim.uid, len(node.dra_calls())
        pod.delete()
        waited(
            lambda uid=uid, since=since: succeeded(devplug_driver, "NodeUnprepareResources", uid, since),  # type: ignore[misc]
            bool,
            f"the claim unprepared after {what} and its pod was deleted",
            driver=devplug_driver,
        )
        left = sorted(set(written) & set(node.cdi_spec_files()))
        assert not left, (
            f"after {what} between prepare and unprepare, {devplug_driver.name} unprepared claim {claim.name} but left "
            f"the CDI spec file(s) its prepare wrote: {left}"
        )
        claim.delete()


@pytest.mark.devplug_disruptive
def test_pods_come_back_with_their_devices_after_a_node_reboot(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle, request: pytest.FixtureRequest
) -> None:
    """A node reboot (staged on kind and clusters, and the report says so): the containers and the driver go, ``/run``
    (so ``/var/run/cdi``) is empty and ``/var/lib/kubelet`` (``dra_manager_state``, the driver's own checkpoint) is
    kept. Once the driver is back, the kubelet, which keeps no "prepared" flag in its checkpoint, prepares the claim
    again (kubernetes/kubernetes#141966) and the driver must answer as before *with its CDI spec written again*:
    a driver answering from its checkpoint alone leaves the pod in ``CreateContainerError`` for good ("CDI device
    injection failed: unresolvable CDI devices"), kubernetes/kubernetes#141433 (dra-example-driver's PR #259).

    A reboot changes the kernel's boot ID, by which a driver may tell it from a restart of its own (NVIDIA's drops its
    checkpoint then). Where the reboot is staged and the boot ID stays (kind, clusters), such a driver keeps its claims
    prepared and fails here the way a driver with #141433 does; nothing outside the driver tells the two apart, so the
    failure says so and points to the embedded kubelet, whose reboot changes the boot ID."""
    node = devplug_driver.node
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim], wait=True)
    (first,) = assert_claim_prepared(pod, devplug_driver)
    old_id = str(pod.container_status().get("containerID", ""))
    uid, since = claim.uid, len(node.dra_calls())
    # the kubelet's prepare fails until the driver is back; its retry (10 s) shortened to 1 s where the backend can
    with short_dra_timings(devplug_driver, retry_period=1.0) as periods:
        how = node.reboot()
        note_check(request.node, "reboot", how)
        devplug_driver.start()  # its DaemonSet's pod comes back after a reboot
        assert_driver_registered(devplug_driver, node.reregistration_timeout)
        waited(
            lambda: succeeded(devplug_driver, "NodePrepareResources", uid, since),
            bool,
            f"the kubelet preparing claim {uid} again after the reboot, and the driver answering without error",
            driver=devplug_driver,
            timeout=node.reregistration_timeout + periods["retry_period"],
        )
    try:
        pod.wait_container_replaced(old_id)
    except AssertionError as exc:
        staged = (
            f"; the reboot was staged ({how}) and the boot ID did not change: a driver that tells a reboot from its "
            "own restart by the boot ID keeps its claims prepared; judge such a driver on the embedded kubelet"
            if how.startswith("staged")
            else ""
        )
        raise AssertionError(
            f"after a node reboot emptied /var/run/cdi, {devplug_driver.name} prepared claim {claim.name} again but "
            f"the pod's container did not come back: {exc}; "
            f"CDI spec files on the node now: {sorted(node.cdi_spec_files())}"
            f"{nested_spec_hint(pod, devplug_driver)}{staged}"
        ) from None
    (again,) = assert_claim_prepared(pod, devplug_driver)
    # a kubelet before 1.37 appends a re-prepare's devices to the checkpointed ones: compare what was prepared, not
    # how often
    answered = {d: set(devs) for d, devs in again.devices.items()}
    assert answered == {d: set(devs) for d, devs in first.devices.items()}, (
        f"after the reboot the kubelet checkpointed {again.devices} for claim {claim.name}; "
        f"the first prepare gave {first.devices}"
    )
