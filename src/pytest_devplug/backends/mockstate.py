"""The mock-NVML state document (see docs/explanation/design.md): building it and editing it as the contract says.

Pure functions over the JSON dict, so every backend shares them and only moves bytes to the node.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

__all__ = [
    "DEFAULT_GPU_MODEL",
    "GPU_MODELS",
    "MIG_PROFILES",
    "initial_state",
    "mig_profiles",
    "gpu_uuid",
    "mig_uuid",
    "check_gpu_model",
    "check_mig_profiles",
    "with_xid",
    "with_ecc_error",
    "with_lost",
    "with_fail_allocate",
    "with_fail_pre_start",
    "with_gpu_added",
    "with_gpu_removed",
]

State = dict[str, Any]

#: The mock's GPU models: key -> (the name NVML gives, memory in MiB as NVML reports it). What else NVML answers
#: for a model (PCI device ID, architecture, compute capability, SMs) is the mock library's (``mock_nvml.c``).
GPU_MODELS = {
    "a100-40gb": ("NVIDIA A100-SXM4-40GB", 40960),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB", 81920),
    "h100-80gb": ("NVIDIA H100 80GB HBM3", 81559),
    "h200-141gb": ("NVIDIA H200", 143771),
    "b200": ("NVIDIA B200", 183359),
}
DEFAULT_GPU_MODEL = "a100-40gb"
#: MIG geometry, the same on every model: (compute slices, memory slices, instances that fit on one GPU, suffix) of
#: each GPU instance profile. A GPU has 7 compute and 8 memory slices.
_MIG_GEOMETRY = (
    (1, 1, 7, ""),
    (1, 1, 1, "+me"),
    (1, 2, 4, ""),
    (2, 2, 3, ""),
    (3, 4, 2, ""),
    (4, 4, 1, ""),
    (7, 8, 1, ""),
)


def mig_profiles(model: str = DEFAULT_GPU_MODEL) -> dict[str, tuple[int, int, int]]:
    """A model's MIG profiles, named as go-nvlib names them from the GPU's memory (``1g.5gb`` on an A100 40 GB,
    ``1g.10gb`` on an H100): profile -> (compute slices, memory slices, instances that fit on one GPU)."""
    gib = -(-GPU_MODELS[model][1] // 1024)
    return {f"{c}g.{(m * gib * 2 + 8) // 16}gb{suffix}": (c, m, n) for c, m, n, suffix in _MIG_GEOMETRY}


#: The MIG profiles of the default model (an A100 with 40 GiB).
MIG_PROFILES = mig_profiles()


def gpu_uuid(index: int) -> str:
    """A stable, unique, GPU-shaped UUID for mock GPU ``index``."""
    return f"GPU-{index:08x}-d0d0-4e11-8a5e-{index:012x}"


def mig_uuid(gpu: int, position: int) -> str:
    """A stable, unique UUID for MIG device ``position`` of mock GPU ``gpu`` (it does not contain the GPU's)."""
    return f"MIG-{gpu:08x}-{position:04x}-4d16-9a3c-{gpu << 8 | position:012x}"


def check_gpu_model(model: str) -> None:
    if model not in GPU_MODELS:
        raise ValueError(f"unknown GPU model {model!r}; the mock has {', '.join(GPU_MODELS)}")


def check_mig_profiles(profiles: Sequence[str], model: str = DEFAULT_GPU_MODEL) -> None:
    """Raise ``ValueError`` naming the problem when ``profiles`` do not fit on one mock GPU of ``model`` together."""
    check_gpu_model(model)
    known = mig_profiles(model)
    unknown = [p for p in profiles if p not in known]
    if unknown:
        raise ValueError(f"unknown MIG profile(s) {unknown}; the mock GPUs ({model}) have {', '.join(known)}")
    slices = sum(known[p][0] for p in profiles)
    memory = sum(known[p][1] for p in profiles)
    too_many = [p for p in set(profiles) if profiles.count(p) > known[p][2]]
    if slices > 7 or memory > 8 or too_many:
        raise ValueError(
            f"MIG devices {list(profiles)} do not fit on one GPU: {slices} of 7 compute slices, {memory} of 8 memory "
            f"slices" + (f", more {too_many} than fit" if too_many else "")
        )


def _gpu(index: int, numa_node: int | None, model: str = DEFAULT_GPU_MODEL) -> dict[str, Any]:
    name, memory = GPU_MODELS[model]
    return {
        "uuid": gpu_uuid(index),
        "model": model,
        "name": name,
        "memory_mib": memory,
        "numa_node": numa_node,
        "minor": index,
        "lost": False,
        "fail_allocate": False,
    }


def initial_state(gpus: int, numa_nodes: int, mig: Sequence[str] = (), model: str = DEFAULT_GPU_MODEL) -> State:
    """``gpus`` healthy GPUs of ``model`` (:data:`GPU_MODELS`) spread in contiguous blocks over ``numa_nodes`` (0 = no
    topology); with ``mig`` (profiles such as ``1g.5gb``) each GPU is MIG-enabled with those MIG devices."""
    if gpus < 0 or numa_nodes < 0:
        raise ValueError("gpus and numa_nodes must be >= 0")
    check_mig_profiles(mig, model)
    out = []
    for i in range(gpus):
        numa = (i * numa_nodes) // gpus if numa_nodes else None
        gpu = _gpu(i, numa, model)
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


def with_ecc_error(state: State, uuid: str) -> State:
    """Append an uncorrectable (double-bit) ECC error: the mock NVML counts it, and delivers it once as a
    DoubleBitEcc event followed by the Xid 48 the driver logs for it (append-only, like :func:`with_xid`)."""
    new = copy.deepcopy(state)
    _find(new, uuid)
    new.setdefault("events", []).append({"uuid": uuid, "ecc": "uncorrected"})
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
    model = str(new["gpus"][0].get("model", DEFAULT_GPU_MODEL)) if new["gpus"] else DEFAULT_GPU_MODEL
    gpu = _gpu(minor, numa_node, model)  # a GPU like the node's others
    new["gpus"].append(gpu)
    return new, str(gpu["uuid"])


def with_gpu_removed(state: State, uuid: str) -> State:
    new = copy.deepcopy(state)
    _find(new, uuid)
    new["gpus"] = [g for g in new["gpus"] if g["uuid"] != uuid]
    return new
