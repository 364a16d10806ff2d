"""``resource.k8s.io/v1`` objects as tests make and read them: plain data views and manifest builders.

Manifests are the JSON the API server takes (camelCase keys); views are frozen dataclasses read from what it
answers, so a failure message can print them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..kuberest import KubeRest
from ..kubeletmodel import dracheckpoint as cp

__all__ = [
    "RESOURCE_API",
    "AllocatedDevice",
    "DRACheckpoint",
    "PreparedClaim",
    "PreparedDevice",
    "SliceView",
    "claim_manifest",
    "device_class_manifest",
    "device_taint_rule_manifest",
    "driver_selector",
    "list_slices",
    "parse_dra_checkpoint",
    "template_manifest",
]

RESOURCE_API = "/apis/resource.k8s.io/v1"


@dataclass(frozen=True)
class SliceView:
    """One ResourceSlice: which driver, node and pool it belongs to, and the names of its devices."""

    name: str
    uid: str
    resource_version: str
    driver: str
    node: str | None
    pool: str
    generation: int
    slice_count: int
    devices: tuple[str, ...]
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> SliceView:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        pool = spec.get("pool") or {}
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            driver=str(spec.get("driver", "")),
            node=spec.get("nodeName"),
            pool=str(pool.get("name", "")),
            generation=int(pool.get("generation", 0)),
            slice_count=int(pool.get("resourceSliceCount", 0)),
            devices=tuple(str(d.get("name", "")) for d in spec.get("devices") or []),
            raw=dict(obj),
        )

    def device(self, name: str) -> dict[str, Any]:
        """The device entry ``name`` of this slice (attributes, capacity)."""
        for d in (self.raw.get("spec") or {}).get("devices") or []:
            if d.get("name") == name:
                return dict(d)
        raise KeyError(f"ResourceSlice {self.name} has no device {name!r}")

    def describe(self) -> str:
        return (
            f"{self.name} (driver {self.driver}, node {self.node}, pool {self.pool} gen {self.generation}: "
            f"{', '.join(self.devices) or 'no devices'})"
        )


def list_slices(rest: KubeRest, *, node: str | None = None, driver: str | None = None) -> list[SliceView]:
    """The ResourceSlices the API server has, by field selector (``spec.nodeName``, ``spec.driver``), sorted by name."""
    selector = ",".join(f"{k}={v}" for k, v in (("spec.nodeName", node), ("spec.driver", driver)) if v)
    query = {"fieldSelector": selector} if selector else {}
    return sorted(
        (SliceView.from_obj(o) for o in rest.items(f"{RESOURCE_API}/resourceslices", **query)), key=lambda s: s.name
    )


@dataclass(frozen=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results`` entry of a claim."""

    request: str
    driver: str
    pool: str
    device: str

    @classmethod
    def from_result(cls, r: Mapping[str, Any]) -> AllocatedDevice:
        return cls(
            str(r.get("request", "")), str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))
        )


@dataclass(frozen=True)
class PreparedDevice:
    """One device a driver returned from NodePrepareResources, as the kubelet checkpointed it."""

    pool: str
    device: str
    requests: tuple[str, ...]
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    """One claim in the kubelet's ``dra_manager_state``: the pods using it, what each driver prepared."""

    claim_uid: str
    claim_name: str
    namespace: str
    pod_uids: frozenset[str]
    devices: Mapping[str, tuple[PreparedDevice, ...]]

    def cdi_device_ids(self, driver: str | None = None) -> list[str]:
        return [
            i for d, devs in self.devices.items() if driver in (None, d) for dev in devs for i in dev.cdi_device_ids
        ]


@dataclass(frozen=True)
class DRACheckpoint:
    """The kubelet's ``dra_manager_state``, decoded; ``stored``/``computed`` its checksum and the one its Data has."""

    claims: tuple[PreparedClaim, ...]
    stored: int
    computed: int
    raw: bytes = field(repr=False)

    @property
    def checksum_ok(self) -> bool:
        return self.stored == self.computed

    def claim(self, namespace: str, name: str) -> PreparedClaim | None:
        return next((c for c in self.claims if (c.namespace, c.claim_name) == (namespace, name)), None)


def parse_dra_checkpoint(raw: bytes) -> DRACheckpoint:
    """Decode ``dra_manager_state`` bytes (Go's JSON rules); raises ``CheckpointError`` when the kubelet could not
    read it."""
    file = cp.decode(raw)
    claims = tuple(
        PreparedClaim(
            e.claim_uid,
            e.claim_name,
            e.namespace,
            frozenset(e.pod_uids or ()),
            {
                driver: tuple(
                    PreparedDevice(
                        d.pool_name, d.device_name, tuple(d.request_names or ()), tuple(d.cdi_device_ids or ())
                    )
                    for d in devs or []
                )
                for driver, devs in (e.driver_state or {}).items()
            },
        )
        for e in file.entries or []
    )
    return DRACheckpoint(claims, file.stored, file.computed, raw)


# -- manifests ------------------------------------------------------------------------------------


def driver_selector(driver: str) -> dict[str, Any]:
    """A CEL selector matching the devices of ``driver``."""
    return {"cel": {"expression": f'device.driver == "{driver}"'}}


def device_class_manifest(
    name: str,
    driver: str,
    selectors: Sequence[Mapping[str, Any]] | None = None,
    *,
    extended_resource_name: str | None = None,
) -> dict[str, Any]:
    """A DeviceClass selecting ``driver``'s devices (and ``selectors``, all of which must match); with
    ``extended_resource_name`` (DRAExtendedResource, 1.36+) a pod asking for that extended resource is served by it."""
    spec: dict[str, Any] = {"selectors": [driver_selector(driver), *(dict(s) for s in selectors or ())]}
    if extended_resource_name is not None:
        spec["extendedResourceName"] = extended_resource_name
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def device_taint_rule_manifest(name: str, driver: str, pool: str, taint: Mapping[str, str]) -> dict[str, Any]:
    """A DeviceTaintRule (``resource.k8s.io/v1`` from 1.37, DRADeviceTaintRules) putting ``taint`` (key, value,
    effect) on every device of ``driver`` in ``pool``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"deviceSelector": {"driver": driver, "pool": pool}, "taint": dict(taint)},
    }


def _claim_spec(
    device_class: str,
    count: int,
    requests: Sequence[Mapping[str, Any]] | None,
    selectors: Sequence[Mapping[str, Any]] | None,
    tolerations: Sequence[Mapping[str, str]] | None = None,
    config: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    if requests is None:
        exact: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
        if selectors:
            exact["selectors"] = [dict(s) for s in selectors]
        if tolerations:
            exact["tolerations"] = [dict(t) for t in tolerations]
        requests = [{"name": "req-0", "exactly": exact}]
    devices: dict[str, Any] = {"requests": [dict(r) for r in requests]}
    if config:
        devices["config"] = [{"opaque": {"driver": d, "parameters": dict(params)}} for d, params in config.items()]
    return {"devices": devices}


def claim_manifest(
    name: str,
    namespace: str,
    device_class: str,
    *,
    count: int = 1,
    requests: Sequence[Mapping[str, Any]] | None = None,
    selectors: Sequence[Mapping[str, Any]] | None = None,
    tolerations: Sequence[Mapping[str, str]] | None = None,
    config: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim for ``count`` devices of ``device_class`` (one request ``req-0``, tolerating ``tolerations``
    of device taints), or the given ``requests``. ``config``: opaque parameters per driver name, for every request
    (``spec.devices.config``: how a claim asks a driver for a setting, e.g. NVIDIA's ``GpuConfig`` sharing)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": _claim_spec(device_class, count, requests, selectors, tolerations, config),
    }


def template_manifest(
    name: str,
    namespace: str,
    device_class: str,
    *,
    count: int = 1,
    requests: Sequence[Mapping[str, Any]] | None = None,
    selectors: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ResourceClaimTemplate: each pod using it gets a claim of its own (made by the resourceclaim controller)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": _claim_spec(device_class, count, requests, selectors)},
    }
