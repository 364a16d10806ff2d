"""Readable views of a device-manager checkpoint, with each ``AllocResp`` decoded."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from .api.deviceplugin import v1beta1_pb2 as pb
from .kubeletmodel.checkpoint import CheckpointData
from .kubeletmodel.dracheckpoint import DRACheckpointFile

__all__ = [
    "decode_alloc_resp",
    "checkpoint_as_dict",
    "format_checkpoint",
    "dra_checkpoint_as_dict",
    "format_dra_checkpoint",
    "printable",
]


def printable(text: str) -> str:
    """``text`` safe for a terminal and for line-based reading: a backslash, a control character
    (escape sequences, newlines) or an invisible one (bidi overrides, line separators) is written
    as a Python escape, so a device ID or path can neither drive the terminal nor forge a line."""
    return "".join(c if c.isprintable() and c != "\\" else _escape(c) for c in text)


def _escape(c: str) -> str:
    if c == "\\":
        return "\\\\"
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def decode_alloc_resp(blob: bytes | None) -> pb.ContainerAllocateResponse:
    """Parse a stored Allocate response; raises ``DecodeError`` when it is not one."""
    return pb.ContainerAllocateResponse.FromString(blob or b"")


def _resp_dict(blob: bytes | None) -> dict[str, Any]:
    try:
        return json_format.MessageToDict(decode_alloc_resp(blob), preserving_proto_field_name=True)
    except DecodeError as exc:
        return {"undecodable": f"{exc} ({len(blob or b'')} bytes)"}
    except RecursionError:
        return {"undecodable": f"nested too deeply ({len(blob or b'')} bytes)"}


def checkpoint_as_dict(data: CheckpointData, stored: int, computed: int) -> dict[str, Any]:
    entries = [
        {
            "pod_uid": e.pod_uid,
            "container": e.container_name,
            "resource": e.resource_name,
            "devices_by_numa": None if e.device_ids is None else {str(k): v for k, v in sorted(e.device_ids.items())},
            "allocate_response": _resp_dict(e.alloc_resp),
        }
        for e in data.pod_device_entries or []
    ]
    return {
        "checksum": {"stored": stored, "computed": computed, "valid": stored == computed},
        "registered_devices": data.registered_devices,
        "pod_device_entries": entries,
    }


def _format_resp(blob: bytes | None) -> list[str]:
    try:
        resp = decode_alloc_resp(blob)
    except DecodeError as exc:
        return [f"      (AllocResp is not a ContainerAllocateResponse: {exc})"]
    except RecursionError:
        # protobuf's pure-Python parser recurses into nested unknown groups
        return ["      (AllocResp is not a ContainerAllocateResponse: nested too deeply)"]
    lines = [f"      env {k}={v}" for k, v in sorted(resp.envs.items())]
    lines += [f"      device {d.host_path} -> {d.container_path} ({d.permissions})" for d in resp.devices]
    lines += [f"      mount {m.host_path} -> {m.container_path} ({'ro' if m.read_only else 'rw'})" for m in resp.mounts]
    lines += [f"      annotation {k}={v}" for k, v in sorted(resp.annotations.items())]
    lines += [f"      cdi {c.name}" for c in resp.cdi_devices]
    return lines or ["      (empty response)"]


def format_checkpoint(path: str, data: CheckpointData, stored: int, computed: int) -> str:
    """The text of ``devplug checkpoint show``; every string from the file passes :func:`printable`."""
    return "\n".join(printable(line) for line in _lines(path, data, stored, computed))


def _lines(path: str, data: CheckpointData, stored: int, computed: int) -> list[str]:
    state = "ok" if stored == computed else f"MISMATCH: computed {computed} (the kubelet would discard this file)"
    out = [f"{path}", f"  checksum {stored} {state}", "  registered devices (healthy when written):"]
    if not data.registered_devices:
        out.append("    (none)")
    for resource, ids in sorted((data.registered_devices or {}).items()):
        out.append(f"    {resource}: {', '.join(ids or []) or '(none)'}")
    out.append("  allocations:")
    if not data.pod_device_entries:
        out.append("    (none)")
    for e in data.pod_device_entries or []:
        out.append(f"    pod {e.pod_uid} container {e.container_name} resource {e.resource_name}")
        for numa, ids in sorted((e.device_ids or {}).items()):
            where = "no NUMA node" if numa == -1 else f"NUMA node {numa}"
            out.append(f"      devices on {where}: {', '.join(ids or [])}")
        out.extend(_format_resp(e.alloc_resp))
    return out


def dra_checkpoint_as_dict(file: DRACheckpointFile) -> dict[str, Any]:
    """``dra_manager_state`` as JSON-ready data (``devplug checkpoint show --json``)."""
    claims = [
        {
            "claim_uid": e.claim_uid,
            "claim": f"{e.namespace}/{e.claim_name}",
            "pod_uids": None if e.pod_uids is None else sorted(e.pod_uids),
            "drivers": None
            if e.driver_state is None
            else {
                driver: None
                if devices is None
                else [
                    {
                        "pool": d.pool_name,
                        "device": d.device_name,
                        "requests": d.request_names,
                        "cdi_device_ids": d.cdi_device_ids,
                        **({"share_id": d.share_id} if d.share_id is not None else {}),
                    }
                    for d in devices
                ]
                for driver, devices in e.driver_state.items()
            },
        }
        for e in file.entries or []
    ]
    return {
        "checksum": {"stored": file.stored, "computed": file.computed, "valid": file.stored == file.computed},
        "claims": claims,
    }


def format_dra_checkpoint(path: str, file: DRACheckpointFile) -> str:
    """The text of ``devplug checkpoint show`` for ``dra_manager_state``; every string passes :func:`printable`."""
    state = (
        "ok"
        if file.stored == file.computed
        else (f"MISMATCH: computed {file.computed} (the kubelet refuses to start its DRA manager with this file)")
    )
    out = [path, f"  DRA checkpoint, checksum {file.stored} {state}", "  claims:"]
    if not file.entries:
        out.append("    (none)")
    for e in file.entries or []:
        out.append(
            f"    claim {e.namespace}/{e.claim_name} uid {e.claim_uid} "
            f"pods {', '.join(sorted(e.pod_uids or [])) or '(none)'}"
        )
        for driver, devices in sorted((e.driver_state or {}).items()):
            out.append(f"      driver {driver}:{'' if devices else ' (no devices)'}")
            for d in devices or []:
                extra = f" requests {', '.join(d.request_names)}" if d.request_names else ""
                cdi = f" cdi {', '.join(d.cdi_device_ids)}" if d.cdi_device_ids else ""
                out.append(f"        device {d.pool_name}/{d.device_name}{extra}{cdi}")
    return "\n".join(printable(line) for line in out)
