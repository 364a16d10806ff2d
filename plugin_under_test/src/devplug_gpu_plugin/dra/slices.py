"""The node's ResourceSlice, kept equal to the GPU inventory (the Go ``resourceslice`` controller's job).

One pool named after the node, one slice in it (``nodeName`` set, owned by the Node), one device per GPU:
``gpu-<minor>`` with attributes ``uuid``, ``model``, ``minor`` and capacity ``memory``. A sync lists the
driver's slices on this node, deletes those of other pools and all but the newest of its pool, then
creates the slice (generation one above any seen) or updates it in place (same generation: one write,
as the Go controller does), or leaves it alone when it already matches. Syncs run in one thread: when
the GPU set changes, when a watch on the slices reports anything (someone deleted or changed one, e.g.
a restarting kubelet wiping the node's slices), and again with backoff after an API failure. Health
does not change a slice (it travels on the health stream), and the driver never deletes its slices on
exit: a restarted driver finds and keeps them, and the kubelet wipes them once the driver stays away.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from ..devices import Gpu
from .kubeapi import KubeApi, KubeApiError

__all__ = ["WATCH_TIMEOUT_S", "SlicePublisher", "device_name", "slice_devices"]

log = logging.getLogger("devplug_gpu_plugin.dra.slices")

JSON = dict[str, Any]
#: How long one watch request lasts before it is made again (the server ends it).
WATCH_TIMEOUT_S = 300
_BACKOFF_START_S, _BACKOFF_MAX_S = 0.5, 30.0
#: Spec fields our slice never has (it is on its node, with no counters); an update clears them.
_PLACEMENT = ("allNodes", "nodeSelector", "perDeviceNodeSelection", "sharedCounters")
_SUFFIXES: dict[str, int | Fraction] = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+))?([KMGTPE]i|[numkMGTPE])?")


def device_name(minor: int) -> str:
    return f"gpu-{minor}"


def _quantity(raw: Any) -> Fraction | str:
    """A resource quantity's value, so "40960Mi" equals the server's canonical "40Gi" (text if unparsable)."""
    text = str(raw)
    m = _QUANTITY.fullmatch(text)
    if m is None:
        return text
    exponent = int(m.group(2) or 0)
    return Fraction(m.group(1)) * _SUFFIXES[m.group(3) or ""] * Fraction(10) ** exponent


def slice_devices(gpus: Sequence[Gpu]) -> list[JSON]:
    """The slice's devices, by minor number."""
    return [
        {
            "name": device_name(g.info.minor),
            "attributes": {
                "uuid": {"string": g.uuid},
                "model": {"string": g.info.name},
                "minor": {"int": g.info.minor},
            },
            "capacity": {"memory": {"value": f"{g.info.memory_mib}Mi"}},
        }
        for g in sorted(gpus, key=lambda g: g.info.sort_key())
    ]


def _comparable(devices: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """What we publish of each device, quantities by value (fields others may add are not ours to judge)."""
    out = []
    for d in devices:
        capacity = {k: _quantity((v or {}).get("value")) for k, v in (d.get("capacity") or {}).items()}
        out.append((d.get("name"), d.get("attributes") or {}, capacity))
    return out


class SlicePublisher:
    """Publishes ``devices()`` as the node's slice of ``driver`` and keeps it so until :meth:`stop`."""

    def __init__(self, api: KubeApi, driver: str, node: str, devices: Callable[[], list[JSON]]) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self._devices = devices
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._lock = threading.Lock()
        #: A sync is due whatever the inventory says (watch event, failed sync, start).
        self._forced = True
        #: The devices the last successful sync left published.
        self._published: list[JSON] | None = None
        self._threads: list[threading.Thread] = []

    # ---- triggers ------------------------------------------------------------------------------
    def start(self) -> None:
        for target, name in ((self._sync_loop, "slices"), (self._watch_loop, "slices-watch")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def devices_changed(self) -> None:
        """The inventory changed (maybe only health): sync if the published devices differ."""
        self._kick.set()

    def resync(self) -> None:
        """Someone touched the slices: look at them again."""
        with self._lock:
            self._forced = True
        self._kick.set()

    def stop(self) -> None:
        """Stop syncing and watching; the slice stays (see the module docstring)."""
        self._stop.set()
        self._kick.set()
        self.api.close()
        for t in self._threads:
            t.join(1.0)

    # ---- one sync ------------------------------------------------------------------------------
    def _desired_spec(self, devices: list[JSON], generation: int) -> JSON:
        return {
            "driver": self.driver,
            "nodeName": self.node,
            "pool": {"name": self.node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        }

    def _matches(self, spec: Mapping[str, Any], devices: list[JSON]) -> bool:
        pool = spec.get("pool") or {}
        return (
            spec.get("driver") == self.driver
            and spec.get("nodeName") == self.node
            and pool.get("name") == self.node
            and int(pool.get("resourceSliceCount") or 0) == 1
            and not any(spec.get(k) for k in _PLACEMENT)
            and _comparable(spec.get("devices") or []) == _comparable(devices)
        )

    def _delete(self, obj: Mapping[str, Any], why: str) -> None:
        meta = obj.get("metadata") or {}
        self.api.delete_slice(str(meta.get("name")), str(meta.get("uid")), str(meta.get("resourceVersion")))
        log.info("ResourceSlice %s deleted (%s)", meta.get("name"), why)

    def sync(self) -> str:
        """One reconciliation; returns what it did. Raises :class:`KubeApiError`."""
        devices = self._devices()
        mine = [
            s
            for s in self.api.list_slices(self.driver, self.node)
            if (s.get("spec") or {}).get("driver") == self.driver and (s.get("spec") or {}).get("nodeName") == self.node
        ]
        pooled = [s for s in mine if ((s.get("spec") or {}).get("pool") or {}).get("name") == self.node]
        for s in mine:
            if s not in pooled:
                pool = ((s.get("spec") or {}).get("pool") or {}).get("name")
                self._delete(s, f"pool {pool!r} is not published by this driver")

        def generation(s: Mapping[str, Any]) -> int:
            return int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)

        pooled.sort(key=lambda s: (-generation(s), (s.get("metadata") or {}).get("name", "")))
        top = max((generation(s) for s in pooled), default=0)
        for s in pooled[1:]:
            self._delete(s, "a second slice of the pool")
        names = ", ".join(d["name"] for d in devices) or "none"
        if not pooled:
            body = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "generateName": f"{self.node}-{self.driver}-",
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Node",
                            "name": self.node,
                            "uid": self.api.get_node_uid(self.node),
                            "controller": True,
                        }
                    ],
                },
                "spec": self._desired_spec(devices, top + 1),
            }
            created = self.api.create_slice(body)
            done = (
                f"ResourceSlice {created.get('metadata', {}).get('name')} created for pool {self.node} "
                f"({len(devices)} devices: {names})"
            )
        else:
            current = pooled[0]
            meta = current.get("metadata") or {}
            if self._matches(current.get("spec") or {}, devices):
                done = f"ResourceSlice {meta.get('name')} unchanged"
            else:
                self.api.update_slice(current, self._desired_spec(devices, generation(current)))
                done = f"ResourceSlice {meta.get('name')} updated ({len(devices)} devices: {names})"
        self._published = devices
        return done

    # ---- threads -------------------------------------------------------------------------------
    def _sync_loop(self) -> None:
        backoff = 0.0
        last_error = ""
        while not self._stop.is_set():
            self._kick.wait(backoff or None)
            self._kick.clear()
            if self._stop.is_set():
                return
            with self._lock:
                forced, self._forced = self._forced, False
            if not forced and backoff == 0.0 and self._devices() == self._published:
                continue
            try:
                done = self.sync()
            except KubeApiError as exc:
                with self._lock:
                    self._forced = True
                backoff = min(_BACKOFF_MAX_S, backoff * 2 or _BACKOFF_START_S)
                if str(exc) != last_error:
                    log.error("publishing ResourceSlices failed (retrying, up to every %.0fs): %s", _BACKOFF_MAX_S, exc)
                    last_error = str(exc)
                continue
            backoff, last_error = 0.0, ""
            (log.debug if done.endswith("unchanged") else log.info)("%s", done)

    def _watch_loop(self) -> None:
        delay = 0.0
        while not self._stop.is_set():
            try:
                for event in self.api.watch_slices(self.driver, self.node, WATCH_TIMEOUT_S):
                    if self._stop.is_set():
                        return
                    delay = 0.0
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: watch again from now
                        log.debug("ResourceSlice watch: %s", (event.get("object") or {}).get("message"))
                        break
                    self.resync()
            except KubeApiError as exc:
                if self._stop.is_set():
                    return
                log.debug("ResourceSlice watch ended: %s", exc)  # the sync loop reports the API's failures
                delay = min(_BACKOFF_MAX_S, delay * 2 or _BACKOFF_START_S)
            self._stop.wait(delay)
