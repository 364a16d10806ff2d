"""The driver's entries in a claim's ``status.devices`` (KEP 4817, ``--device-status``): what each prepared GPU is.

The list is shared with the scheduler's binding-condition controllers and the claim's other drivers, so an entry is
merged, never the list replaced: this driver sets ``data`` on the entries of its own devices (adding an entry for a
device that has none) and leaves every other field and entry as it found them. The write is one JSON patch of the
list, made conditional on the resourceVersion read (a conflict reads the claim again); JSON patch because it is the
one patch type every release of the Python client sends for a list body.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .kubeapi import KubeApiError
from .prepare import PreparedClaim

__all__ = ["CONFLICT_RETRIES", "ClaimStatusApi", "device_data", "report_device_status", "with_device_data"]

#: How many times a write that lost to another writer is tried again, each on a fresh read.
CONFLICT_RETRIES = 5

JSON = dict[str, Any]


class ClaimStatusApi(Protocol):
    """What :func:`report_device_status` needs of :class:`~.kubeapi.KubeApi`."""

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    def set_claim_device_status(
        self, namespace: str, name: str, resource_version: str, entries: Sequence[Mapping[str, Any]]
    ) -> None: ...


def device_data(prepared: PreparedClaim) -> dict[tuple[str, str], JSON]:
    """(pool, device) -> the data this driver publishes for it: the GPU's UUID, model and minor number."""
    return {(d.pool, d.device): {"uuid": d.uuid, "model": d.model, "minor": d.minor} for d in prepared.devices}


def with_device_data(
    entries: Sequence[Mapping[str, Any]], driver: str, data: Mapping[tuple[str, str], JSON]
) -> list[JSON]:
    """``entries`` with ``data`` set on this driver's devices' entries (an entry added where a device has none);
    every other field and entry unchanged, in their order."""
    out = [dict(e) for e in entries]
    for (pool, device), value in data.items():
        mine = [e for e in out if e.get("driver") == driver and e.get("pool") == pool and e.get("device") == device]
        if not mine:
            mine = [{"driver": driver, "pool": pool, "device": device}]
            out.extend(mine)
        for entry in mine:
            entry["data"] = dict(value)
    return out


def report_device_status(api: ClaimStatusApi, claim: Mapping[str, Any], driver: str, prepared: PreparedClaim) -> bool:
    """Publish ``prepared``'s device data in ``claim``'s ``status.devices``; False when it was there already. Raises
    the API's error (:class:`~.kubeapi.KubeApiError`), a conflict only when :data:`CONFLICT_RETRIES` writes lost."""
    meta = claim.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    data = device_data(prepared)
    if not data:
        return False
    current: Mapping[str, Any] = claim
    for _ in range(CONFLICT_RETRIES):
        entries = list((current.get("status") or {}).get("devices") or [])
        wanted = with_device_data(entries, driver, data)
        if wanted == entries:
            return False
        version = str((current.get("metadata") or {}).get("resourceVersion", ""))
        try:
            api.set_claim_device_status(namespace, name, version, wanted)
            return True
        except KubeApiError as exc:
            if exc.status != 409:
                raise
        current = api.get_claim(namespace, name)
    raise KubeApiError(409, f"claim {namespace}/{name}: status.devices changed under {CONFLICT_RETRIES} writes")
