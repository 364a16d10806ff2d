"""NodePrepareResources and NodeUnprepareResources: what the kubelet asks of a driver for every pod with claims.

A pod's containers start only once the driver prepared its claims; the devices it returns must be the ones the
scheduler allocated, and the CDI device IDs it returns must resolve from the spec files it wrote (a CDI-enabled
runtime refuses the container otherwise). Both calls must be idempotent: the kubelet prepares again after a
reboot and repeats an unprepare that it could not record.
"""

from __future__ import annotations

from pytest_devplug.dra.assertions import assert_claim_prepared
from pytest_devplug.dra.handles import ClaimFactory, DriverHandle

from ._support import claim_ref, need_devices, succeeded, waited


def test_claim_prepared_and_container_sees_it(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """Upstream "must prepare and unprepare resources" (the prepare half): a pod with a claim for one device runs, the
    kubelet's checkpoint holds exactly the allocated device as the driver prepared it, and the container got the CDI
    devices the driver returned, resolved from the specs it wrote."""
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim], wait=True)
    (prepared,) = assert_claim_prepared(pod, devplug_driver)
    assert prepared.claim_uid == claim.uid


def test_claim_for_two_devices(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """A claim for two devices: both allocated devices are prepared, one entry each."""
    need_devices(devplug_driver, 2)
    claim = devplug_claims.claim(count=2)
    pod = devplug_claims.pod([claim], wait=True)
    (prepared,) = assert_claim_prepared(pod, devplug_driver)
    devices = [(d.pool, d.device) for d in prepared.devices[devplug_driver.name]]
    assert len(devices) == len(set(devices)) == 2, f"two devices allocated, the driver prepared {devices}"


def test_claim_with_several_requests(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """A claim with two requests (1 and 2 devices) and one with three (1 each), alternating between two DeviceClasses of
    the driver, each request used by a container of its own: the driver prepares every request's devices, and names
    the request each device is for (``requestNames``), since the kubelet gives a container that names a request only
    that request's CDI devices (and every container all the devices named for no request). Guards against drivers
    preparing only a claim's first request or answering without request names."""
    need_devices(devplug_driver, 3)
    classes = (devplug_claims.default_class, devplug_claims.device_class())
    for counts in ((1, 2), (1, 1, 1)):
        names = [f"req-{i}" for i in range(len(counts))]
        claim = devplug_claims.claim(
            requests=[
                {
                    "name": name,
                    "exactly": {"deviceClassName": classes[i % 2], "allocationMode": "ExactCount", "count": n},
                }
                for i, (name, n) in enumerate(zip(names, counts, strict=True))
            ]
        )
        body = devplug_claims.manifest([claim], containers=len(counts))
        containers = body["spec"]["containers"]
        for container, name in zip(containers, names, strict=True):
            container["resources"]["claims"] = [{"name": "c0", "request": name}]
        pod = devplug_claims.pod(manifest=body, wait=True)
        allocated = {name: sorted((a.pool, a.device) for a in claim.allocated if a.request == name) for name in names}
        assert [len(allocated[n]) for n in names] == list(counts), (
            f"the scheduler allocated {allocated} for counts {counts}"
        )
        prepared = claim.prepared()
        assert prepared is not None, f"claim {claim.name} is not in the kubelet's dra_manager_state"
        answered = prepared.devices.get(devplug_driver.name, ())
        got = sorted((d.pool, d.device) for d in answered)
        want = sorted(d for devs in allocated.values() for d in devs)
        assert got == want, (
            f"claim {claim.name} with requests {dict(zip(names, counts, strict=True))}: the driver prepared {got}; "
            f"the scheduler allocated {allocated}"
        )
        for container, name in zip(containers, names, strict=True):
            cdi = sorted(
                {i for d in answered if name in d.requests for i in d.cdi_device_ids}
            )  # an ID shared by devices: once
            seen = sorted(set(pod.view(container["name"]).cdi_devices))
            assert cdi and seen == cdi, (
                f"container {container['name']} uses request {name} of claim {claim.name} (devices {allocated[name]}): "
                f"it got the CDI devices {seen}, want {cdi or 'some'}; "
                f"the driver named the requests {[(d.device, list(d.requests)) for d in answered]}"
            )
        pod.delete_and_wait_gone()
        claim.delete()


def test_prioritized_list_gets_the_next_choice(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """A prioritized list (DRAPrioritizedList: beta and on from 1.34, GA in 1.36): a request whose first choice no
    device satisfies is allocated its next one, as result request ``gpu/one``. The container names the request
    ``gpu``, and the kubelet gives it the CDI devices the driver named for exactly ``gpu``
    (``pkg/kubelet/cm/dra/claiminfo.go``, ``cdiDevicesAsList``): a driver must name the parent request (upstream's
    ``resourceclaim.BaseRequestRef``), not the sub-request, or the container starts without its device."""
    devplug_driver.node.require_gate("DRAPrioritizedList", "requests with firstAvailable sub-requests")
    nothing = {"cel": {"expression": 'device.driver == "no-such-driver.devplug.invalid"'}}
    claim = devplug_claims.claim(
        requests=[
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "none", "deviceClassName": devplug_claims.default_class, "selectors": [nothing]},
                    {"name": "one", "deviceClassName": devplug_claims.default_class, "count": 1},
                ],
            }
        ]
    )
    body = devplug_claims.manifest([claim])
    (container,) = body["spec"]["containers"]
    container["resources"]["claims"] = [{"name": "c0", "request": "gpu"}]
    pod = devplug_claims.pod(manifest=body, wait=True)
    assert [a.request for a in claim.allocated] == ["gpu/one"], (
        f"the scheduler allocated {[(a.request, a.device) for a in claim.allocated]}, want one device for gpu/one"
    )
    prepared = claim.prepared()
    assert prepared is not None, f"claim {claim.name} is not in the kubelet's dra_manager_state"
    answered = prepared.devices.get(devplug_driver.name, ())
    named = [(d.device, list(d.requests)) for d in answered]
    assert [d.device for d in answered] == [claim.allocated[0].device], (
        f"the driver prepared {named}; the scheduler allocated {claim.allocated[0].device} for gpu/one"
    )
    cdi = sorted({i for d in answered if "gpu" in d.requests for i in d.cdi_device_ids})
    seen = sorted(set(pod.view(container["name"]).cdi_devices))
    assert cdi and seen == cdi, (
        f"the container uses request gpu of claim {claim.name}, allocated as gpu/one: it got the CDI devices {seen}; "
        f"the driver named the requests {named} (the kubelet matches the parent request gpu exactly, so a device "
        "named for gpu/one reaches no container)"
    )


def test_extended_resource_served_by_the_driver(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """Extended resources backed by DRA (DRAExtendedResource: on from 1.36, GA in 1.37): a DeviceClass naming an
    extended resource lets a pod ask for it in its limits like a device plugin's; the scheduler allocates one of the
    driver's devices in a claim of its own (``status.extendedResourceClaimStatus``), the kubelet prepares it like any
    claim and the container gets the CDI devices the driver returned for it."""
    devplug_driver.node.require_gate(
        "DRAExtendedResource", "pods ask for a DRA driver's devices as an extended resource"
    )
    resource = f"{devplug_driver.name}/devplug-extended"
    devplug_claims.device_class(extended_resource_name=resource)
    pod = devplug_claims.pod(manifest=devplug_claims.manifest(limits={resource: 1}))
    (prepared,) = assert_claim_prepared(pod, devplug_driver)
    mapping = (pod.obj.get("status") or {}).get("extendedResourceClaimStatus") or {}
    assert prepared.claim_name == mapping.get("resourceClaimName"), (
        f"prepared {prepared.claim_name}; the pod's status: {mapping}"
    )
    assert [(m.get("containerName"), m.get("resourceName")) for m in mapping.get("requestMappings") or []] == [
        ("main", resource)
    ], mapping
    devices = prepared.devices[devplug_driver.name]
    assert len(devices) == 1, f"one device asked for as {resource}, the driver prepared {devices}"


def test_claim_from_template(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """A pod using a ResourceClaimTemplate gets a claim of its own, owned by the pod; the kubelet prepares it only
    because the pod owns it, and the driver prepares it like any other."""
    template = devplug_claims.template()
    pod = devplug_claims.pod(templates=[template], wait=True)
    (prepared,) = assert_claim_prepared(pod, devplug_driver)
    (claim,) = pod.claims
    owners = [
        (o.get("kind"), o.get("uid")) for o in claim.obj["metadata"].get("ownerReferences") or [] if o.get("controller")
    ]
    assert owners == [("Pod", pod.uid)], f"the claim made from the template is owned by {owners}, not the pod"
    assert prepared.claim_name == claim.name


def test_prepare_is_idempotent(devplug_claims: ClaimFactory, devplug_driver: DriverHandle) -> None:
    """NodePrepareResources for a claim that is already prepared (as the kubelet sends after a reboot) answers the
    same devices and CDI device IDs, without an error."""
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim], wait=True)
    (prepared,) = assert_claim_prepared(pod, devplug_driver)
    answer = devplug_driver.call("NodePrepareResources", [claim_ref(claim)])
    result = answer.claims.get(prepared.claim_uid)
    assert result is not None, f"NodePrepareResources answered no entry for claim {prepared.claim_uid}: {answer}"
    assert not result.error, f"preparing the claim again failed: {result.error}"
    again = sorted((d.pool_name, d.device_name, tuple(d.cdi_device_ids)) for d in result.devices)
    first = sorted((d.pool, d.device, d.cdi_device_ids) for d in prepared.devices[devplug_driver.name])
    assert again == first, f"preparing the claim again answered {again}; the first prepare answered {first}"


def test_unprepared_when_pod_deleted_and_unprepare_is_idempotent(
    devplug_claims: ClaimFactory, devplug_driver: DriverHandle
) -> None:
    """Upstream "must prepare and unprepare resources" (the unprepare half): deleting the pod completes (it leaves the
    API server and the node's pod-resources) and makes the kubelet unprepare its claim (NodeUnprepareResources
    succeeds, the claim leaves the checkpoint); unpreparing it again, as the kubelet does when it could not record the
    first answer, succeeds too."""
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim], wait=True)
    assert_claim_prepared(pod, devplug_driver)
    uid, since = claim.uid, len(devplug_driver.node.dra_calls())
    pod.delete_and_wait_gone()
    waited(
        lambda: succeeded(devplug_driver, "NodeUnprepareResources", uid, since),
        bool,
        f"a NodeUnprepareResources of claim {uid} that succeeded",
        driver=devplug_driver,
    )
    waited(claim.prepared, lambda p: p is None, "the claim gone from dra_manager_state", driver=devplug_driver)
    answer = devplug_driver.call("NodeUnprepareResources", [claim_ref(claim)])
    result = answer.claims.get(uid)
    assert result is not None, f"NodeUnprepareResources answered no entry for claim {uid}: {answer}"
    assert not result.error, f"unpreparing the claim a second time failed: {result.error}"
