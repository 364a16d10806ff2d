"""Which ResourceClaims a pod and its containers use, and the CDI devices a container gets from them.

Upstream ``pkg/kubelet/cm/dra`` (``manager.go``'s claim walk, ``GetResources``) and ``resourceclaim.Name``: pure
rules on the pod as the API server serves it and on the kubelet's claim state (its ``dra_manager_state`` entries).
The embedded kubelet's DRA manager prepares by them; the real-cluster backends read a real kubelet's checkpoint by
them to say what a container should have been given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ClaimError
from . import dracheckpoint as cp

__all__ = ["claim_name_for", "container_cdi_devices", "container_claims", "extended_resource_claim", "pod_claims"]

Obj = Mapping[str, Any]


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def claim_name_for(pod: Obj, pod_claim: Obj) -> tuple[str | None, bool]:
    """``resourceclaim.Name``: the ResourceClaim a pod's claim entry refers to, and whether the pod must
    own it (a claim made from a template). ``None``: no claim is needed (the status says so)."""
    meta = _meta(pod)
    where = f'pod "{meta.get("namespace", "")}/{meta.get("name", "")}"'
    if pod_claim.get("resourceClaimName") is not None:
        return str(pod_claim["resourceClaimName"]), False
    if pod_claim.get("resourceClaimTemplateName") is not None:
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if status.get("name") == pod_claim.get("name"):
                name = status.get("resourceClaimName")
                return (None if name is None else str(name)), True
        raise ClaimError(f"{where}: ResourceClaim not created yet")
    raise ClaimError(f'{where}, spec.resourceClaim "{pod_claim.get("name", "")}": none of the supported fields are set')


def extended_resource_claim(pod: Obj) -> str | None:
    """The ResourceClaim the scheduler made for the pod's DRA-backed extended resources
    (``status.extendedResourceClaimStatus``; DRAExtendedResource), or ``None``."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    name = status.get("resourceClaimName")
    return None if not name else str(name)


def pod_claims(pod: Obj, *, extended: bool = True) -> list[Obj]:
    """The pod's claim entries as the kubelet prepares them: ``spec.resourceClaims``, then (``extended``: feature gate
    DRAExtendedResource) the scheduler's claim for its extended resources, as an entry without a name."""
    claims: list[Obj] = list((pod.get("spec") or {}).get("resourceClaims") or [])
    name = extended_resource_claim(pod) if extended else None
    if name is not None:
        claims.append({"name": "", "resourceClaimName": name})
    return claims


def container_claims(pod: Obj, container_name: str) -> list[tuple[str, str, str]]:
    """(pod claim name, request or "", ResourceClaim name) for each claim the container uses."""
    spec = pod.get("spec") or {}
    container = next((c for c in spec.get("containers") or [] if c.get("name") == container_name), None)
    if container is None:
        return []
    pod_claims = {c.get("name"): c for c in spec.get("resourceClaims") or []}
    out = []
    for ref in (container.get("resources") or {}).get("claims") or []:
        pod_claim = pod_claims.get(ref.get("name"))
        if pod_claim is None:
            continue
        name, _ = claim_name_for(pod, pod_claim)
        if name is not None:
            out.append((str(ref.get("name")), str(ref.get("request") or ""), name))
    return out


def _extended_requests(pod: Obj, container_name: str) -> list[tuple[str, str, str]]:
    """(resource, request, claim name) for each DRA-backed extended resource of the container (``requestMappings``)."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    name = status.get("resourceClaimName")
    return [
        (str(m.get("resourceName", "")), str(m.get("requestName", "")), str(name))
        for m in status.get("requestMappings") or []
        if name and m.get("containerName") == container_name
    ]


def container_cdi_devices(
    pod: Obj, container_name: str, claim_state: Callable[[str, str], cp.ClaimInfoState | None], *, extended: bool = True
) -> list[str]:
    """``GetResources``: the CDI device IDs the runtime must give the container, in claim order, from the kubelet's
    state of each claim (``claim_state(namespace, name)``: its checkpoint entry); ``extended`` (DRAExtendedResource):
    then those of the requests the scheduler mapped to the container's extended resources."""
    namespace = str(_meta(pod).get("namespace", ""))
    ids: list[str] = []
    wanted = container_claims(pod, container_name)
    if extended:
        wanted += [(resource, request, name) for resource, request, name in _extended_requests(pod, container_name)]
    for _, request, name in wanted:
        state = claim_state(namespace, name)
        if state is None:
            raise ClaimError(
                f"internal error: unable to get claim info for ResourceClaim {name} in namespace {namespace}"
            )
        for devices in (state.driver_state or {}).values():
            for d in devices or []:
                if request and d.request_names and request.split("/")[0] not in d.request_names:
                    continue
                ids.extend(i for i in d.cdi_device_ids or [] if i not in ids)
    return ids
