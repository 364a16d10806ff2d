"""GPU inventory and health: one thread-safe, versioned store read by every gRPC stream.

The health monitor writes it (probes and Xid events); ListAndWatch streams wait on its
version, so every change reaches every stream, and a re-registered plugin reports the same
health because the store outlives the gRPC server.

Health policy (docs/explanation/design.md): a critical Xid makes a GPU Unhealthy until it is reset; a GPU
NVML reports lost is Unhealthy; a lost GPU that answers again is Healthy, and that clears an
earlier Xid too (a lost-and-back GPU was reset).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

#: A device ID becomes a path component (``/var/run/nvidia-container-devices/<id>``, CDI names)
#: and an item of the comma-separated ``NVIDIA_VISIBLE_DEVICES``: letters, digits, ``.``, ``_``,
#: ``-``, starting with a letter or digit (so never ``..``), as NVIDIA's ``GPU-<uuid>`` and
#: ``MIG-<uuid>`` are.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


class UnsafeDeviceIdError(ValueError):
    """NVML reported a GPU whose UUID cannot be used as a device ID."""


def check_device_id(uuid: str, minor: int) -> None:
    """Refuse a UUID that could escape a path or widen a device list (``../../etc``, ``a,b``)."""
    if not _SAFE_ID.fullmatch(uuid):
        raise UnsafeDeviceIdError(
            f"GPU {minor} reports UUID {uuid!r}, which is not safe as a device ID "
            "(allowed: letters, digits, '.', '_', '-', starting with a letter or digit, at most 255)"
        )


@dataclass(frozen=True)
class GpuInfo:
    """What NVML told us about a GPU the last time it answered."""

    uuid: str
    name: str
    minor: int
    numa_node: int | None
    memory_mib: int = 0

    def sort_key(self) -> tuple[int, str]:
        return (self.minor, self.uuid)


@dataclass(frozen=True)
class Gpu:
    info: GpuInfo
    lost: bool = False
    xids: tuple[int, ...] = ()

    @property
    def uuid(self) -> str:
        return self.info.uuid

    @property
    def healthy(self) -> bool:
        return not self.lost and not self.xids

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY

    def reason(self) -> str:
        parts = []
        if self.lost:
            parts.append("lost")
        if self.xids:
            parts.append("Xid " + ",".join(str(x) for x in self.xids))
        return "; ".join(parts) or "ok"


@dataclass(frozen=True)
class Probe:
    """One GPU as seen by a probe; ``lost`` GPUs carry the info from when they last answered."""

    info: GpuInfo
    lost: bool


@dataclass
class Snapshot:
    version: int
    gpus: list[Gpu] = field(default_factory=list)

    def by_uuid(self) -> dict[str, Gpu]:
        return {g.uuid: g for g in self.gpus}


class DeviceState:
    """The current GPU list with health; every change bumps ``version`` and wakes waiters."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._gpus: dict[str, Gpu] = {}
        self._version = 0

    def snapshot(self) -> Snapshot:
        with self._cond:
            gpus = sorted(self._gpus.values(), key=lambda g: g.info.sort_key())
            return Snapshot(self._version, gpus)

    def get(self, uuid: str) -> Gpu | None:
        with self._cond:
            return self._gpus.get(uuid)

    def wait_for_change(self, version: int, timeout: float) -> Snapshot:
        """Return as soon as the version differs from ``version``, or after ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != version, timeout)
        return self.snapshot()

    def _commit(self, gpus: dict[str, Gpu]) -> list[str]:
        """Replace the list if anything changed (lock held); returns human-readable changes."""
        changes: list[str] = []
        for uuid in sorted(set(self._gpus) | set(gpus)):
            old, new = self._gpus.get(uuid), gpus.get(uuid)
            if old == new:
                continue
            if old is None and new is not None:
                changes.append(f"{uuid} added ({new.health}: {new.reason()})")
            elif new is None:
                changes.append(f"{uuid} removed")
            elif old is not None and old.health != new.health:
                changes.append(f"{uuid} {old.health} -> {new.health} ({new.reason()})")
            elif old is not None and old.reason() != new.reason():
                # Same health for a new reason (an Xid'd GPU now lost, say): worth a line too.
                changes.append(f"{uuid} {new.health} ({old.reason()} -> {new.reason()})")
        if gpus != self._gpus:
            self._gpus = gpus
            self._version += 1
            self._cond.notify_all()
        return changes

    def update_inventory(self, probes: list[Probe]) -> list[str]:
        """Apply a full probe: add/remove GPUs, track lost, clear Xids of a lost-and-back GPU.

        A probe with an unsafe UUID is refused whole (:class:`UnsafeDeviceIdError`, naming the
        GPU) and the current list stays as it was.
        """
        for p in probes:
            check_device_id(p.info.uuid, p.info.minor)
        with self._cond:
            new: dict[str, Gpu] = {}
            for p in probes:
                old = self._gpus.get(p.info.uuid)
                if old is None:
                    new[p.info.uuid] = Gpu(p.info, lost=p.lost)
                elif old.lost and not p.lost:
                    new[p.info.uuid] = Gpu(p.info, lost=False, xids=())  # it was reset
                else:
                    new[p.info.uuid] = Gpu(p.info, lost=p.lost, xids=old.xids)
            return self._commit(new)

    def mark_xid(self, uuid: str, xid: int) -> list[str]:
        """Record a critical Xid: the GPU stays Unhealthy until it is reset."""
        with self._cond:
            old = self._gpus.get(uuid)
            if old is None or xid in old.xids:
                return []
            new = dict(self._gpus)
            new[uuid] = Gpu(old.info, old.lost, old.xids + (xid,))
            return self._commit(new)
