"""Which mock GPU backs each device a plugin advertises.

A plugin's device IDs are its own: a GPU's UUID (the included plugin, NVIDIA's default), ``<uuid>::<n>``
replicas of one GPU (time-slicing, MPS), a MIG device's UUID, a device-node name (``nvidia0``), or an
opaque name (an index, a serial). A fault of a physical GPU must reach every device the plugin backs with
it, so the harness maps device IDs to mock GPUs rather than assuming one device per GPU:

* an ID that embeds a GPU's UUID, or one of its MIG devices' UUIDs, is backed by that GPU; one that is its
  device node (``nvidia<minor>``, ``/dev/nvidia<minor>``) too;
* any other ID is backed by the GPU its ``Allocate`` response, for that device alone, gives the container:
  a GPU or MIG UUID in the env (``NVIDIA_VISIBLE_DEVICES``), annotations, mount paths or CDI names, a
  ``/dev/nvidia<minor>`` device node (CDI names resolved to their specs' device nodes), or the index forms
  of ``NVIDIA_VISIBLE_DEVICES`` (``0``, MIG ``0:1``), which NVIDIA's runtime reads as the NVML index;
* an ID that neither names nor reaches exactly one mock GPU has no known backing: the checks needing one
  skip, saying why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .backends.base import ContainerView
from .errors import UnknownBackingError

__all__ = ["backing_gpu", "backed_devices", "injected_gpus", "Injections"]

_DEVICE_NODE = re.compile(r"(?:/dev/)?nvidia(\d+)")
_VISIBLE_INDEX = re.compile(r"(\d+)(?::\d+)?")
#: The env var NVIDIA's container runtime reads: GPU or MIG UUIDs, or NVML indices (``0``, MIG ``0:1``).
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

#: What ``Allocate`` gives a container for each of the given device IDs alone (a backend's ``device_injections``
#: for the plugin under test); raises when the backend cannot ask.
Injections = Callable[[list[str]], Mapping[str, ContainerView]]


def _names(gpu: Mapping[str, Any]) -> list[str]:
    """The UUIDs that name ``gpu``: its own and its MIG devices'."""
    return [str(gpu["uuid"]), *(str(m["uuid"]) for m in gpu.get("mig_devices") or [])]


def _named_in(text: str, gpus: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(g["uuid"]) for g in gpus if any(n in text for n in _names(g))]


def _by_device_node(path: str, gpus: Sequence[Mapping[str, Any]]) -> list[str]:
    node = _DEVICE_NODE.fullmatch(path)
    if node is None:
        return []
    return [str(g["uuid"]) for g in gpus if g.get("minor") == int(node.group(1))]


def _named_gpu(device_id: str, gpus: Sequence[Mapping[str, Any]]) -> str | None:
    """The GPU ``device_id`` names, ``None`` when it names none; raises when it names several."""
    named = _named_in(device_id, gpus) or _by_device_node(device_id, gpus)
    if len(named) > 1:
        raise UnknownBackingError(f"device ID {device_id!r} names {len(named)} mock GPUs ({named}), not one")
    return named[0] if named else None


def injected_gpus(view: ContainerView, gpus: Sequence[Mapping[str, Any]]) -> list[str]:
    """The mock GPUs (UUIDs, in state order) a container set up as ``view`` says reaches; see the module doc."""
    found: set[str] = set()
    texts = [
        *view.envs.values(),
        *view.annotations.values(),
        *view.cdi_devices,
        *(p for m in view.mounts for p in (m.host_path, m.container_path)),
    ]
    for text in texts:
        found.update(_named_in(text, gpus))
    for d in view.devices:
        found.update(_by_device_node(d.host_path, gpus))
        found.update(_by_device_node(d.container_path, gpus))
    for token in view.envs.get(VISIBLE_DEVICES, "").split(","):
        index = _VISIBLE_INDEX.fullmatch(token.strip())
        if index is not None and int(index.group(1)) < len(gpus):
            found.add(str(gpus[int(index.group(1))]["uuid"]))
    return [str(g["uuid"]) for g in gpus if g["uuid"] in found]


def _describe(view: ContainerView) -> str:
    parts = [
        f"env {dict(view.envs)}" if view.envs else "",
        f"devices {[d.container_path for d in view.devices]}" if view.devices else "",
    ]
    parts += [f"CDI devices {list(view.cdi_devices)}" if view.cdi_devices else ""]
    parts += [f"mounts {[m.container_path for m in view.mounts]}" if view.mounts else ""]
    return "; ".join(p for p in parts if p) or "nothing"


def backed_devices(
    device_ids: Iterable[str], gpus: Sequence[Mapping[str, Any]], injections: Injections | None = None
) -> dict[str, list[str]]:
    """Mock GPU UUID -> the given device IDs it backs (sorted), for every GPU (empty list: backs none).

    IDs that name no GPU are looked up in ``injections`` (one call for all of them); raises
    :class:`UnknownBackingError` for the first ID no single GPU backs, saying why.
    """
    out: dict[str, list[str]] = {str(g["uuid"]): [] for g in gpus}
    unnamed: list[str] = []
    for device_id in device_ids:
        gpu = _named_gpu(device_id, gpus)
        if gpu is None:
            unnamed.append(device_id)
        else:
            out[gpu].append(device_id)
    if unnamed:
        for device_id, gpu in _by_injection(unnamed, gpus, injections).items():
            out[gpu].append(device_id)
    return {uuid: sorted(ids) for uuid, ids in out.items()}


def _by_injection(
    device_ids: list[str], gpus: Sequence[Mapping[str, Any]], injections: Injections | None
) -> dict[str, str]:
    known = [str(g["uuid"]) for g in gpus]
    first = device_ids[0]
    unnamed = f"device ID {first!r} names no mock GPU (no GPU or MIG UUID, no nvidia<minor>)"
    if injections is None:
        raise UnknownBackingError(f"{unnamed}; mock GPUs: {known}")
    try:
        views = injections(device_ids)
    except Exception as exc:  # noqa: BLE001 - any reason the backend cannot ask is the reason to skip
        raise UnknownBackingError(f"{unnamed}, and what Allocate injects for it is unknown: {exc}") from None
    out: dict[str, str] = {}
    for device_id in device_ids:
        view = views.get(device_id)
        reached = [] if view is None else injected_gpus(view, gpus)
        if len(reached) != 1:
            what = "no answer" if view is None else _describe(view)
            raise UnknownBackingError(
                f"device ID {device_id!r} names no mock GPU (no GPU or MIG UUID, no nvidia<minor>), and Allocate for "
                f"it alone injects {what}, which reaches {len(reached)} mock GPUs {reached}, not one; "
                f"mock GPUs: {known}"
            )
        out[device_id] = reached[0]
    return out


def backing_gpu(device_id: str, gpus: Sequence[Mapping[str, Any]], injections: Injections | None = None) -> str:
    """The UUID of the mock GPU (entries of the mock state's ``gpus``) that backs ``device_id``."""
    gpu = _named_gpu(device_id, gpus)
    return gpu if gpu is not None else _by_injection([device_id], gpus, injections)[device_id]
