"""Which mock GPU backs each device a plugin advertises.

A plugin's device IDs are its own: a GPU's UUID (the included plugin, NVIDIA's default), ``<uuid>::<n>``
replicas of one GPU (time-slicing, MPS), a device-node name (``nvidia0``). A fault of a physical GPU
must reach every device the plugin backs with it, so the harness maps device IDs to mock GPUs rather
than assuming one device per GPU: an ID that embeds a GPU's UUID is backed by that GPU, an ID that is
its device node (``nvidia<minor>``, ``/dev/nvidia<minor>``) too. An ID that names no mock GPU has no
known backing (the checks needing one skip, saying so).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["backing_gpu", "backed_devices", "UnknownBackingError"]

_DEVICE_NODE = re.compile(r"(?:/dev/)?nvidia(\d+)")


class UnknownBackingError(LookupError):
    """A device ID names no mock GPU (neither a UUID in it nor its device node)."""


def backing_gpu(device_id: str, gpus: Sequence[Mapping[str, Any]]) -> str:
    """The UUID of the mock GPU (entries of the mock state's ``gpus``) that backs ``device_id``."""
    named = [str(g["uuid"]) for g in gpus if str(g["uuid"]) in device_id]
    if len(named) == 1:
        return named[0]
    node = _DEVICE_NODE.fullmatch(device_id)
    if not named and node is not None:
        minor = int(node.group(1))
        by_minor = [str(g["uuid"]) for g in gpus if g.get("minor") == minor]
        if len(by_minor) == 1:
            return by_minor[0]
    known = [str(g["uuid"]) for g in gpus]
    why = f"it names {len(named)} of them ({named})" if named else "it names none of them (no UUID, no nvidia<minor>)"
    raise UnknownBackingError(f"device ID {device_id!r}: no single mock GPU backs it; {why}; mock GPUs: {known}")


def backed_devices(device_ids: Iterable[str], gpus: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Mock GPU UUID -> the given device IDs it backs (sorted), for every GPU (empty list: backs none).

    Raises :class:`UnknownBackingError` for the first ID no single GPU backs.
    """
    out: dict[str, list[str]] = {str(g["uuid"]): [] for g in gpus}
    for device_id in device_ids:
        out[backing_gpu(device_id, gpus)].append(device_id)
    return {uuid: sorted(ids) for uuid, ids in out.items()}
