"""The kubelet's DRA checkpoint, ``<kubelet root>/dra_manager_state``, byte for byte.

Upstream ``pkg/kubelet/cm/dra/state``: the file is ``json.Marshal`` of ``{"Data": <string>, "Checksum":
<uint32>}``, where Data is itself ``json.Marshal`` of ``{"kind": "DRACheckpoint", "apiVersion":
"checkpoint.dra.kubelet.k8s.io/v1", "ClaimInfoStateList": [...]}`` and Checksum is crc32 (IEEE) of
Data's bytes. Unlike the device-manager checkpoint, nothing is hashed from a Go value's rendering, so
reading and writing only need Go's JSON rules (compact, HTML-safe escapes, sorted map keys, nil
apart from empty).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_devplug.kubeletmodel.releases import KubeVersion
from pytest_devplug.kubeletmodel import gojson
from pytest_devplug.errors import CheckpointCorruptError, CheckpointFormatError, GoJSONSyntaxError
from pytest_devplug.kubeletmodel.gojson import Number, Object, Value
from pytest_devplug.kubeletmodel.checkpointfile import read_bytes, write_atomically

__all__ = [
    "CHECKPOINT_NAME",
    "CHECKPOINT_KIND",
    "CHECKPOINT_API_VERSION",
    "PreparedDevice",
    "ClaimInfoState",
    "DRACheckpointFile",
    "encode_data",
    "checksum",
    "encode",
    "decode",
    "decode_data",
    "is_dra_checkpoint",
    "read_checkpoint",
    "write_checkpoint",
]

CHECKPOINT_NAME = "dra_manager_state"
CHECKPOINT_KIND = "DRACheckpoint"
CHECKPOINT_API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"
_UINT32_MAX = 0xFFFFFFFF


@dataclass
class PreparedDevice:
    """``state.Device``: one device a driver prepared for a claim. ``None`` stands for Go's nil."""

    pool_name: str
    device_name: str
    request_names: list[str] | None = None
    cdi_device_ids: list[str] | None = None
    #: ``ShareID`` (Kubernetes 1.35+: always written, ``null`` when unset; before: no such field).
    share_id: str | None = None


@dataclass
class ClaimInfoState:
    """``state.ClaimInfoState``: one claim the kubelet tracks, the pods using it, what each driver prepared."""

    claim_uid: str
    claim_name: str
    namespace: str
    #: ``sets.Set[string]`` of pod UIDs (a JSON object of empty objects); ``None`` is a nil set.
    pod_uids: set[str] | None = field(default_factory=set)
    #: driver name -> its prepared devices (``DriverState.Devices``; ``None`` is a nil slice).
    driver_state: dict[str, list[PreparedDevice] | None] | None = field(default_factory=dict)


@dataclass
class DRACheckpointFile:
    """A decoded file: the Data string as stored, its stored checksum and the entries it holds."""

    data: str
    stored: int
    entries: list[ClaimInfoState] | None

    @property
    def computed(self) -> int:
        return checksum(self.data)


def _device_doc(d: PreparedDevice, share_ids: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {"PoolName": d.pool_name, "DeviceName": d.device_name}
    if share_ids:  # a *types.UID without a JSON tag: written even when nil
        doc["ShareID"] = d.share_id
    doc["RequestNames"] = d.request_names
    doc["CDIDeviceIDs"] = d.cdi_device_ids
    return doc


def _entry_doc(e: ClaimInfoState, share_ids: bool) -> dict[str, Any]:
    drivers = None
    if e.driver_state is not None:
        drivers = {
            name: {"Devices": None if devs is None else [_device_doc(d, share_ids) for d in devs]}
            for name, devs in sorted(e.driver_state.items(), key=lambda kv: kv[0].encode())
        }
    return {
        "ClaimUID": e.claim_uid,
        "ClaimName": e.claim_name,
        "Namespace": e.namespace,
        "PodUIDs": None if e.pod_uids is None else {uid: {} for uid in sorted(e.pod_uids, key=str.encode)},
        "DriverState": drivers,
    }


def encode_data(entries: list[ClaimInfoState] | None, kube: KubeVersion | None = None) -> str:
    """The Data string the kubelet of ``kube``'s release (default: the default one) writes for ``entries``
    (``NewCheckpoint``): from 1.35 every device carries ``ShareID``."""
    share_ids = (kube or KubeVersion.of()).has("dra-checkpoint-share-id")
    doc = {
        "kind": CHECKPOINT_KIND,
        "apiVersion": CHECKPOINT_API_VERSION,
        "ClaimInfoStateList": None if entries is None else [_entry_doc(e, share_ids) for e in entries],
    }
    return gojson.marshal(doc)


def checksum(data: str) -> int:
    """``crc32.ChecksumIEEE([]byte(Data))``."""
    return zlib.crc32(data.encode("utf-8", "surrogatepass")) & _UINT32_MAX


def encode(entries: list[ClaimInfoState] | None, kube: KubeVersion | None = None) -> bytes:
    """The whole file content (``MarshalCheckpoint``) as ``kube``'s release writes it."""
    data = encode_data(entries, kube)
    return gojson.marshal({"Data": data, "Checksum": checksum(data)}).encode()


# -- reading: json.Unmarshal's rules for the fields the kubelet has -----------------------------


def _kind(value: Value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Number):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _expect(value: Value, kind: type, where: str, go_type: str, source: str) -> Any:
    if not isinstance(value, kind) or (kind is Number and isinstance(value, bool)):
        raise CheckpointFormatError(f"{source}: cannot unmarshal {_kind(value)} into {where} of type {go_type}")
    return value


def _string(value: Value, where: str, source: str, old: str = "") -> str:
    return old if value is None else str(_expect(value, str, where, "string", source))


def _strings(value: Value, where: str, source: str) -> list[str] | None:
    if value is None:
        return None
    return [_string(v, where, source) for v in _expect(value, list, where, "[]string", source)]


def _device(value: Value, source: str) -> PreparedDevice:
    d = PreparedDevice("", "")
    if value is None:
        return d
    fields = ("PoolName", "DeviceName", "ShareID", "RequestNames", "CDIDeviceIDs")
    for key, v in _expect(value, Object, "Device", "state.Device", source).members:
        name = gojson.field_name(key, fields)
        if name == "PoolName":
            d.pool_name = _string(v, "Device.PoolName", source, d.pool_name)
        elif name == "DeviceName":
            d.device_name = _string(v, "Device.DeviceName", source, d.device_name)
        elif name == "ShareID":
            d.share_id = None if v is None else _string(v, "Device.ShareID", source)
        elif name == "RequestNames":
            d.request_names = _strings(v, "Device.RequestNames", source)
        elif name == "CDIDeviceIDs":
            d.cdi_device_ids = _strings(v, "Device.CDIDeviceIDs", source)
    return d


def _driver_state(value: Value, source: str) -> dict[str, list[PreparedDevice] | None] | None:
    if value is None:
        return None
    out: dict[str, list[PreparedDevice] | None] = {}
    for driver, state in _expect(
        value, Object, "ClaimInfoState.DriverState", "map[string]state.DriverState", source
    ).members:
        devices = out.get(driver)
        if state is not None:
            for key, v in _expect(state, Object, "DriverState", "state.DriverState", source).members:
                if gojson.field_name(key, ("Devices",)) == "Devices":
                    items = None if v is None else _expect(v, list, "DriverState.Devices", "[]state.Device", source)
                    devices = None if items is None else [_device(d, source) for d in items]
        out[driver] = devices
    return out


def _entry(value: Value, source: str) -> ClaimInfoState:
    e = ClaimInfoState("", "", "", None, None)
    if value is None:
        return e
    fields = ("ClaimUID", "ClaimName", "Namespace", "PodUIDs", "DriverState")
    for key, v in _expect(value, Object, "ClaimInfoStateList", "state.ClaimInfoState", source).members:
        name = gojson.field_name(key, fields)
        if name == "ClaimUID":
            e.claim_uid = _string(v, "ClaimInfoState.ClaimUID", source, e.claim_uid)
        elif name == "ClaimName":
            e.claim_name = _string(v, "ClaimInfoState.ClaimName", source, e.claim_name)
        elif name == "Namespace":
            e.namespace = _string(v, "ClaimInfoState.Namespace", source, e.namespace)
        elif name == "PodUIDs":
            if v is None:
                e.pod_uids = None
            else:
                members = _expect(v, Object, "ClaimInfoState.PodUIDs", "sets.Set[string]", source).members
                for _, empty in members:
                    if empty is not None:
                        _expect(empty, Object, "ClaimInfoState.PodUIDs", "sets.Empty", source)
                e.pod_uids = (e.pod_uids or set()) | {uid for uid, _ in members}
        elif name == "DriverState":
            e.driver_state = _driver_state(v, source)
    return e


def decode_data(data: str, *, source: str = CHECKPOINT_NAME) -> list[ClaimInfoState] | None:
    """The entries of a Data string (``GetClaimInfoStateList``); raises :class:`CheckpointFormatError`."""
    try:
        doc = gojson.parse(data.encode("utf-8", "surrogatepass"))
    except GoJSONSyntaxError as exc:
        raise CheckpointFormatError(f"{source}: Data is not JSON: {exc}") from None
    entries: list[ClaimInfoState] | None = None
    for key, v in _expect(doc, Object, "Data", "state.CheckpointData", source).members:
        name = gojson.field_name(key, ("kind", "apiVersion", "ClaimInfoStateList"))
        if name in ("kind", "apiVersion"):
            _string(v, f"CheckpointData.{name}", source)
        elif name == "ClaimInfoStateList":
            entries = (
                None
                if v is None
                else [
                    _entry(e, source)
                    for e in _expect(v, list, "CheckpointData.ClaimInfoStateList", "state.ClaimInfoStateList", source)
                ]
            )
    return entries


def is_dra_checkpoint(blob: bytes) -> bool:
    """Whether ``blob`` has this file's outer shape (a string ``Data``; the device manager's is an object),
    so one command can read either checkpoint."""
    try:
        doc = gojson.parse(blob)
    except GoJSONSyntaxError:
        return False
    return isinstance(doc, Object) and any(
        gojson.field_name(k, ("Data",)) and isinstance(v, str) for k, v in doc.members
    )


def decode(blob: bytes, *, source: str = CHECKPOINT_NAME) -> DRACheckpointFile:
    """Parse a file's content as ``Checkpoint.UnmarshalCheckpoint`` does, without judging the checksum
    (``devplug checkpoint show`` prints a corrupt file too); raises :class:`CheckpointFormatError`."""
    try:
        doc = gojson.parse(blob)
    except GoJSONSyntaxError as exc:
        raise CheckpointFormatError(f"{source}: not JSON: {exc}") from None
    data, stored = "", 0
    for key, v in _expect(doc, Object, "checkpoint", "state.Checkpoint", source).members:
        name = gojson.field_name(key, ("Data", "Checksum"))
        if name == "Data":
            data = _string(v, "Checkpoint.Data", source, data)
        elif name == "Checksum" and v is not None:
            text = _expect(v, Number, "Checkpoint.Checksum", "uint32", source).text
            if not text.isdigit() or int(text) > _UINT32_MAX:
                raise CheckpointFormatError(
                    f"{source}: cannot unmarshal number {text} into Checkpoint.Checksum of type uint32"
                )
            stored = int(text)
    return DRACheckpointFile(data, stored, decode_data(data, source=source))


def read_checkpoint(path: Path) -> list[ClaimInfoState] | None:
    """Read and verify ``path``; raises :class:`CheckpointCorruptError` on a checksum mismatch (the
    kubelet then refuses to start its DRA manager)."""
    file = decode(read_bytes(path), source=str(path))
    if file.computed != file.stored:
        raise CheckpointCorruptError(str(path), file.stored, file.computed)
    return file.entries


def write_checkpoint(path: Path, entries: list[ClaimInfoState] | None, kube: KubeVersion | None = None) -> None:
    """Write atomically as the kubelet's checkpoint manager does."""
    write_atomically(path, encode(entries, kube))
