"""The kubelet's device-manager checkpoint, ``kubelet_internal_checkpoint``, byte for byte.

The kubelet guards the file with a checksum: FNV-1a (32 bit) over go-spew's ``%#v`` rendering of the
Go value ``checkpoint.checkpointData`` with sorted map keys. Reproducing that rendering exactly is what
lets a checkpoint written by a real kubelet verify here and one written here be accepted by a kubelet,
so nil and empty values are kept apart (Go renders them differently) all the way from JSON and back.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CHECKPOINT_NAME",
    "PodDevicesEntry",
    "CheckpointData",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointCorruptError",
    "render",
    "checksum",
    "encode",
    "decode",
    "read_checkpoint",
    "write_checkpoint",
]

CHECKPOINT_NAME = "kubelet_internal_checkpoint"

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


class CheckpointError(Exception):
    """A checkpoint file could not be used."""


class CheckpointFormatError(CheckpointError):
    """The file is not a device-manager checkpoint (bad JSON or wrong shape)."""


class CheckpointCorruptError(CheckpointError):
    """The stored checksum does not match the data: the kubelet discards such a file."""

    def __init__(self, path: str, stored: int, computed: int) -> None:
        super().__init__(
            f"{path}: checksum mismatch: stored {stored}, computed {computed} "
            "(the kubelet logs this and starts with empty device state)"
        )
        self.stored = stored
        self.computed = computed


@dataclass
class PodDevicesEntry:
    """One container's devices of one resource. ``None`` stands for Go's nil (JSON ``null``)."""

    pod_uid: str
    container_name: str
    resource_name: str
    #: NUMA node -> device IDs; node -1 holds devices without topology.
    device_ids: dict[int, list[str] | None] | None = field(default_factory=dict)
    #: The protobuf-encoded ``ContainerAllocateResponse`` the plugin returned.
    alloc_resp: bytes | None = b""


@dataclass
class CheckpointData:
    pod_device_entries: list[PodDevicesEntry] | None = None
    #: resource -> healthy device IDs at the time of writing.
    registered_devices: dict[str, list[str] | None] | None = None


def _spew_strings(values: list[str] | None) -> str:
    return "<nil>" if values is None else "[" + " ".join(values) + "]"


def _spew_entry(e: PodDevicesEntry) -> str:
    if e.device_ids is None:
        ids = "<nil>"
    else:
        ids = "map[" + " ".join(f"{k}:{_spew_strings(e.device_ids[k])}" for k in sorted(e.device_ids)) + "]"
    resp = "<nil>" if e.alloc_resp is None else "[" + " ".join(str(b) for b in e.alloc_resp) + "]"
    return (
        f"{{PodUID:(string){e.pod_uid} ContainerName:(string){e.container_name} "
        f"ResourceName:(string){e.resource_name} DeviceIDs:(checkpoint.DevicesPerNUMA){ids} "
        f"AllocResp:([]uint8){resp}}}"
    )


def render(data: CheckpointData) -> str:
    """go-spew's ``%#v`` text of ``checkpoint.checkpointData`` (DisableMethods, SortKeys)."""
    if data.pod_device_entries is None:
        entries = "<nil>"
    else:
        entries = "[" + " ".join(_spew_entry(e) for e in data.pod_device_entries) + "]"
    reg = data.registered_devices
    if reg is None:
        devices = "<nil>"
    else:
        devices = "map[" + " ".join(f"{k}:{_spew_strings(reg[k])}" for k in sorted(reg, key=str.encode)) + "]"
    return (
        f"(checkpoint.checkpointData){{PodDeviceEntries:([]checkpoint.PodDevicesEntry){entries} "
        f"RegisteredDevices:(map[string][]string){devices}}}"
    )


def checksum(data: CheckpointData) -> int:
    """The kubelet's checksum of ``data``: FNV-1a 32 over :func:`render`."""
    h = _FNV32_OFFSET
    for b in render(data).encode():
        h = ((h ^ b) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def _go_json(value: Any) -> str:
    # encoding/json: compact, UTF-8 kept, and <, >, & escaped for HTML safety.
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def encode(data: CheckpointData) -> bytes:
    """The file content the kubelet would write for ``data``."""
    entries: list[dict[str, Any]] | None = None
    if data.pod_device_entries is not None:
        entries = []
        for e in data.pod_device_entries:
            ids = None
            if e.device_ids is not None:
                # Go sorts map keys by their JSON text, so "-1" < "0" < "10" < "2".
                ids = {str(k): e.device_ids[k] for k in sorted(e.device_ids, key=str)}
            entries.append(
                {
                    "PodUID": e.pod_uid,
                    "ContainerName": e.container_name,
                    "ResourceName": e.resource_name,
                    "DeviceIDs": ids,
                    "AllocResp": None if e.alloc_resp is None else base64.b64encode(e.alloc_resp).decode(),
                }
            )
    reg = data.registered_devices
    registered = None if reg is None else {k: reg[k] for k in sorted(reg, key=str.encode)}
    doc = {
        "Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered},
        "Checksum": checksum(data),
    }
    return _go_json(doc).encode()


def _str_list(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointFormatError(f"{where}: expected a list of strings, got {value!r}")
    return list(value)


def _field(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if value is not None and not isinstance(value, kind):
        raise CheckpointFormatError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _entry(raw: Any, where: str) -> PodDevicesEntry:
    if not isinstance(raw, dict):
        raise CheckpointFormatError(f"{where}: expected an object, got {raw!r}")
    ids_raw = _field(raw, "DeviceIDs", dict, where)
    ids: dict[int, list[str] | None] | None = None
    if ids_raw is not None:
        ids = {}
        for k, v in ids_raw.items():
            try:
                numa = int(k, 10)
            except ValueError:
                raise CheckpointFormatError(f"{where}.DeviceIDs: NUMA node {k!r} is not an integer") from None
            ids[numa] = _str_list(v, f"{where}.DeviceIDs[{k}]")
    resp_raw = _field(raw, "AllocResp", str, where)
    try:
        resp = None if resp_raw is None else base64.b64decode(resp_raw, validate=True)
    except binascii.Error as exc:
        raise CheckpointFormatError(f"{where}.AllocResp: not base64: {exc}") from None
    return PodDevicesEntry(
        pod_uid=_field(raw, "PodUID", str, where) or "",
        container_name=_field(raw, "ContainerName", str, where) or "",
        resource_name=_field(raw, "ResourceName", str, where) or "",
        device_ids=ids,
        alloc_resp=resp,
    )


def decode(blob: bytes, *, source: str = "checkpoint") -> tuple[CheckpointData, int]:
    """Parse a checkpoint file's content into its data and the checksum stored with it."""
    try:
        doc = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointFormatError(f"{source}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("Data"), dict):
        raise CheckpointFormatError(f'{source}: expected {{"Data": {{...}}, "Checksum": N}}')
    stored = doc.get("Checksum")
    if not isinstance(stored, int) or isinstance(stored, bool) or not 0 <= stored <= 0xFFFFFFFF:
        raise CheckpointFormatError(f"{source}: Checksum must be a uint32, got {stored!r}")
    raw = doc["Data"]
    entries_raw = _field(raw, "PodDeviceEntries", list, f"{source}: Data")
    entries = None
    if entries_raw is not None:
        entries = [_entry(e, f"{source}: Data.PodDeviceEntries[{i}]") for i, e in enumerate(entries_raw)]
    reg_raw = _field(raw, "RegisteredDevices", dict, f"{source}: Data")
    reg = None
    if reg_raw is not None:
        reg = {k: _str_list(v, f"{source}: Data.RegisteredDevices[{k}]") for k, v in reg_raw.items()}
    return CheckpointData(pod_device_entries=entries, registered_devices=reg), stored


def read_checkpoint(path: Path) -> CheckpointData:
    """Read and verify a checkpoint; raises :class:`CheckpointCorruptError` on a checksum mismatch."""
    data, stored = decode(path.read_bytes(), source=str(path))
    computed = checksum(data)
    if computed != stored:
        raise CheckpointCorruptError(str(path), stored, computed)
    return data


def write_checkpoint(path: Path, data: CheckpointData) -> None:
    """Write atomically as the kubelet does: temp file in the same dir, fsync, rename."""
    blob = encode(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
