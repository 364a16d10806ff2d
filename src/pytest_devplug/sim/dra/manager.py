"""The kubelet's DRA manager: prepares and unprepares pods' ResourceClaims and keeps ``dra_manager_state``.

Upstream ``pkg/kubelet/cm/dra/manager.go`` + ``claiminfo.go``, step for step: a validation pass that
changes nothing (claim fetched, owned by and reserved for the pod, allocated, its drivers registered);
then the pod is added to each claim's info and the checkpoint written *before* any driver is called, so
a kubelet restart can still unprepare; one NodePrepareResources call per plugin for the claims not yet
prepared; every claim of a call must come back without error, or the whole prepare fails and the
caller (the pod worker) retries it later; prepared devices are checkpointed. Unprepare drops the pod's
reference and calls NodeUnprepareResources only for claims no other pod uses. Claim infos restored
from the checkpoint are not "prepared" in memory, so after a kubelet restart the driver is asked again
(drivers must be idempotent).

Pods and claims are Kubernetes JSON objects (``dict``), as the API server serves them; claims come
through :class:`ClaimSource`, the seam where the real API server plugs in.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_devplug.kubeletmodel.releases import KubeVersion
from pytest_devplug.api.dra import v1_pb2 as pb
from pytest_devplug.sim.checkpoint import CheckpointError
from pytest_devplug.sim.dra import checkpoint as cp
from pytest_devplug.sim.dra.client import DRAPluginCallError, DRAPluginClient
from pytest_devplug.sim.dra.health import HealthInfoCache
from pytest_devplug.sim.dra.plugins import DRAPluginError, DRAPluginManager
from pytest_devplug.sim.errors import SimError

__all__ = [
    "ClaimSource", "DRAManagerError", "DRAPrepareError", "DRAManager", "claim_name_for", "container_cdi_devices",
    "container_claims", "extended_resource_claim", "pod_claims",
]  # fmt: skip

Obj = Mapping[str, Any]


class DRAManagerError(SimError):
    """The DRA manager cannot start (its checkpoint cannot be read)."""


class DRAPrepareError(SimError):
    """Preparing or unpreparing a pod's claims failed; the text is the kubelet's (the pod worker retries)."""


class ClaimSource(Protocol):
    """Reads ResourceClaims from the API server (``ResourceV1().ResourceClaims(ns).Get``)."""

    def get_resource_claim(self, namespace: str, name: str) -> Obj: ...


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
        raise DRAPrepareError(f"{where}: ResourceClaim not created yet")
    raise DRAPrepareError(f'{where}, spec.resourceClaim "{pod_claim.get("name", "")}": none of the supported fields are set')


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


def _owned_by(claim: Obj, pod: Obj) -> bool:
    uid = _meta(pod).get("uid")
    return any(ref.get("controller") and ref.get("uid") == uid for ref in _meta(claim).get("ownerReferences") or [])


def _reserved_for(claim: Obj, pod: Obj) -> bool:
    uid = _meta(pod).get("uid")
    return any(
        ref.get("resource") == "pods" and not ref.get("apiGroup") and ref.get("uid") == uid
        for ref in (claim.get("status") or {}).get("reservedFor") or []
    )


@dataclass
class _ClaimInfo:
    """``ClaimInfo``: the checkpointed state plus whether it was prepared since this kubelet started."""

    state: cp.ClaimInfoState
    prepared: bool = False


def _claim_info_from_claim(claim: Obj) -> _ClaimInfo:
    meta = _meta(claim)
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation is None:
        raise DRAPrepareError(f"ResourceClaim {meta.get('name', '')}: not allocated")
    drivers: dict[str, list[cp.PreparedDevice] | None] = {
        str(r["driver"]): None for r in (allocation.get("devices") or {}).get("results") or [] if r.get("driver")
    }
    return _ClaimInfo(cp.ClaimInfoState(str(meta.get("uid", "")), str(meta.get("name", "")), str(meta.get("namespace", "")), set(), drivers))


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
            raise DRAPrepareError(f"internal error: unable to get claim info for ResourceClaim {name} in namespace {namespace}")
        for devices in (state.driver_state or {}).values():
            for d in devices or []:
                if request and d.request_names and request.split("/")[0] not in d.request_names:
                    continue
                ids.extend(i for i in d.cdi_device_ids or [] if i not in ids)
    return ids


@dataclass
class _Batch:
    plugin: DRAPluginClient
    claims: list[pb.Claim] = field(default_factory=list)


class DRAManager:
    """One kubelet's claim state; ``state_dir`` holds ``dra_manager_state``."""

    def __init__(
        self,
        state_dir: Path,
        plugins: DRAPluginManager,
        claims: ClaimSource,
        *,
        health_cache: HealthInfoCache | None = None,
        logger: logging.Logger | None = None,
        health_messages: bool = True,
        kube: KubeVersion | None = None,
    ) -> None:
        self.checkpoint_path = state_dir / cp.CHECKPOINT_NAME
        #: Feature gate ResourceHealthStatusMessage (1.36+): a device's health message reaches the pod's status.
        self.health_messages = health_messages
        #: The release whose checkpoint layout is written.
        self.kube = kube
        #: Feature gate DRAExtendedResource: the scheduler's claim for a pod's extended resources is prepared too.
        self.extended_resources = (kube or KubeVersion.of()).gate("DRAExtendedResource")
        self.plugins = plugins
        self._claims = claims
        self.health_cache = health_cache or HealthInfoCache()
        self._log = logger or logging.getLogger(__name__)
        self._lock = threading.RLock()
        #: (namespace, claim name) -> its info, in insertion order (the checkpoint's order)
        self._cache: dict[tuple[str, str], _ClaimInfo] = {}
        if self.checkpoint_path.exists():
            try:
                entries = cp.read_checkpoint(self.checkpoint_path)
            except (CheckpointError, OSError) as exc:
                raise DRAManagerError(f"failed to get checkpoint {cp.CHECKPOINT_NAME}: {exc}") from exc
            for e in entries or []:
                self._cache[(e.namespace, e.claim_name)] = _ClaimInfo(e)
        else:
            state_dir.mkdir(parents=True, exist_ok=True)
            self._sync_to_checkpoint()

    # --- state ----------------------------------------------------------------------------------

    def _sync_to_checkpoint(self) -> None:
        cp.write_checkpoint(self.checkpoint_path, [info.state for info in self._cache.values()], self.kube)

    def claim_infos(self) -> list[cp.ClaimInfoState]:
        """A snapshot of what the checkpoint holds."""
        with self._lock:
            return [copy.deepcopy(i.state) for i in self._cache.values()]

    def prepared(self, namespace: str, claim_name: str) -> bool:
        with self._lock:
            info = self._cache.get((namespace, claim_name))
            return info is not None and info.prepared

    def pod_might_need_to_unprepare(self, pod_uid: str) -> bool:
        with self._lock:
            return any(pod_uid in (i.state.pod_uids or set()) for i in self._cache.values())

    # --- prepare --------------------------------------------------------------------------------

    def prepare_resources(self, pod: Obj) -> None:
        """``PrepareResources``; raises :class:`DRAPrepareError` ("prepare dynamic resources: ...")."""
        try:
            self._prepare(pod)
        except (DRAPrepareError, DRAPluginError) as exc:
            raise DRAPrepareError(f"prepare dynamic resources: {exc}") from None

    def _prepare(self, pod: Obj) -> None:
        meta = _meta(pod)
        pod_uid = str(meta.get("uid", ""))
        # validation pass: nothing changes if anything is wrong, so a failing pod can be deleted cleanly
        todo: list[tuple[Obj, _ClaimInfo, dict[str, DRAPluginClient]]] = []
        for pod_claim in pod_claims(pod, extended=self.extended_resources):
            name, must_own = claim_name_for(pod, pod_claim)
            if name is None:
                continue
            try:
                claim = self._claims.get_resource_claim(str(meta.get("namespace", "")), name)
            except Exception as exc:  # noqa: BLE001 - any API failure is this text upstream
                raise DRAPrepareError(f"fetch ResourceClaim {name}: {exc}") from None
            if must_own and not _owned_by(claim, pod):
                raise DRAPrepareError(
                    f"ResourceClaim {name} was not created for pod {meta.get('namespace', '')}/{meta.get('name', '')} (pod is not owner)"
                )
            if not _reserved_for(claim, pod):
                raise DRAPrepareError(
                    f"pod {meta.get('name', '')} ({pod_uid}) is not allowed to use ResourceClaim {name} ({_meta(claim).get('uid', '')})"
                )
            info = _claim_info_from_claim(claim)
            plugins = {driver: self.plugins.get_plugin(driver) for driver in info.state.driver_state or {}}
            todo.append((claim, info, plugins))

        batches: dict[int, _Batch] = {}
        to_mark: list[tuple[str, str]] = []
        with self._lock:
            for _, new_info, plugins in todo:
                key = (new_info.state.namespace, new_info.state.claim_name)
                info = self._cache.setdefault(key, new_info)
                if info.state.claim_uid != new_info.state.claim_uid:
                    raise DRAPrepareError(
                        f"old ResourceClaim with same name {key[1]} and different UID {info.state.claim_uid} "
                        "still exists (previous pod force-deleted?!)"
                    )
                info.state.pod_uids = (info.state.pod_uids or set()) | {pod_uid}
                self._sync_to_checkpoint()
                if info.prepared:
                    continue
                to_mark.append(key)
                request = pb.Claim(namespace=key[0], uid=info.state.claim_uid, name=key[1])
                for driver in info.state.driver_state or {}:
                    batches.setdefault(id(plugins[driver]), _Batch(plugins[driver])).claims.append(request)

        for batch in batches.values():
            try:
                response = batch.plugin.node_prepare_resources(batch.claims)
            except DRAPluginCallError as exc:
                raise DRAPrepareError(f"NodePrepareResources: {exc}") from None
            by_uid = {c.uid: c for c in batch.claims}
            for uid, result in response.claims.items():
                if uid not in by_uid:
                    raise DRAPrepareError(f"NodePrepareResources returned result for unknown claim UID {uid}")
                if result.error:
                    raise DRAPrepareError(f"NodePrepareResources failed for ResourceClaim {by_uid[uid].name}: {result.error}")
                added = [
                    cp.PreparedDevice(
                        d.pool_name, d.device_name, list(d.request_names) or None, list(d.cdi_device_ids) or None,
                        d.share_id if d.HasField("share_id") else None,
                    )
                    for d in result.devices
                ]
                with self._lock:
                    state = self._cache[(by_uid[uid].namespace, by_uid[uid].name)].state
                    drivers = state.driver_state = state.driver_state or {}
                    # a claim prepared again after a failed batch reports its devices again: keep each once
                    kept = [d for d in drivers.get(batch.plugin.driver_name) or [] if d not in added]
                    drivers[batch.plugin.driver_name] = kept + added
            if len(batch.claims) != len(response.claims):
                raise DRAPrepareError(f"NodePrepareResources skipped {len(batch.claims) - len(response.claims)} ResourceClaims")

        with self._lock:
            for key in to_mark:
                self._cache[key].prepared = True
            self._sync_to_checkpoint()

    # --- unprepare ------------------------------------------------------------------------------

    def unprepare_resources(self, pod: Obj) -> None:
        """``UnprepareResources`` for a pod being removed."""
        meta = _meta(pod)
        names = []
        for pod_claim in pod_claims(pod, extended=self.extended_resources):
            name, _ = claim_name_for(pod, pod_claim)
            if name is not None:
                names.append(name)
        self.unprepare_pod(str(meta.get("uid", "")), str(meta.get("namespace", "")), names)

    def unprepare_pod(self, pod_uid: str, namespace: str, claim_names: Iterable[str]) -> None:
        """``unprepareResources``: raises :class:`DRAPrepareError`; calling it again is safe."""
        try:
            self._unprepare(pod_uid, namespace, claim_names)
        except (DRAPrepareError, DRAPluginError) as exc:
            raise DRAPrepareError(f"unprepare dynamic resources: {exc}") from None

    def _unprepare(self, pod_uid: str, namespace: str, claim_names: Iterable[str]) -> None:
        batches: dict[str, list[pb.Claim]] = {}
        done: list[tuple[str, str]] = []
        with self._lock:
            for name in claim_names:
                info = self._cache.get((namespace, name))
                if info is None:
                    continue
                if len(info.state.pod_uids or set()) > 1:
                    # checkpointed with the next successful change; a restart before then just repeats this
                    (info.state.pod_uids or set()).discard(pod_uid)
                    continue
                done.append((namespace, name))
                for driver in info.state.driver_state or {}:
                    batches.setdefault(driver, []).append(pb.Claim(namespace=namespace, uid=info.state.claim_uid, name=name))
        for driver, claims in batches.items():
            plugin = self.plugins.get_plugin(driver)
            try:
                response = plugin.node_unprepare_resources(claims)
            except DRAPluginCallError as exc:
                raise DRAPrepareError(f"NodeUnprepareResources: {exc}") from None
            by_uid = {c.uid: c for c in claims}
            for uid, result in response.claims.items():
                if uid not in by_uid:
                    raise DRAPrepareError(f"NodeUnprepareResources returned result for unknown claim UID {uid}")
                if result.error:
                    raise DRAPrepareError(f"NodeUnprepareResources failed for ResourceClaim {by_uid[uid].name}: {result.error}")
            if len(claims) != len(response.claims):
                raise DRAPrepareError(f"NodeUnprepareResources skipped {len(claims) - len(response.claims)} ResourceClaims")
        with self._lock:
            for key in done:
                self._cache.pop(key, None)
            self._sync_to_checkpoint()

    def reconcile(self, active_pod_uids: Collection[str]) -> list[str]:
        """``reconcileLoop`` once: unprepare for pods no longer active (deleted while the kubelet was down,
        or whose prepare never finished). Returns the errors, one per pod that must be retried."""
        with self._lock:
            inactive: dict[str, tuple[str, list[str]]] = {}
            for info in self._cache.values():
                for uid in info.state.pod_uids or set():
                    if uid not in active_pod_uids:
                        inactive.setdefault(uid, (info.state.namespace, []))[1].append(info.state.claim_name)
        errors = []
        for uid, (namespace, names) in inactive.items():
            try:
                self.unprepare_pod(uid, namespace, names)
            except DRAPrepareError as exc:
                self._log.info("Unpreparing pod resources in reconcile loop failed, will retry podUID=%s: %s", uid, exc)
                errors.append(f"pod {uid}: {exc}")
        return errors

    # --- what containers get ----------------------------------------------------------------------

    def container_cdi_devices(self, pod: Obj, container_name: str) -> list[str]:
        """``GetResources``: the CDI device IDs the runtime must give the container, in claim order."""
        with self._lock:
            return container_cdi_devices(pod, container_name, lambda ns, name: None if (i := self._cache.get((ns, name))) is None else i.state,
                                         extended=self.extended_resources)  # fmt: skip

    def allocated_resources_status(self, pod: Obj, container_name: str) -> list[dict[str, Any]]:
        """``UpdateAllocatedResourcesStatus`` for one container: its ``allocatedResourcesStatus`` entries
        (``claim:<name>[/<request>]``, one resource per device, resourceID its first CDI ID or
        ``<driver>/<pool>/<device>``)."""
        namespace = str(_meta(pod).get("namespace", ""))
        statuses: list[dict[str, Any]] = []
        with self._lock:
            for claim, request, name in container_claims(pod, container_name):
                info = self._cache.get((namespace, name))
                if info is None:
                    continue
                resources: list[dict[str, Any]] = []
                seen: set[str] = set()
                for driver, devices in (info.state.driver_state or {}).items():
                    for d in devices or []:
                        if request and d.request_names and request.split("/")[0] not in d.request_names:
                            continue
                        health = self.health_cache.get(driver, d.pool_name, d.device_name)
                        rid = (d.cdi_device_ids or [f"{driver}/{d.pool_name}/{d.device_name}"])[0]
                        if rid in seen:
                            continue
                        seen.add(rid)
                        entry: dict[str, Any] = {"resourceID": rid, "health": health.health}
                        if health.message and self.health_messages:
                            entry["message"] = health.message
                        resources.append(entry)
                if resources:
                    statuses.append({"name": f"claim:{claim}/{request}" if request else f"claim:{claim}", "resources": resources})
        return statuses
