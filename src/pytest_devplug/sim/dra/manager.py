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
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_devplug.kubeletmodel.releases import KubeVersion
from pytest_devplug.api.dra import v1_pb2 as pb
from pytest_devplug.errors import (
    CheckpointError,
    ClaimError,
    DRAManagerError,
    DRAPluginCallError,
    DRAPluginError,
    DRAPrepareError,
)
from pytest_devplug.kubeletmodel import dracheckpoint as cp
from pytest_devplug.kubeletmodel.claims import claim_name_for, container_cdi_devices, container_claims, pod_claims
from pytest_devplug.sim.dra.client import DRAPluginClient
from pytest_devplug.sim.dra.health import HealthInfoCache
from pytest_devplug.sim.dra.plugins import DRAPluginManager

__all__ = [
    "ClaimSource",
    "DRAManager",
]

Obj = Mapping[str, Any]


class ClaimSource(Protocol):
    """Reads ResourceClaims from the API server (``ResourceV1().ResourceClaims(ns).Get``)."""

    def get_resource_claim(self, namespace: str, name: str) -> Obj: ...


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


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
    return _ClaimInfo(
        cp.ClaimInfoState(
            str(meta.get("uid", "")), str(meta.get("name", "")), str(meta.get("namespace", "")), set(), drivers
        )
    )


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
        except (DRAPrepareError, DRAPluginError, ClaimError) as exc:
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
                    f"ResourceClaim {name} was not created for pod {meta.get('namespace', '')}/{meta.get('name', '')} "
                    "(pod is not owner)"
                )
            if not _reserved_for(claim, pod):
                raise DRAPrepareError(
                    f"pod {meta.get('name', '')} ({pod_uid}) is not allowed to use ResourceClaim {name} "
                    f"({_meta(claim).get('uid', '')})"
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
                    raise DRAPrepareError(
                        f"NodePrepareResources failed for ResourceClaim {by_uid[uid].name}: {result.error}"
                    )
                added = [
                    cp.PreparedDevice(
                        d.pool_name,
                        d.device_name,
                        list(d.request_names) or None,
                        list(d.cdi_device_ids) or None,
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
                raise DRAPrepareError(
                    f"NodePrepareResources skipped {len(batch.claims) - len(response.claims)} ResourceClaims"
                )

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
            try:
                name, _ = claim_name_for(pod, pod_claim)
            except ClaimError as exc:
                raise DRAPrepareError(f"unprepare dynamic resources: {exc}") from None
            if name is not None:
                names.append(name)
        self.unprepare_pod(str(meta.get("uid", "")), str(meta.get("namespace", "")), names)

    def unprepare_pod(self, pod_uid: str, namespace: str, claim_names: Iterable[str]) -> None:
        """``unprepareResources``: raises :class:`DRAPrepareError`; calling it again is safe."""
        try:
            self._unprepare(pod_uid, namespace, claim_names)
        except (DRAPrepareError, DRAPluginError, ClaimError) as exc:
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
                    batches.setdefault(driver, []).append(
                        pb.Claim(namespace=namespace, uid=info.state.claim_uid, name=name)
                    )
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
                    raise DRAPrepareError(
                        f"NodeUnprepareResources failed for ResourceClaim {by_uid[uid].name}: {result.error}"
                    )
            if len(claims) != len(response.claims):
                raise DRAPrepareError(
                    f"NodeUnprepareResources skipped {len(claims) - len(response.claims)} ResourceClaims"
                )
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
            try:
                return container_cdi_devices(
                    pod,
                    container_name,
                    lambda ns, name: None if (i := self._cache.get((ns, name))) is None else i.state,
                    extended=self.extended_resources,
                )
            except ClaimError as exc:
                raise DRAPrepareError(str(exc)) from None

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
                    statuses.append(
                        {"name": f"claim:{claim}/{request}" if request else f"claim:{claim}", "resources": resources}
                    )
        return statuses
