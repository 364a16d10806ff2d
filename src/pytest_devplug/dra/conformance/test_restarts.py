"""Kubelet restarts around prepared claims, in the orders upstream's ``dra_test.go`` uses.

The kubelet keeps its claims in ``dra_manager_state``; after a restart it asks the driver to prepare them again
(they are not prepared in its new memory), so the answer must be the first one. Pods deleted while the kubelet
was down are unprepared once it runs again, and a pod that was never started is never prepared.
"""

from __future__ import annotations

import pytest

from pytest_devplug.dra.assertions import assert_claim_prepared, assert_dra_checkpoint_survives_kubelet_restart, assert_driver_registered
from pytest_devplug.dra.handles import ClaimFactory, ClaimPodHandle, DriverHandle

from ._support import consistently, short_dra_timings, succeeded, waited


@pytest.mark.devplug_disruptive
def test_checkpoint_survives_kubelet_restart(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """The kubelet restarts with a pod running: it reads its claims back from ``dra_manager_state``, prepares them
    again (the driver answers as before) and the pod keeps running with the same claim state."""
    pod = devplug_claims.pod(wait=True)
    assert_claim_prepared(pod, devplug_driver)
    assert_dra_checkpoint_survives_kubelet_restart(devplug_driver, [pod])


@pytest.mark.devplug_disruptive
def test_unprepare_for_pod_deleted_while_kubelet_down(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
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
        waited(lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since), bool,
               f"NodeUnprepareResources of claim {uid} succeeding after the kubelet came back",
               driver=devplug_driver, timeout=node.reregistration_timeout + periods["reconcile_period"])  # fmt: skip
        waited(claim.prepared, lambda p: p is None, "the deleted pod's claim gone from dra_manager_state", driver=devplug_driver)


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
def test_pod_deleted_while_kubelet_down_is_never_prepared(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
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
    consistently(lambda: [c for c in node.dra_calls("NodePrepareResources", driver=devplug_driver.name) if uid in c.claim_uids],
                 lambda calls: not calls, f"no NodePrepareResources of claim {uid} (its pod was deleted before the kubelet saw it)")  # fmt: skip
    assert claim.prepared() is None, f"the claim of a pod deleted before it was admitted is in dra_manager_state: {claim.prepared()}"


@pytest.mark.devplug_disruptive
def test_unprepare_after_a_restart_removes_the_claims_cdi_specs(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
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

    for what, restart in (("the driver was killed and started again", driver_restart), ("the kubelet restarted", kubelet_restart)):
        before = set(node.cdi_spec_files())
        claim = devplug_claims.claim()
        pod = devplug_claims.pod([claim])
        assert_claim_prepared(pod, devplug_driver)
        written = sorted(set(node.cdi_spec_files()) - before)
        restart()
        uid, since = claim.uid, len(node.dra_calls())
        pod.delete()
        waited(lambda uid=uid, since=since: succeeded(devplug_driver, "NodeUnprepareResources", uid, since), bool,  # type: ignore[misc]
               f"the claim unprepared after {what} and its pod was deleted", driver=devplug_driver)  # fmt: skip
        left = sorted(set(written) & set(node.cdi_spec_files()))
        assert not left, (
            f"after {what} between prepare and unprepare, {devplug_driver.name} unprepared claim {claim.name} but left "
            f"the CDI spec file(s) its prepare wrote: {left}"
        )
        claim.delete()
