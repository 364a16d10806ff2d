"""The mock-NVML state document (see docs/design.md): building it and editing it as the contract says.

Pure functions over the JSON dict, so every backend shares them and only moves bytes to the node.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = [
    "initial_state", "gpu_uuid", "with_xid", "with_lost", "with_fail_allocate", "with_fail_pre_start", "with_gpu_added",
    "with_gpu_removed",
]  # fmt: skip

State = dict[str, Any]


def gpu_uuid(index: int) -> str:
    """A stable, unique, GPU-shaped UUID for mock GPU ``index``."""
    return f"GPU-{index:08x}-d0d0-4e11-8a5e-{index:012x}"


def _gpu(index: int, numa_node: int | None) -> dict[str, Any]:
    return {
        "uuid": gpu_uuid(index),
        "name": "NVIDIA A100-SXM4-40GB",
        "memory_mib": 40960,
        "numa_node": numa_node,
        "minor": index,
        "lost": False,
        "fail_allocate": False,
    }


def initial_state(gpus: int, numa_nodes: int) -> State:
    """``gpus`` healthy GPUs spread in contiguous blocks over ``numa_nodes`` (0 = no topology)."""
    if gpus < 0 or numa_nodes < 0:
        raise ValueError("gpus and numa_nodes must be >= 0")
    out = []
    for i in range(gpus):
        numa = (i * numa_nodes) // gpus if numa_nodes else None
        out.append(_gpu(i, numa))
    return {"gpus": out, "events": []}


def _find(state: State, uuid: str) -> dict[str, Any]:
    for g in state["gpus"]:
        if g["uuid"] == uuid:
            return g  # type: ignore[no-any-return]
    known = [g["uuid"] for g in state["gpus"]]
    raise KeyError(f"no mock GPU {uuid!r}; known: {known}")


def with_xid(state: State, uuid: str, xid: int) -> State:
    """Append an Xid event (events are append-only: each is delivered once)."""
    new = copy.deepcopy(state)
    _find(new, uuid)
    new.setdefault("events", []).append({"uuid": uuid, "xid": int(xid)})
    return new


def with_lost(state: State, uuid: str, lost: bool) -> State:
    new = copy.deepcopy(state)
    _find(new, uuid)["lost"] = bool(lost)
    return new


def with_fail_allocate(state: State, uuid: str, fail: bool) -> State:
    new = copy.deepcopy(state)
    _find(new, uuid)["fail_allocate"] = bool(fail)
    return new


def with_fail_pre_start(state: State, uuid: str, fail: bool) -> State:
    """``fail_pre_start``: the included plugin's PreStartContainer fails for requests with that GPU (read by the
    plugin only, like ``fail_allocate``; absent means false)."""
    new = copy.deepcopy(state)
    _find(new, uuid)["fail_pre_start"] = bool(fail)
    return new


def with_gpu_added(state: State, numa_node: int | None = 0) -> tuple[State, str]:
    """Add one GPU with the next free minor; returns the new state and its UUID."""
    new = copy.deepcopy(state)
    minor = max((g["minor"] for g in new["gpus"]), default=-1) + 1
    gpu = _gpu(minor, numa_node)
    new["gpus"].append(gpu)
    return new, str(gpu["uuid"])


def with_gpu_removed(state: State, uuid: str) -> State:
    new = copy.deepcopy(state)
    _find(new, uuid)
    new["gpus"] = [g for g in new["gpus"] if g["uuid"] != uuid]
    return new
