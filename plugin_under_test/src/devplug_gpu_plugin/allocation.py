"""Preferred allocation and Allocate responses (device-list strategies, CDI spec, dev nodes).

Pure logic over :class:`~devplug_gpu_plugin.devices.Snapshot`; the gRPC servicer only maps
:class:`AllocationError` to a status code.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .api.deviceplugin import v1beta1_pb2 as pb
from .devices import Gpu, GpuInfo, Snapshot

log = logging.getLogger("devplug_gpu_plugin.allocation")

ENVVAR = "envvar"
VOLUME_MOUNTS = "volume-mounts"
CDI_ANNOTATIONS = "cdi-annotations"
CDI_CRI = "cdi-cri"
STRATEGIES = (ENVVAR, VOLUME_MOUNTS, CDI_ANNOTATIONS, CDI_CRI)

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CDI_VERSION = "0.6.0"
CONTROL_NODES = ("nvidiactl", "nvidia-uvm")
#: Separates a GPU's UUID from its replica number in a shared device's ID (NVIDIA's time-slicing form).
REPLICA_SEP = "::"


class AllocationError(Exception):
    """A refused request; ``code`` is ``"invalid_argument"`` (caller's fault) or ``"internal"``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---- shared GPUs (replicas) ------------------------------------------------------------------
def replica_ids(uuid: str, replicas: int) -> list[str]:
    """The device IDs advertised for one GPU: its UUID, or ``<uuid>::<n>`` for each of ``replicas`` > 1
    (time-slicing: several containers share the GPU, each ID handing out the same ``/dev`` node)."""
    return [uuid] if replicas <= 1 else [f"{uuid}{REPLICA_SEP}{n}" for n in range(replicas)]


def gpu_of(device_id: str) -> str:
    """The GPU UUID a device ID stands for."""
    return device_id.split(REPLICA_SEP, 1)[0]


# ---- preferred allocation --------------------------------------------------------------------
def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    gpus: Mapping[str, GpuInfo],
) -> list[str]:
    """Pick exactly ``size`` IDs from ``available``: all of ``must_include``, NUMA-packed.

    Remaining devices come from the NUMA node of the must-include devices, else from the node
    that can hold the whole rest with the fewest leftovers, else from the fullest nodes first;
    devices without NUMA come last. Within a node: by minor number, then UUID.
    """

    def key(uuid: str) -> tuple[int, int, str]:
        info = gpus.get(uuid)
        return (0, info.minor, uuid) if info is not None else (1, 0, uuid)

    def node(uuid: str) -> int | None:
        info = gpus.get(uuid)
        return info.numa_node if info is not None else None

    if size <= 0:
        return []
    avail = sorted(dict.fromkeys(available), key=key)
    must = sorted(dict.fromkeys(u for u in must_include), key=key)
    if len(must) >= size:
        return must[:size]
    chosen = list(must)
    need = size - len(chosen)
    groups: dict[int | None, list[str]] = {}
    for uuid in avail:
        if uuid not in chosen:
            groups.setdefault(node(uuid), []).append(uuid)

    must_nodes = [node(u) for u in must if node(u) is not None]
    preferred: int | None = max(set(must_nodes), key=lambda n: (must_nodes.count(n), -(n or 0))) if must_nodes else None
    while need > 0 and groups:
        numbered = [n for n in groups if n is not None]
        pick: int | None
        if preferred is not None and preferred in groups:
            pick = preferred
        elif numbered:
            fits = [n for n in numbered if len(groups[n]) >= need]
            if fits:
                pick = min(fits, key=lambda n: (len(groups[n]) - need, n))
            else:
                pick = max(numbered, key=lambda n: (len(groups[n]), -n))
        else:
            pick = None
        preferred = None
        taken = groups.pop(pick)[:need]
        chosen.extend(taken)
        need -= len(taken)
    return chosen


# ---- Allocate --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AllocationConfig:
    resource_name: str
    strategies: tuple[str, ...] = (ENVVAR,)
    dev_root: str = "/dev"
    driver_lib_dir: str | None = None
    cdi_spec_dir: str = "/var/run/cdi"
    #: Device IDs advertised per GPU (see :func:`replica_ids`).
    replicas: int = 1

    @property
    def uses_cdi(self) -> bool:
        return CDI_ANNOTATIONS in self.strategies or CDI_CRI in self.strategies

    @property
    def uses_runtime_edits(self) -> bool:
        """True when the response itself must carry device nodes and mounts (non-CDI strategy)."""
        return ENVVAR in self.strategies or VOLUME_MOUNTS in self.strategies

    @property
    def cdi_kind(self) -> str:
        return self.resource_name

    @property
    def cdi_annotation_key(self) -> str:
        return "cdi.k8s.io/devplug-gpu_" + self.resource_name.replace("/", "-")

    @property
    def cdi_spec_path(self) -> str:
        return os.path.join(self.cdi_spec_dir, "devplug-" + self.resource_name.replace("/", "-") + ".json")


def device_nodes(minors: Sequence[int]) -> list[str]:
    """The /dev entries (names relative to the dev root) a container needs for these GPUs."""
    return list(CONTROL_NODES) + [f"nvidia{m}" for m in minors]


def validate_request(ids: Sequence[str], snapshot: Snapshot, resource_name: str, replicas: int = 1) -> list[Gpu]:
    """Unknown or unhealthy IDs are the caller's error: INVALID_ARGUMENT naming the ID. One GPU per
    ID, in request order (two replicas of a GPU: that GPU twice)."""
    if not ids:
        raise AllocationError("invalid_argument", f"empty device list for {resource_name}")
    by_uuid = snapshot.by_uuid()
    gpus: list[Gpu] = []
    for uuid in ids:
        gpu = by_uuid.get(gpu_of(uuid))
        if gpu is None or uuid not in replica_ids(gpu.uuid, replicas):
            raise AllocationError("invalid_argument", f"unknown device {uuid} for resource {resource_name}")
        if not gpu.healthy:
            raise AllocationError("invalid_argument", f"device {uuid} of {resource_name} is Unhealthy ({gpu.reason()})")
        gpus.append(gpu)
    return gpus


def container_response(
    ids: Sequence[str],
    snapshot: Snapshot,
    config: AllocationConfig,
    fault: Callable[[str], str | None] | None = None,
) -> pb.ContainerAllocateResponse:
    """Build one container's response for every configured strategy."""
    gpus = validate_request(ids, snapshot, config.resource_name, config.replicas)
    if fault is not None:
        for gpu in gpus:
            why = fault(gpu.uuid)
            if why:
                raise AllocationError("internal", f"allocating GPU {gpu.uuid} failed: {why}")
    uuids = list(dict.fromkeys(g.uuid for g in gpus))
    resp = pb.ContainerAllocateResponse()
    if ENVVAR in config.strategies:
        resp.envs[VISIBLE_DEVICES] = ",".join(uuids)
    if VOLUME_MOUNTS in config.strategies:
        # NVIDIA's convention: the runtime hook reads the IDs from the mount points.
        resp.envs[VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT
        for uuid in uuids:
            resp.mounts.add(container_path=f"{VOLUME_MOUNTS_ROOT}/{uuid}", host_path="/dev/null")
    if config.uses_runtime_edits:
        # One DeviceSpec per requested ID: replicas of one GPU repeat its node; the kubelet de-duplicates.
        for name in device_nodes([g.info.minor for g in gpus]):
            resp.devices.add(
                container_path=f"/dev/{name}", host_path=os.path.join(config.dev_root, name), permissions="rw"
            )
        if config.driver_lib_dir:
            resp.mounts.add(container_path=config.driver_lib_dir, host_path=config.driver_lib_dir, read_only=True)
    qualified = [f"{config.cdi_kind}={u}" for u in uuids]
    if CDI_ANNOTATIONS in config.strategies:
        resp.annotations[config.cdi_annotation_key] = ",".join(qualified)
    if CDI_CRI in config.strategies:
        for name in qualified:
            resp.cdi_devices.add(name=name)
    return resp


# ---- CDI spec --------------------------------------------------------------------------------
def cdi_spec(config: AllocationConfig, gpus: Sequence[Gpu]) -> dict[str, Any]:
    """The CDI spec for the current GPUs: one device per UUID, control nodes and libs shared."""

    def node(name: str) -> dict[str, str]:
        return {"path": f"/dev/{name}", "hostPath": os.path.join(config.dev_root, name), "permissions": "rw"}

    common: dict[str, Any] = {"deviceNodes": [node(n) for n in CONTROL_NODES]}
    if config.driver_lib_dir:
        common["mounts"] = [
            {
                "hostPath": config.driver_lib_dir,
                "containerPath": config.driver_lib_dir,
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": config.cdi_kind,
        "devices": [
            {"name": g.uuid, "containerEdits": {"deviceNodes": [node(f"nvidia{g.info.minor}")]}}
            for g in sorted(gpus, key=lambda g: g.info.sort_key())
        ],
        "containerEdits": common,
    }


def atomic_write(path: str, data: bytes, mode: int = 0o644) -> None:
    """Temp file in the same directory, fsync, rename: readers never see a partial file."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_cdi_spec(config: AllocationConfig, gpus: Sequence[Gpu]) -> str:
    """Write the spec where a CDI-enabled runtime looks for it; returns the path."""
    path = config.cdi_spec_path
    atomic_write(path, (json.dumps(cdi_spec(config, gpus), indent=2) + "\n").encode())
    return path


# ---- fake device nodes (mock mode) -----------------------------------------------------------
def _create_node(path: str, rdev: int) -> None:
    """Create ``path`` without ever following a symlink there: ``mknod`` refuses an existing
    name, and the fallback opens with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and sets the mode on
    the descriptor it made (a chmod by name could land on a symlink's target)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, rdev)
        return
    except PermissionError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o666)
    try:
        os.fchmod(fd, 0o666)
    finally:
        os.close(fd)


def ensure_dev_nodes(dev_root: str, minors: Sequence[int]) -> list[str]:
    """Create missing /dev/nvidia* stand-ins so DeviceSpecs resolve on a node with no GPU.

    Each is a character device with /dev/null's numbers when we may ``mknod`` (privileged
    container: runtimes insist on a device node), else an empty regular file. Existing
    entries are never touched. Returns the paths created.
    """
    os.makedirs(dev_root, exist_ok=True)
    created: list[str] = []
    try:
        rdev = os.stat("/dev/null").st_rdev
    except OSError:
        rdev = os.makedev(1, 3)
    for name in device_nodes(minors):
        path = os.path.join(dev_root, name)
        if os.path.lexists(path):
            continue
        try:
            _create_node(path, rdev)
        except FileExistsError:
            continue  # made meanwhile (by anyone, perhaps as a symlink): not ours to touch
        created.append(path)
    if created:
        log.info("created device nodes: %s", ", ".join(created))
    return created
