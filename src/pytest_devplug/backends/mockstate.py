"""The mock-NVML state document (see docs/design.md): building it and editing it as the contract says.

Pure functions over the JSON dict, so every backend shares them and only moves bytes to the node.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

__all__ = [
    "MIG_PROFILES", "initial_state", "gpu_uuid", "mig_uuid", "check_mig_profiles", "with_xid", "with_lost",
    "with_fail_allocate", "with_fail_pre_start", "with_gpu_added", "with_gpu_removed",
]  # fmt: skip

State = dict[str, Any]

#: The MIG profiles of the mock's GPUs (an A100 with 40 GiB; the mock names them the same way): profile ->
#: (compute slices, memory slices, instances that fit on one GPU). A GPU has 7 compute and 8 memory slices.
MIG_PROFILES = {
    "1g.5gb": (1, 1, 7), "1g.5gb+me": (1, 1, 1), "1g.10gb": (1, 2, 4), "2g.10gb": (2, 2, 3), "3g.20gb": (3, 4, 2),
    "4g.20gb": (4, 4, 1), "7g.40gb": (7, 8, 1),
}  # fmt: skip


def gpu_uuid(index: int) -> str:
    """A stable, unique, GPU-shaped UUID for mock GPU ``index``."""
    return f"GPU-{index:08x}-d0d0-4e11-8a5e-{index:012x}"


def mig_uuid(gpu: int, position: int) -> str:
    """A stable, unique UUID for MIG device ``position`` of mock GPU ``gpu`` (it does not contain the GPU's)."""
    return f"MIG-{gpu:08x}-{position:04x}-4d16-9a3c-{gpu << 8 | position:012x}"


def check_mig_profiles(profiles: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the problem when ``profiles`` do not fit on one mock GPU together."""
    unknown = [p for p in profiles if p not in MIG_PROFILES]
    if unknown:
        raise ValueError(f"unknown MIG profile(s) {unknown}; the mock GPUs have {', '.join(MIG_PROFILES)}")
    slices = sum(MIG_PROFILES[p][0] for p in profiles)
    memory = sum(MIG_PROFILES[p][1] for p in profiles)
    too_many = [p for p in set(profiles) if profiles.count(p) > MIG_PROFILES[p][2]]
    if slices > 7 or memory > 8 or too_many:
        raise ValueError(
            f"MIG devices {list(profiles)} do not fit on one GPU: {slices} of 7 compute slices, {memory} of 8 memory "
            f"slices" + (f", more {too_many} than fit" if too_many else "")
        )


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


def initial_state(gpus: int, numa_nodes: int, mig: Sequence[str] = ()) -> State:
    """``gpus`` healthy GPUs spread in contiguous blocks over ``numa_nodes`` (0 = no topology); with ``mig``
    (profiles such as ``1g.5gb``) each GPU is MIG-enabled with those MIG devices."""
    if gpus < 0 or numa_nodes < 0:
        raise ValueError("gpus and numa_nodes must be >= 0")
    check_mig_profiles(mig)
    out = []
    for i in range(gpus):
        numa = (i * numa_nodes) // gpus if numa_nodes else None
        gpu = _gpu(i, numa)
        if mig:
            gpu["mig_enabled"] = True
            gpu["mig_devices"] = [{"uuid": mig_uuid(i, j), "profile": p, "gi": j + 1} for j, p in enumerate(mig)]
        out.append(gpu)
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
