"""An allocated ResourceClaim -> the devices prepared for it and its CDI spec (pure logic, no I/O).

The Go helper's checks come first and fail the whole call, with its texts: a claim that is not
allocated ("claim <ns>/<name> not allocated") or has another UID than the kubelet asked for ("got
replaced"). Then, per claim (a failure is that claim's error; the kubelet retries it): only results of
this driver count; each must name a GPU of this node's pool that the inventory has; a GPU whose mock
state says ``fail_allocate`` fails the claim (the mock's "preparing fails" fault). Health is not judged
here: the scheduler picked the device, and a claim prepared before must prepare the same way again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..devices import Gpu, Snapshot
from .cdi import CdiLayout
from .slices import device_name

__all__ = ["ClaimCheckError", "ClaimError", "PreparedClaim", "PreparedDevice", "check_claim", "prepare_claim"]


class ClaimCheckError(Exception):
    """The claim cannot be prepared at all (not allocated, replaced): the whole call fails."""


class ClaimError(Exception):
    """Preparing this claim failed; the text is its entry's ``error``."""


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    #: The GPU's UUID, model and minor number (what ``--device-status`` publishes in the claim).
    uuid: str
    model: str
    minor: int


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    devices: tuple[PreparedDevice, ...]
    #: The CDI spec to write; None when the claim has no device of this driver.
    spec: dict[str, Any] | None


def check_claim(claim: Mapping[str, Any], namespace: str, name: str, uid: str) -> None:
    """The Go helper's ``getResourceClaims`` checks on a claim read from the API."""
    if (claim.get("status") or {}).get("allocation") is None:
        raise ClaimCheckError(f"claim {namespace}/{name} not allocated")
    if (claim.get("metadata") or {}).get("uid") != uid:
        raise ClaimCheckError(f"claim {namespace}/{name} got replaced")


def prepare_claim(
    claim: Mapping[str, Any],
    snapshot: Snapshot,
    layout: CdiLayout,
    node: str,
    fault: Callable[[str], str | None] | None = None,
) -> PreparedClaim:
    """The devices of ``claim`` allocated from this driver, each with its CDI IDs; raises :class:`ClaimError`."""
    meta = claim.get("metadata") or {}
    uid, where = str(meta.get("uid", "")), f"claim {meta.get('namespace', '')}/{meta.get('name', '')}"
    gpus = {device_name(g.info.minor): g for g in snapshot.gpus}
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    allocated: list[tuple[str, Gpu, str]] = []
    for result in results:
        if result.get("driver") != layout.driver:
            continue
        pool, device = str(result.get("pool", "")), str(result.get("device", ""))
        # "request/subrequest" (prioritized list): the kubelet matches containers by the request
        request = str(result.get("request", "")).split("/", 1)[0]
        if pool != node:
            raise ClaimError(f"{where}: device {pool}/{device} is not in this node's pool {node}")
        gpu = gpus.get(device)
        if gpu is None:
            known = ", ".join(gpus) or "none"
            raise ClaimError(f"{where}: device {device} is not on node {node} (its GPUs: {known})")
        why = fault(gpu.uuid) if fault is not None else None
        if why:
            raise ClaimError(f"{where}: preparing {device} ({gpu.uuid}) failed: {why}")
        allocated.append((request, gpu, device))
    devices = tuple(
        PreparedDevice(
            request,
            node,
            device,
            (layout.gpu_id(uid, gpu.info.minor), layout.request_id(uid, request)),
            gpu.uuid,
            gpu.info.name,
            gpu.info.minor,
        )
        for request, gpu, device in allocated
    )
    spec = layout.claim_spec(uid, [(r, g) for r, g, _ in allocated]) if allocated else None
    return PreparedClaim(uid, devices, spec)
