"""The kubelet's device-manager checkpoint, ``kubelet_internal_checkpoint``, byte for byte.

The kubelet guards the file with a checksum: FNV-1a (32 bit) over go-spew's ``%#v`` rendering of the
Go value ``checkpoint.checkpointData`` with sorted map keys. Reproducing that rendering exactly is what
lets a checkpoint written by a real kubelet verify here and one written here be accepted by a kubelet,
so nil and empty values are kept apart (Go renders them differently) all the way from JSON and back.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_devplug.errors import CheckpointCorruptError, CheckpointFormatError, GoJSONSyntaxError
from pytest_devplug.kubeletmodel import gojson
from pytest_devplug.kubeletmodel.gojson import Number, Object, Value

__all__ = [
    "CHECKPOINT_NAME",
    "PodDevicesEntry",
    "CheckpointData",
    "render",
    "checksum",
    "encode",
    "decode",
    "decode_verified",
    "Checkpoint",
    "CheckpointEntry",
    "parse_checkpoint",
]

CHECKPOINT_NAME = "kubelet_internal_checkpoint"

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


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


def encode(data: CheckpointData, *, stored: int | None = None) -> bytes:
    """The file content the kubelet would write for ``data`` (``json.Marshal``); ``stored``
    replaces the computed checksum, to render a value as read back from a file."""
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
        "Checksum": checksum(data) if stored is None else stored,
    }
    return gojson.marshal(doc).encode()


# -- reading: json.Unmarshal into the kubelet's types, rule for rule -----------------------------
#
# What Go does and this code repeats: unknown keys are ignored; keys match field names exactly or,
# failing that, case-insensitively; ``null`` leaves a string or number as it was and makes a map or
# slice nil; a repeated key decodes again into the same value, so maps and structs merge while a
# slice starts over (reusing, without clearing, the elements its backing array already holds).

_UINT = re.compile(r"0|[1-9][0-9]*")
#: base64.StdEncoding: padded, any trailing bits accepted.
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_INT_KEY = re.compile(r"[+-]?[0-9]+")  # strconv.ParseInt(s, 10, 64)
_ENTRY_FIELDS = ("PodUID", "ContainerName", "ResourceName", "DeviceIDs", "AllocResp")


def _kind(value: Value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Number):
        return f"number {value.text}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _type_error(value: Value, where: str, go_type: str) -> CheckpointFormatError:
    return CheckpointFormatError(f"{where}: cannot unmarshal {_kind(value)} into {go_type}")


def _members(value: Object, fields: tuple[str, ...]) -> list[tuple[str, Value]]:
    return [(f, v) for k, v in value.members if (f := gojson.field_name(k, fields)) is not None]


def _string(old: str, value: Value, where: str) -> str:
    if value is None:
        return old
    if not isinstance(value, str):
        raise _type_error(value, where, "string")
    return value


def _strings(value: Value, where: str) -> list[str] | None:
    """A fresh ``[]string`` (map values are decoded into a zero value)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise _type_error(value, where, "[]string")
    return [_string("", v, f"{where}[{i}]") for i, v in enumerate(value)]


def _bytes(old: bytes | None, backing: bytearray, value: Value, where: str) -> tuple[bytes | None, bytearray]:
    """``[]byte``: base64 text (Go skips CR and LF) or an array of numbers 0..255."""
    if value is None:
        return None, bytearray()
    if isinstance(value, str):
        text = value.replace("\r", "").replace("\n", "")
        if not _BASE64.fullmatch(text):
            raise CheckpointFormatError(f"{where}: illegal base64 data {value[:40]!r}")
        return base64.b64decode(text), bytearray()
    if not isinstance(value, list):
        raise _type_error(value, where, "[]uint8")
    if not value:
        return b"", bytearray()
    for i, v in enumerate(value):
        if i >= len(backing):
            backing.append(0)
        if v is None:
            continue
        if not (isinstance(v, Number) and _UINT.fullmatch(v.text) and int(v.text) <= 0xFF):
            raise _type_error(v, f"{where}[{i}]", "uint8")
        backing[i] = int(v.text)
    return bytes(backing[: len(value)]), backing


def _numa_map(old: dict[int, list[str] | None] | None, value: Value, where: str) -> dict[int, list[str] | None] | None:
    if value is None:
        return None
    if not isinstance(value, Object):
        raise _type_error(value, where, "checkpoint.DevicesPerNUMA")
    out = {} if old is None else old
    for k, v in value.members:
        if not _INT_KEY.fullmatch(k) or not -(2**63) <= int(k) < 2**63:
            raise CheckpointFormatError(f"{where}: NUMA node {k!r} is not an int64")
        out[int(k)] = _strings(v, f"{where}[{k}]")
    return out


class _Decoder:
    """One ``json.Unmarshal`` into ``checkpoint.Data``; keeps what Go keeps between repeated keys."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.data = CheckpointData()
        self.stored = 0
        self._entries: list[PodDevicesEntry] = []  # the backing array of PodDeviceEntries
        self._resp_backing: dict[int, bytearray] = {}

    def top(self, value: Value) -> None:
        if value is None:
            return
        if not isinstance(value, Object):
            raise _type_error(value, self.source, "checkpoint.Data")
        for name, v in _members(value, ("Data", "Checksum")):
            if name == "Data":
                self._data(v, f"{self.source}: Data")
            elif v is not None:
                if not (isinstance(v, Number) and _UINT.fullmatch(v.text) and int(v.text) < 2**64):
                    raise _type_error(v, f"{self.source}: Checksum", "checksum.Checksum (uint64)")
                self.stored = int(v.text)

    def _data(self, value: Value, where: str) -> None:
        if value is None:
            return
        if not isinstance(value, Object):
            raise _type_error(value, where, "checkpoint.checkpointData")
        for name, v in _members(value, ("PodDeviceEntries", "RegisteredDevices")):
            if name == "PodDeviceEntries":
                self._pod_entries(v, f"{where}.PodDeviceEntries")
            else:
                self._registered(v, f"{where}.RegisteredDevices")

    def _registered(self, value: Value, where: str) -> None:
        if value is None:
            self.data.registered_devices = None
            return
        if not isinstance(value, Object):
            raise _type_error(value, where, "map[string][]string")
        if self.data.registered_devices is None:
            self.data.registered_devices = {}
        for k, v in value.members:
            self.data.registered_devices[k] = _strings(v, f"{where}[{k!r}]")

    def _pod_entries(self, value: Value, where: str) -> None:
        if value is None or value == []:
            # null is a nil slice, [] a new empty one: either way the old backing array is gone.
            self._entries = []
            self.data.pod_device_entries = None if value is None else []
            return
        if not isinstance(value, list):
            raise _type_error(value, where, "[]checkpoint.PodDevicesEntry")
        for i, v in enumerate(value):
            if i >= len(self._entries):
                self._entries.append(PodDevicesEntry("", "", "", None, None))
            self._entry(self._entries[i], v, f"{where}[{i}]")
        self.data.pod_device_entries = self._entries[: len(value)]

    def _entry(self, e: PodDevicesEntry, value: Value, where: str) -> None:
        if value is None:
            return
        if not isinstance(value, Object):
            raise _type_error(value, where, "checkpoint.PodDevicesEntry")
        for name, v in _members(value, _ENTRY_FIELDS):
            w = f"{where}.{name}"
            if name == "PodUID":
                e.pod_uid = _string(e.pod_uid, v, w)
            elif name == "ContainerName":
                e.container_name = _string(e.container_name, v, w)
            elif name == "ResourceName":
                e.resource_name = _string(e.resource_name, v, w)
            elif name == "DeviceIDs":
                e.device_ids = _numa_map(e.device_ids, v, w)
            else:
                backing = self._resp_backing.get(id(e), bytearray())
                e.alloc_resp, self._resp_backing[id(e)] = _bytes(e.alloc_resp, backing, v, w)


def decode(blob: bytes, *, source: str = "checkpoint") -> tuple[CheckpointData, int]:
    """Parse a checkpoint file's content as the kubelet's ``json.Unmarshal`` does: the data and
    the checksum stored with it; raises :class:`CheckpointFormatError` where the kubelet errs."""
    try:
        doc = gojson.parse(blob)
    except GoJSONSyntaxError as exc:
        raise CheckpointFormatError(f"{source}: not JSON: {exc}") from None
    decoder = _Decoder(source)
    decoder.top(doc)
    return decoder.data, decoder.stored


def decode_verified(blob: bytes, *, source: str = "checkpoint") -> CheckpointData:
    """:func:`decode`, then the kubelet's checksum check: raises :class:`CheckpointCorruptError` on a mismatch."""
    data, stored = decode(blob, source=source)
    computed = checksum(data)
    if computed != stored:
        raise CheckpointCorruptError(source, stored, computed)
    return data


# -- the reader's view: what a test asks of a kubelet's checkpoint -------------------------------


@dataclass(frozen=True)
class CheckpointEntry:
    """One container's devices of one resource, as the kubelet recorded them."""

    pod_uid: str
    container_name: str
    resource_name: str
    #: NUMA node (decimal string, ``"-1"`` for none) -> device IDs, as the kubelet writes it.
    device_ids: Mapping[str, tuple[str, ...]]
    #: The protobuf-encoded ``ContainerAllocateResponse`` the plugin returned (``b""`` for nil).
    alloc_resp: bytes

    @property
    def all_device_ids(self) -> list[str]:
        return sorted(d for ids in self.device_ids.values() for d in ids)


@dataclass(frozen=True)
class Checkpoint:
    """The kubelet's device-manager checkpoint, decoded as the kubelet decodes it (the checksum is not judged
    here: ``devplug checkpoint verify`` does that)."""

    entries: tuple[CheckpointEntry, ...]
    #: resource -> device IDs healthy when the file was written.
    registered_devices: Mapping[str, tuple[str, ...]]
    raw: bytes

    def entries_for(self, pod_uid: str, container: str | None = None) -> list[CheckpointEntry]:
        return [
            e for e in self.entries if e.pod_uid == pod_uid and (container is None or e.container_name == container)
        ]


def parse_checkpoint(raw: bytes) -> Checkpoint:
    """Decode ``kubelet_internal_checkpoint`` bytes by the kubelet's rules (:func:`decode`: Go's ``json.Unmarshal``,
    keys matched case-insensitively, unknown keys ignored); raises :class:`CheckpointFormatError` (a
    ``ValueError``) where the kubelet's decoding fails."""
    data, _ = decode(raw, source=CHECKPOINT_NAME)
    entries = tuple(
        CheckpointEntry(
            pod_uid=e.pod_uid,
            container_name=e.container_name,
            resource_name=e.resource_name,
            device_ids={str(node): tuple(ids or ()) for node, ids in (e.device_ids or {}).items()},
            alloc_resp=e.alloc_resp or b"",
        )
        for e in data.pod_device_entries or ()
    )
    registered = {k: tuple(v or ()) for k, v in (data.registered_devices or {}).items()}
    return Checkpoint(entries=entries, registered_devices=registered, raw=raw)
