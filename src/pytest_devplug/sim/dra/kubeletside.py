"""One embedded kubelet's DRA side, wired together: what ``SimNode`` calls at its few DRA hook points.

Upstream spreads this over the plugin manager (``pluginmanager``), the container manager's DRA manager
(``cm/dra``) and the pod workers' ``SyncPod`` / ``SyncTerminatedPod``. Here :class:`NodeDRA` owns, for one
kubelet process lifetime (``start`` .. ``stop``, again after a restart):

- the plugin watcher on the node's ``plugins_registry/`` and the DRA plugin manager behind it (slices of the
  node wiped through the API at start, a driver's slices wiped ``wiping_delay`` after it went away);
- the DRA manager (``dra_manager_state``) reading claims from the API server;
- the pod side: a pod with ``spec.resourceClaims`` starts its containers only once its claims are prepared;
  a failed prepare is retried after the pod worker's back-off (10 s) with a ``FailedPrepareDynamicResources``
  event each time, for as long as the pod is active; claims of pods that were deleted or finished (also while
  the kubelet was down) are unprepared at once when the kubelet learns of it, and by the reconcile loop
  (60 s) after a failure or a restart, once the kubelet's pod sources are ready;
- what the runtime needs (the CDI device IDs of a container) and the pod status (``allocatedResourcesStatus``
  from the health stream, whose changes re-publish the node's pod statuses).

Every NodePrepareResources / NodeUnprepareResources the kubelet made is kept in :attr:`NodeDRA.calls` (tests and
evidence read it: "no prepare for a pod deleted while the kubelet was down" is an absence there).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_devplug.kubeletmodel.releases import KubeVersion
from pytest_devplug.kubeletmodel import dracheckpoint as cp
from pytest_devplug.sim.dra.health import HealthInfoCache
from pytest_devplug.kubeletmodel.claims import extended_resource_claim
from pytest_devplug.sim.dra.manager import ClaimSource, DRAManager
from pytest_devplug.errors import DRAPluginError, DRAPrepareError
from pytest_devplug.kubeletmodel.periods import DRA_RECONCILE_PERIOD_S, DRA_WIPING_DELAY_S, POD_BACKOFF_PERIOD_S
from pytest_devplug.sim.dra.plugins import DRAPluginManager, ResourceSliceWiper
from pytest_devplug.procs.launcher import path_in_node
from pytest_devplug.sim.pluginwatcher import PluginHandler

__all__ = [
    "DRACall",
    "DRATimings",
    "KubeletApi",
    "NodeDRA",
    "has_claims",
]


Obj = Mapping[str, Any]
EventSink = Callable[[Obj, str, str, str], None]


class KubeletApi(ClaimSource, ResourceSliceWiper, Protocol):
    """What the kubelet's DRA side asks of the API server (:class:`~pytest_devplug.sim.dra.apiseams.KubeletDRAApi`)."""


@dataclass
class DRATimings:
    """The kubelet's DRA periods in seconds; tests shorten them as ``--devplug-grace-period`` shortens the device
    manager's. New values apply from the next kubelet start, and to the running one at its next wait."""

    wiping_delay: float = DRA_WIPING_DELAY_S
    retry_period: float = POD_BACKOFF_PERIOD_S
    reconcile_period: float = DRA_RECONCILE_PERIOD_S


@dataclass(frozen=True)
class DRACall:
    """One call the kubelet made to a driver: ``method`` NodePrepareResources / NodeUnprepareResources, the claim
    UIDs it carried, and the call's error ("" when it succeeded as a whole)."""

    driver: str
    method: str
    claim_uids: tuple[str, ...]
    error: str
    at: float = field(default_factory=time.time)


def has_claims(pod: Obj) -> bool:
    """Whether the pod uses DRA: claims of its own, or the scheduler's claim for its extended resources."""
    return bool((pod.get("spec") or {}).get("resourceClaims")) or extended_resource_claim(pod) is not None


@dataclass
class _PodWork:
    """A pod whose claims must be prepared before its containers start (``start``: ``None`` once it was called)."""

    pod: dict[str, Any]
    start: Callable[[], None] | None
    due: float = 0.0
    in_flight: bool = False
    attempts: int = 0
    last_error: str = ""


class _RefusingHandler:
    """The DRA plugin manager behind the watcher; ``refusal()`` names a reason to refuse a registration with (a
    registration that fails validation, as a kubelet refuses a plugin it cannot use), or ``None``."""

    def __init__(self, plugins: DRAPluginManager, refusal: Callable[[], str | None]) -> None:
        self.plugins = plugins
        self.refusal = refusal

    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        reason = self.refusal()
        if reason is not None:
            raise DRAPluginError(reason)
        self.plugins.validate_plugin(name, endpoint, versions)

    def register_plugin(self, name: str, endpoint: str, versions: Sequence[str], timeout: float | None) -> None:
        self.plugins.register_plugin(name, endpoint, versions, timeout)

    def deregister_plugin(self, name: str, endpoint: str) -> None:
        self.plugins.deregister_plugin(name, endpoint)


class NodeDRA:
    """The DRA side of the kubelet of node ``node_name`` whose directories are under ``node_dir``.

    ``api`` reads claims and wipes slices; ``endpoint_paths`` maps a path a driver names in its own mount
    namespace (``/var/lib/kubelet/plugins/...``) to the node's directory; ``event_sink`` records pod events;
    ``on_change`` tells the node that pod statuses may have changed (device health).
    """

    def __init__(
        self,
        node_name: str,
        node_dir: Path,
        api: KubeletApi,
        *,
        endpoint_paths: Mapping[str, Path],
        event_sink: EventSink,
        on_change: Callable[[], None],
        timings: DRATimings | None = None,
        logger: logging.Logger | None = None,
        kube: KubeVersion | None = None,
    ) -> None:
        self.node_name = node_name
        #: The release this kubelet's DRA side behaves as (its gates: health, messages).
        self.kube = kube or KubeVersion.of()
        self.node_dir = Path(node_dir)
        self.api = api
        self.timings = timings or DRATimings()
        self._endpoint_paths = dict(endpoint_paths)
        self._event = event_sink
        self._on_change = on_change
        self._log = logger or logging.getLogger(__name__)
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        #: Every call the kubelet made to a driver, oldest first (kept across restarts: the node's history).
        self.calls: list[DRACall] = []
        self._plugins: DRAPluginManager | None = None
        self._manager: DRAManager | None = None
        self._loop: threading.Thread | None = None
        self._work: dict[str, _PodWork] = {}
        self._active: Callable[[], set[str]] | None = None
        self._reconcile_due = float("inf")
        #: Registrations still to refuse, and why (kept across restarts until used).
        self._refusals: list[str] = []

    # --- paths ---------------------------------------------------------------------------------

    @property
    def registry_dir(self) -> Path:
        return self.node_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.node_dir / "plugins"

    @property
    def checkpoint_path(self) -> Path:
        return self.node_dir / cp.CHECKPOINT_NAME

    def host_path(self, endpoint: str) -> Path:
        """The socket the kubelet dials for an endpoint a driver named (its namespace's path, or a host path)."""
        return path_in_node(endpoint, self._endpoint_paths)

    # --- lifecycle -----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return not self._stopped.is_set()

    def start(self) -> PluginHandler:
        """A kubelet start: the DRA manager reads ``dra_manager_state`` (raises ``DRAManagerError`` when it cannot, and
        the kubelet does not start, as upstream's) and the node's slices are wiped. Returns the ``DRAPlugin`` handler
        for the kubelet's plugin watcher."""
        health = HealthInfoCache()
        plugins = DRAPluginManager(
            self.node_name,
            wiper=self.api,
            wiping_delay=self.timings.wiping_delay,
            health_cache=health if self.kube.gate("ResourceHealthStatus") else None,
            on_health_change=lambda _driver, _devices: self._on_change(),
            path_of_endpoint=self.host_path,
            on_call=self._record_call,
            logger=self._log,
            kube=self.kube,
        )
        try:
            manager = DRAManager(
                self.node_dir,
                plugins,
                self.api,
                health_cache=health,
                logger=self._log,
                health_messages=self.kube.gate("ResourceHealthStatusMessage"),
                kube=self.kube,
            )
        except Exception:
            plugins.stop()
            raise
        self.plugins_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._plugins, self._manager = plugins, manager
            self._work, self._active, self._reconcile_due = {}, None, float("inf")
            self._stopped.clear()
            self._loop = threading.Thread(target=self._run, name=f"dra-{self.node_name}", daemon=True)
        self._loop.start()
        return _RefusingHandler(plugins, self._next_refusal)

    def wait_startup_wipe(self, timeout: float) -> bool:
        """Wait until this kubelet start's wipe of the node's slices went through (upstream runs it in the background,
        retried with back-off while the API fails). The embedded kubelet's start returns only then, so a driver the
        harness starts next never has its first slices deleted by a wipe that lagged (the driver would then publish
        again only after its resync, up to a minute). ``False`` when it did not within ``timeout``."""
        plugins = self._plugins
        return plugins is None or plugins.startup_wiped.wait(timeout)

    def sources_ready(self, active_pods: Callable[[], set[str]]) -> None:
        """The kubelet has seen every pod bound to it: the reconcile loop may now unprepare claims of pods that are
        not active (its first pass one reconcile period from now, as upstream's loop, unless a pod change comes)."""
        with self._lock:
            self._active = active_pods
            self._reconcile_due = time.monotonic() + self.timings.reconcile_period
        self._wake.set()

    def stop(self) -> None:
        """The kubelet process ends (its plugin watcher stopped first): connections (in-flight calls are cancelled)
        and pending work go."""
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            plugins, loop = self._plugins, self._loop
            self._plugins = self._manager = None
            self._work = {}
        self._wake.set()
        if plugins is not None:
            plugins.stop()
        if loop is not None and loop is not threading.current_thread():
            loop.join(timeout=10.0)

    # --- introspection ---------------------------------------------------------------------------

    def _record_call(self, driver: str, method: str, uids: list[str], error: str) -> None:
        with self._lock:
            self.calls.append(DRACall(driver, method, tuple(uids), error))

    def registered(self) -> dict[str, list[str]]:
        """Driver -> endpoints of its registered plugins (empty while the kubelet is down)."""
        plugins = self._plugins
        return plugins.registered() if plugins is not None else {}

    def usable(self, driver: str) -> bool:
        """Whether a plugin of ``driver`` is registered and its DRA socket connected."""
        plugins = self._plugins
        return plugins is not None and plugins.usable(driver)

    def chosen_service(self, driver: str) -> str | None:
        plugins = self._plugins
        try:
            return plugins.get_plugin(driver).chosen_service if plugins is not None else None
        except DRAPluginError:
            return None

    def wipes(self) -> list[str | None]:
        """Slice wipes of this kubelet lifetime: a driver name, or ``None`` for the node's wipe at start."""
        plugins = self._plugins
        return list(plugins.wiped) if plugins is not None else []

    def claim_infos(self) -> list[cp.ClaimInfoState]:
        manager = self._manager
        return manager.claim_infos() if manager is not None else []

    def pending(self) -> dict[str, str]:
        """Pod UID -> the last prepare error of each pod whose containers wait for its claims."""
        with self._lock:
            return {uid: w.last_error for uid, w in self._work.items() if w.start is not None}

    def refuse_next_registration(self, reason: str, times: int = 1) -> None:
        """Refuse the next ``times`` registration attempts with ``reason`` (in this kubelet lifetime or the next)."""
        with self._lock:
            self._refusals.extend([reason] * times)

    def _next_refusal(self) -> str | None:
        with self._lock:
            return self._refusals.pop(0) if self._refusals else None

    def set_wiping_delay(self, seconds: float) -> None:
        self.timings.wiping_delay = seconds
        plugins = self._plugins
        if plugins is not None:
            plugins.wiping_delay = seconds

    # --- pods ----------------------------------------------------------------------------------

    def sync_pod(self, pod: Obj, *, sandbox: bool, start: Callable[[], None]) -> bool:
        """Called when the kubelet (re-)admits ``pod``. ``True``: start (or adopt) its containers now. ``False``:
        its claims are being prepared; ``start`` is called once they are (never for a pod no longer active).

        Claims are prepared only for a pod whose sandbox is to be created, as ``kuberuntime_manager.go``'s
        ``SyncPod`` does in every release from 1.34 to 1.38: a kubelet restarted beside a running sandbox asks the
        driver nothing; after a reboot (sandboxes gone) it asks again for every claim, as its in-memory "prepared"
        flag is not checkpointed (kubernetes/kubernetes#141966)."""
        if not has_claims(pod) or sandbox:
            return True
        uid = str(pod["metadata"]["uid"])
        with self._lock:
            if self._stopped.is_set():
                return False
            self._work[uid] = _PodWork(dict(pod), start, due=time.monotonic())
        self._wake.set()
        return False

    def pods_changed(self) -> None:
        """A pod was deleted or finished: unprepare what only it used, now."""
        with self._lock:
            if self._active is not None:
                self._reconcile_due = time.monotonic()
        self._wake.set()

    def cdi_devices(self, pod: Obj, container: str) -> list[str]:
        """The CDI device IDs the runtime must give ``container`` (its claims' prepared devices)."""
        manager = self._manager
        if manager is None or not has_claims(pod):
            return []
        try:
            return manager.container_cdi_devices(pod, container)
        except DRAPrepareError as exc:
            self._log.error('"Failed to get CDI devices" pod="%s" container="%s" err="%s"', _key(pod), container, exc)
            return []

    def resources_status(self, pod: Obj, container: str) -> list[dict[str, Any]]:
        """``allocatedResourcesStatus`` entries of ``container`` for its claims (``claim:<name>[/<request>]``)."""
        manager = self._manager
        if manager is None or not has_claims(pod):
            return []
        try:
            return manager.allocated_resources_status(pod, container)
        except DRAPrepareError:
            return []

    # --- the loop: prepare attempts, reconcile ---------------------------------------------------

    def _run(self) -> None:
        while not self._stopped.is_set():
            now = time.monotonic()
            with self._lock:
                due = [uid for uid, w in self._work.items() if not w.in_flight and w.due <= now]
                for uid in due:
                    self._work[uid].in_flight = True
                reconcile = self._active is not None and self._reconcile_due <= now
                if reconcile:
                    self._reconcile_due = now + self.timings.reconcile_period
                waits = [w.due for w in self._work.values() if not w.in_flight] + [self._reconcile_due]
            for uid in due:
                threading.Thread(target=self._prepare, args=(uid,), name=f"dra-prepare-{uid[:8]}", daemon=True).start()
            if reconcile:
                self._reconcile()
            # sleep until the next due moment (at most 1 s: a changed period applies soon) or a kick
            self._wake.wait(min(1.0, max(0.0, min(waits) - time.monotonic())))
            self._wake.clear()

    def _still_active(self, uid: str) -> bool:
        active = self._active
        return active is None or uid in active()

    def _prepare(self, uid: str) -> None:
        """One attempt of the pod worker's sync for ``uid``: prepare its claims, then start its containers."""
        with self._lock:
            work, manager = self._work.get(uid), self._manager
        if work is None or manager is None:
            return
        if not self._still_active(uid):
            with self._lock:
                self._work.pop(uid, None)
            return
        pod = work.pod
        work.attempts += 1
        try:
            manager.prepare_resources(pod)
        except DRAPrepareError as exc:
            if self._stopped.is_set():
                return
            if not self._still_active(uid):
                self._finished(uid)
                return
            message = f"Failed to prepare dynamic resources: {exc}"
            self._log.error('"Failed to prepare dynamic resources" pod="%s" err="%s"', _key(pod), exc)
            self._event(pod, "Warning", "FailedPrepareDynamicResources", message)
            with self._lock:
                work.last_error, work.in_flight = str(exc), False
                work.due = time.monotonic() + self.timings.retry_period
            self._wake.set()
            return
        with self._lock:
            if self._work.get(uid) is work:
                del self._work[uid]
            start, work.start = work.start, None
        if not self._still_active(uid):
            self._finished(uid)
        elif start is not None and not self._stopped.is_set():
            start()

    def _finished(self, uid: str) -> None:
        """The pod went away while its prepare was in flight: what it prepared is unprepared now."""
        with self._lock:
            self._work.pop(uid, None)
        self.pods_changed()

    def _reconcile(self) -> None:
        """``reconcileLoop`` once: unprepare for pods that are not active; a failure is retried after the back-off."""
        with self._lock:
            manager, active = self._manager, self._active
        if manager is None or active is None:
            return
        pods = active()
        with self._lock:
            # a prepare in flight finishes first (the pod worker serializes a pod's sync and termination)
            busy = {uid for uid, w in self._work.items() if w.in_flight}
            for uid in [u for u in self._work if u not in pods and u not in busy]:
                del self._work[uid]  # gone before its claims were prepared: never prepared now
        errors = manager.reconcile(pods | busy)
        if errors and not self._stopped.is_set():
            with self._lock:
                self._reconcile_due = min(self._reconcile_due, time.monotonic() + self.timings.retry_period)


def _key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
