"""Handles that read naturally in a test: ``pod.env``, ``node.allocatable()``, ``plugin.mock.inject_xid(...)``.

Every property asks the backend afresh (no caching), so a test reads the cluster as it is now;
the ``wait_*`` methods are the only places that poll, each with a bounded timeout.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from . import backing
from .crash import fatal_lines, last_error_line, start_failure
from .backends import mockstate
from .backends.base import (
    DEFAULT_REREGISTRATION_TIMEOUT,
    DEFAULT_IMAGE,
    Backend,
    Checkpoint,
    ContainerView,
    DeviceNodeView,
    ExecResult,
    MountView,
    NodeSpec,
    PluginSpec,
    PodResourcesDevices,
    PodResourcesPod,
    node_tolerations,
    parse_checkpoint,
)
from .errors import (
    ContainerStatusMissingError,
    MockControlsUnavailableError,
    ObjectNotFoundError,
    UnknownBackingError,
    WaitTimeout,
)
from .kubeletmodel import quantity
from .kubeletmodel.releases import RULES, KubeVersion, RuleName
from .waiting import wait_for

__all__ = [
    "ClusterHandle",
    "NodeHandle",
    "PluginHandle",
    "PluginChanges",
    "PodHandle",
    "PodFactory",
    "MockNvml",
    "DEFAULT_IMAGE",
    "parse_quantity",
]


def parse_quantity(value: str | int | None) -> int:
    """An extended-resource quantity as an int (they are integers; ``"0"``/missing -> 0), in any form the API
    server writes (``"1k"`` for 1000); raises ``ValueError`` for a fraction or a text that is no quantity."""
    if value is None:
        return 0
    q = quantity.parse_quantity(value)
    if not q.is_integer():
        raise ValueError(f"extended-resource quantity {value!r} is not an integer")
    return q.ceil_int()


class NodeHandle:
    """A node of the cluster under test."""

    def __init__(
        self,
        backend: Backend,
        name: str,
        *,
        timeout: float,
        reregistration_timeout: float = DEFAULT_REREGISTRATION_TIMEOUT,
    ) -> None:
        self.backend = backend
        self.name = name
        self.timeout = timeout
        #: Bound of a wait for the plugin to register again after a kubelet restart (never below ``timeout``).
        self.reregistration_timeout = max(reregistration_timeout, timeout)

    def __repr__(self) -> str:
        return f"NodeHandle({self.name!r})"

    @property
    def obj(self) -> dict[str, Any]:
        return self.backend.get_node(self.name)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.obj.get("metadata", {}).get("labels") or {})

    @property
    def kube(self) -> KubeVersion:
        """The release this node's kubelet is (``status.nodeInfo``) with the run's feature gates: what a
        release-dependent check judges by (the embedded kubelet's is the run's ``--devplug-kubernetes-version``)."""
        version = str(self.obj.get("status", {}).get("nodeInfo", {}).get("kubeletVersion") or "")
        return self.backend.options.kube.on_node(version)

    def require(self, rule: RuleName) -> KubeVersion:
        """Skip the calling check, saying why, where this node's release does not behave as ``rule``
        (:data:`~pytest_devplug.kubeletmodel.releases.RULES`); returns the node's release where it does."""
        kube = self.kube
        if not kube.has(rule):
            r = RULES[rule]
            pytest.skip(
                f"holds for Kubernetes {r.releases} ({r.what}; {r.upstream}); node {self.name} runs {kube.name}"
            )
        return kube

    def require_gate(self, gate: str, what: str) -> KubeVersion:
        """Skip the calling check, saying why, where feature gate ``gate`` is off on this node's release (its
        default there, or ``--devplug-feature-gates``); ``what`` says what the gate brings."""
        kube = self.kube
        if not kube.gate(gate):
            pytest.skip(
                f"needs feature gate {gate} ({what}), off on node {self.name}'s {kube.name}"
                f"{' (--devplug-feature-gates)' if gate in kube.feature_gates else ' by default'}"
            )
        return kube

    def capacity(self, resource: str) -> int:
        return parse_quantity((self.obj.get("status", {}).get("capacity") or {}).get(resource))

    def allocatable(self, resource: str) -> int:
        return parse_quantity((self.obj.get("status", {}).get("allocatable") or {}).get(resource))

    def counts(self, resource: str) -> tuple[int | None, int | None]:
        """``(capacity, allocatable)``; ``None`` where the node status does not list the resource."""
        status = self.obj.get("status", {})
        cap = (status.get("capacity") or {}).get(resource)
        alloc = (status.get("allocatable") or {}).get(resource)
        return (None if cap is None else parse_quantity(cap), None if alloc is None else parse_quantity(alloc))

    def wait_counts(
        self,
        resource: str,
        *,
        capacity: int | None = None,
        allocatable: int | None = None,
        timeout: float | None = None,
        give_up: Callable[[], str | None] | None = None,
    ) -> tuple[int | None, int | None]:
        """Wait until capacity/allocatable equal the given values (``None`` = any); ``give_up`` as in ``wait_for``."""

        def ok(c: tuple[int | None, int | None]) -> bool:
            return (capacity is None or (c[0] or 0) == capacity) and (allocatable is None or (c[1] or 0) == allocatable)

        return wait_for(
            lambda: self.counts(resource),
            ok,
            timeout=self.timeout if timeout is None else timeout,
            what=f"{self.name}: {resource} capacity={capacity} allocatable={allocatable} (capacity, allocatable)",
            give_up=give_up,
        )

    def restart_kubelet(self) -> None:
        self.backend.restart_kubelet(self.name)

    def stop_kubelet(self) -> None:
        """Stop the kubelet and keep it down (containers keep running) until :meth:`start_kubelet`."""
        self.backend.stop_kubelet(self.name)

    def start_kubelet(self) -> None:
        self.backend.start_kubelet(self.name)

    @property
    def kubelet_running(self) -> bool:
        """Whether the node's kubelet runs (``False`` between a :meth:`stop_kubelet` and its :meth:`start_kubelet`);
        asked of the backend's optional ``kubelet_running(node)``, assumed where it has none."""
        probe = getattr(self.backend, "kubelet_running", None)
        return True if probe is None else bool(probe(self.name))

    def reboot(self) -> str:
        """Reboot the node: containers and plugin processes go, ``/var/run/cdi`` is emptied, the kubelet starts again;
        the plugin does not (``PluginHandle.start`` brings it back, as its DaemonSet would). Returns how the backend
        rebooted it (``staged: ...`` where it cannot reboot the machine): a check notes it for the report
        (``pytest_devplug.report.note_check``)."""
        return self.backend.reboot_node(self.name)

    def kubelet_log(self) -> str:
        return self.backend.kubelet_log(self.name)

    def checkpoint(self) -> Checkpoint | None:
        raw = self.backend.read_checkpoint(self.name)
        return None if raw is None else parse_checkpoint(raw)

    def pod_resources(self) -> list[PodResourcesPod]:
        return self.backend.pod_resources(self.name)

    def pod_resources_get(self, name: str, namespace: str) -> PodResourcesPod:
        """pod-resources v1 ``Get`` of one pod on this node (``BackendError`` when the kubelet does not know it)."""
        return self.backend.pod_resources_get(self.name, name, namespace)

    def allocatable_devices(self, resource: str | None = None) -> list[PodResourcesDevices]:
        devs = self.backend.allocatable_devices(self.name)
        return [d for d in devs if resource is None or d.resource_name == resource]

    def device_ids(self, resource: str) -> list[str]:
        """Allocatable device IDs of ``resource`` per pod-resources ``GetAllocatableResources``."""
        return sorted(i for d in self.allocatable_devices(resource) for i in d.device_ids)

    @property
    def machine_numa_nodes(self) -> list[int]:
        """NUMA node IDs of the node's machine (what its Topology Manager builds hints over)."""
        return self.backend.machine_numa_nodes(self.name)

    def device_numa(self, resource: str) -> dict[str, tuple[int, ...]]:
        """Device ID -> NUMA nodes it reports (empty tuple: no topology)."""
        out: dict[str, tuple[int, ...]] = {}
        for d in self.allocatable_devices(resource):
            for i in d.device_ids:
                out[i] = d.numa_nodes
        return out


class MockNvml:
    """Fault controls of the included GPU plugin: edits its mock-NVML state file on the node."""

    def __init__(self, plugin: PluginHandle) -> None:
        self._plugin = plugin

    def _edit(self, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self._plugin.mark_changed(devices=True)
        backend, node = self._plugin.backend, self._plugin.node.name
        backend.write_mock_state(node, fn(backend.read_mock_state(node)))

    @property
    def state(self) -> dict[str, Any]:
        return self._plugin.backend.read_mock_state(self._plugin.node.name)

    @property
    def uuids(self) -> list[str]:
        return [str(g["uuid"]) for g in self.state["gpus"]]

    def backing_gpu(self, device_id: str) -> str:
        """The mock GPU's UUID that backs the plugin's ``device_id`` (a GPU or MIG UUID, ``<uuid>::<n>``,
        ``nvidia<minor>``, else what Allocate injects for it: :mod:`~pytest_devplug.backing`); raises
        :class:`~pytest_devplug.errors.UnknownBackingError` when no single mock GPU does."""
        return backing.backing_gpu(device_id, self.state["gpus"], self._plugin.injections)

    def backed_devices(self, device_ids: list[str] | None = None) -> dict[str, list[str]]:
        """Mock GPU UUID -> the device IDs it backs, of ``device_ids`` (default: the plugin's allocatable ones)."""
        ids = self._plugin.node.device_ids(self._plugin.resource_name) if device_ids is None else device_ids
        return backing.backed_devices(ids, self.state["gpus"], self._plugin.injections)

    def numa_of(self, uuid: str) -> int | None:
        for g in self.state["gpus"]:
            if g["uuid"] == uuid:
                return None if g["numa_node"] is None else int(g["numa_node"])
        raise KeyError(uuid)

    def inject_xid(self, uuid: str, xid: int = 79) -> None:
        """Deliver an Xid critical-error event for ``uuid`` (79 = fallen off the bus: makes it Unhealthy)."""
        self._edit(lambda s: mockstate.with_xid(s, uuid, xid))

    def inject_ecc_error(self, uuid: str) -> None:
        """An uncorrectable ECC error on ``uuid``: NVML counts it and delivers a DoubleBitEcc event and Xid 48."""
        self._edit(lambda s: mockstate.with_ecc_error(s, uuid))

    def set_lost(self, uuid: str, lost: bool = True) -> None:
        """Make NVML answer GPU_IS_LOST for ``uuid`` (or answer again, which also clears an Xid)."""
        self._edit(lambda s: mockstate.with_lost(s, uuid, lost))

    def set_usable(self, uuid: str) -> None:
        self.set_lost(uuid, False)

    def fail_allocate(self, uuid: str, fail: bool = True) -> None:
        """Make the plugin's Allocate fail for any request including ``uuid``."""
        self._edit(lambda s: mockstate.with_fail_allocate(s, uuid, fail))

    def fail_pre_start(self, uuid: str, fail: bool = True) -> None:
        """Make the plugin's PreStartContainer fail for any request including ``uuid``."""
        self._edit(lambda s: mockstate.with_fail_pre_start(s, uuid, fail))

    def add_gpu(self, numa_node: int | None = 0) -> str:
        added: list[str] = []

        def fn(s: dict[str, Any]) -> dict[str, Any]:
            new, uuid = mockstate.with_gpu_added(s, numa_node)
            added.append(uuid)
            return new

        self._edit(fn)
        return added[0]

    def remove_gpu(self, uuid: str) -> None:
        self._edit(lambda s: mockstate.with_gpu_removed(s, uuid))


class PluginChanges:
    """What was done to a deployed plugin since it was last clean: its handle reports every change here,
    and whoever restores the plugin (the ``devplug_plugin`` fixture's deployment) owns and reads it."""

    def __init__(self) -> None:
        #: Stopped, killed, (re)started or faulted: the plugin may differ from the deployed one.
        self.touched = False
        #: Faulted: its devices differ from the deployed ones, so only a redeploy restores it.
        self.devices = False

    def note(self, *, devices: bool = False) -> None:
        self.touched = True
        self.devices = self.devices or devices

    def clear(self) -> None:
        self.touched = self.devices = False


#: ``plugin.dirty = True`` of 0.1.0 would otherwise set an attribute nothing reads, and change nothing.
_DIRTY_REMOVED = "PluginHandle.dirty was removed: call plugin.mark_changed(devices=True) (see CHANGELOG.md)"


class PluginHandle:
    """The plugin under test as deployed on one node.

    Every call that changes the plugin (faults, stop, kill, start, restart) is reported to its
    :class:`PluginChanges`; after the test the ``devplug_plugin`` fixture starts a plugin that was only
    stopped or restarted again (no redeploy), and redeploys one whose devices were changed, so the next
    test starts clean. A fault injector of your own calls :meth:`mark_changed` for the same effect.
    """

    def __init__(
        self, backend: Backend, node: NodeHandle, spec: PluginSpec, *, changes: PluginChanges | None = None
    ) -> None:
        self.backend = backend
        self.node = node
        self.spec = spec
        self._changes = PluginChanges() if changes is None else changes
        #: stop()/kill() was called and no start() since: an exit then is the test's doing, not a crash.
        self.stopped = False
        self._injected: dict[str, ContainerView] = {}  # device ID -> what Allocate gives it, since the last start

    def mark_changed(self, *, devices: bool = False) -> None:
        """Tell the deployment this plugin is no longer as deployed (``devices``: its devices changed too)."""
        self._changes.note(devices=devices)

    @property
    def dirty(self) -> bool:
        """Removed (0.1.0's way to say the plugin changed): raises, naming :meth:`mark_changed`."""
        raise AttributeError(_DIRTY_REMOVED)

    @dirty.setter
    def dirty(self, value: bool) -> None:
        raise AttributeError(_DIRTY_REMOVED)

    def __repr__(self) -> str:
        return f"PluginHandle({self.spec.resource_name!r} on {self.node.name!r})"

    @property
    def resource_name(self) -> str:
        return self.spec.resource_name

    @property
    def resource_names(self) -> tuple[str, ...]:
        """Every resource the plugin advertises (``PluginSpec.resource_names``), ``resource_name`` first."""
        return self.spec.resource_names

    @property
    def has_mock(self) -> bool:
        return self.spec.mock

    @property
    def mock(self) -> MockNvml:
        if not self.spec.mock:
            raise MockControlsUnavailableError(
                "this plugin was deployed without mock-NVML controls (PluginSpec.mock is False / "
                "--devplug-no-mock); tests that inject faults need the included GPU plugin or a plugin "
                "that reads the mock-state file"
            )
        return MockNvml(self)

    @property
    def running(self) -> bool:
        return self.backend.plugin_running(self.node.name)

    def log(self) -> str:
        return self.backend.plugin_log(self.node.name)

    def stop(self) -> None:
        self.mark_changed()
        self.stopped = True
        self.backend.stop_plugin(self.node.name)

    def kill(self) -> None:
        self.mark_changed()
        self.stopped = True
        self.backend.kill_plugin(self.node.name)

    def start(self) -> None:
        self.mark_changed()
        self.stopped = False
        self._injected.clear()
        self.backend.start_plugin(self.node.name)

    def injections(self, device_ids: list[str]) -> dict[str, ContainerView]:
        """What the plugin's ``Allocate`` gives a container for each of ``device_ids`` alone (the backend's
        ``device_injections``, asked once per device while this start of the plugin lasts)."""
        missing = [d for d in device_ids if d not in self._injected]
        if missing:
            self._injected.update(self.backend.device_injections(self.node.name, self.resource_name, missing))
        return {d: self._injected[d] for d in device_ids if d in self._injected}

    def restart(self) -> None:
        self.stop()
        self.start()

    def surge(self) -> None:
        """Start a second instance of the plugin beside this one (a rolling update's new pod); see :meth:`retire`.
        The plugin is redeployed after the test: a test that ends before ``retire`` must not leave two."""
        self.mark_changed(devices=True)
        self.backend.surge_plugin(self.node.name)

    def retire(self, *, newest: bool = False) -> None:
        """Stop the first instance gracefully, leaving the second as the plugin (``newest``: stop the second)."""
        self.mark_changed()
        self.backend.retire_plugin(self.node.name, newest=newest)

    def exited(self, log_lines: int = 12) -> str | None:
        """``None`` while the plugin runs or may still start; else how it ended (the backend's
        ``plugin_exit``) and the last lines of its log: the reason a wait for it can stop at once."""
        how = self.backend.plugin_exit(self.node.name)
        return None if how is None else exit_report("plugin", how, self.log(), log_lines)

    def exit_cause(self) -> str | None:
        """What the exited plugin said about why (its fatal lines, else its last error line); ``None`` while it
        runs or when it said nothing of the kind."""
        return None if self.backend.plugin_exit(self.node.name) is None else _exit_cause(self.log())

    def crashed(self) -> str | None:
        """:meth:`exited`, unless the test stopped or killed the plugin itself: a wait's ``give_up``."""
        return None if self.stopped else self.exited()

    def wait_ready(self, count: int | None = None, timeout: float | None = None) -> None:
        """Wait until the node lists the resource as allocatable (``count`` of them, or at least one);
        stops at once when the plugin process has exited."""
        res = self.resource_name

        def ok(c: tuple[int | None, int | None]) -> bool:
            return (c[1] or 0) == count if count is not None else (c[1] or 0) > 0

        try:
            wait_for(
                lambda: self.node.counts(res),
                ok,
                timeout=self.node.timeout if timeout is None else timeout,
                what=f"{res} allocatable on {self.node.name}",
                give_up=self.crashed,
            )
        except WaitTimeout as exc:
            raise self._not_ready(
                f"plugin for {res} did not become ready on node {self.node.name}: expected allocatable "
                f"{count if count is not None else '>0'}, saw (capacity, allocatable) = {exc.last}",
                exc,
            ) from None

    def _not_ready(self, message: str, exc: WaitTimeout[Any]) -> AssertionError:
        from .evidence import collect_evidence
        from .errors import DevplugAssertionError

        why = f"; {exc.reason}" if exc.reason else ""
        return DevplugAssertionError(message + why, collect_evidence(self.backend, self.node.name))

    def wait_listed(self, timeout: float | None = None) -> None:
        """Wait until the plugin is ready as deployed: some devices allocatable and, on the mock NVML, a device
        (of any resource it advertises) for every mock GPU that answers NVML — however many devices per GPU the
        plugin lists (replicas, MIG).
        When a device ID names no mock GPU, any non-empty listing is ready."""
        self.wait_ready(None, timeout)
        if not self.spec.mock:
            return
        mock = self.mock

        def unlisted() -> list[str]:
            try:
                backed = mock.backed_devices([i for r in self.resource_names for i in self.node.device_ids(r)])
            except UnknownBackingError:
                return []
            lost = {str(g["uuid"]) for g in mock.state["gpus"] if g.get("lost")}
            return [uuid for uuid, ids in backed.items() if not ids and uuid not in lost]

        try:
            wait_for(
                unlisted,
                lambda missing: not missing,
                timeout=self.node.timeout if timeout is None else timeout,
                what=f"a {self.resource_name} device for every mock GPU",
                give_up=self.crashed,
            )
        except WaitTimeout as exc:
            raise self._not_ready(
                f"plugin for {self.resource_name} on node {self.node.name} lists no allocatable device backed by the "
                f"mock GPUs {exc.last} (a device ID backed by a GPU embeds its UUID or is nvidia<minor>)",
                exc,
            ) from None


def exit_report(what: str, how: str, log: str, log_lines: int = 12) -> str:
    """How a plugin (or DRA driver) process ended, what it said about why, and its last log lines."""
    cause = _exit_cause(log)
    tail = [ln for ln in log.splitlines() if ln.strip() and not ln.startswith("--- ")][-log_lines:]
    return (
        f"the {what} process {how}; "
        + (f"{cause}; " if cause else "")
        + ("last log lines:\n    " + "\n    ".join(tail) if tail else "its log is empty")
    )


def _exit_cause(log: str) -> str | None:
    fatal = fatal_lines(log)
    if fatal:
        return "fatal: " + " | ".join(fatal)
    error = last_error_line(log)
    return f"last error: {error}" if error else None


#: Pod phases a pod never leaves.
TERMINAL_PHASES = ("Succeeded", "Failed")


def _iter_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec", {})
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


class PodHandle:
    """A pod the test created. Properties read the cluster now; ``container`` picks the default one."""

    def __init__(
        self, backend: Backend, name: str, namespace: str, *, container: str, resource_name: str, timeout: float
    ) -> None:
        self.backend = backend
        self.name = name
        self.namespace = namespace
        self.container = container
        self.resource_name = resource_name
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"PodHandle({self.namespace}/{self.name})"

    # -- the pod object ----------------------------------------------------------------------------
    @property
    def obj(self) -> dict[str, Any]:
        return self.backend.get_pod(self.name, self.namespace)

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"]["uid"])

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.obj.get("status") or {})

    @property
    def phase(self) -> str:
        return str(self.status.get("phase", ""))

    @property
    def reason(self) -> str | None:
        value = self.status.get("reason")
        return None if value is None else str(value)

    @property
    def message(self) -> str | None:
        value = self.status.get("message")
        return None if value is None else str(value)

    @property
    def node_name(self) -> str | None:
        value = self.obj.get("spec", {}).get("nodeName")
        return None if value is None else str(value)

    @property
    def conditions(self) -> list[dict[str, Any]]:
        return list(self.status.get("conditions") or [])

    def container_status(self, container: str | None = None) -> dict[str, Any]:
        name = container or self.container
        for st in [*(self.status.get("initContainerStatuses") or []), *(self.status.get("containerStatuses") or [])]:
            if st.get("name") == name:
                return dict(st)
        raise ContainerStatusMissingError(f"pod {self.namespace}/{self.name} has no status for container {name!r} yet")

    @property
    def restart_count(self) -> int:
        return int(self.container_status().get("restartCount", 0))

    @property
    def device_health(self) -> dict[str, str]:
        """``allocatedResourcesStatus`` of the default container: device ID -> health, for our resource."""
        out: dict[str, str] = {}
        for entry in self.container_status().get("allocatedResourcesStatus") or []:
            if entry.get("name") == self.resource_name:
                for r in entry.get("resources") or []:
                    out[str(r.get("resourceID"))] = str(r.get("health"))
        return out

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.backend.events(namespace=self.namespace, involved_name=self.name)

    @property
    def event_messages(self) -> list[str]:
        return [f"{e.get('reason')}: {e.get('message')}" for e in self.events]

    # -- what the container got from Allocate --------------------------------------------------
    def view(self, container: str | None = None) -> ContainerView:
        return self.backend.container_view(self.name, container or self.container, self.namespace)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.view().envs)

    @property
    def device_nodes(self) -> list[DeviceNodeView]:
        return list(self.view().devices)

    @property
    def mounts(self) -> list[MountView]:
        return list(self.view().mounts)

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.view().annotations)

    @property
    def cdi_devices(self) -> list[str]:
        return list(self.view().cdi_devices)

    def allocated(self, container: str | None = None, resource: str | None = None) -> list[str]:
        """Device IDs of ``resource`` assigned to the container, per the pod-resources API on its node."""
        node = self.node_name
        if not node:
            return []
        cname, res = container or self.container, resource or self.resource_name
        for p in self.backend.pod_resources(node):
            if p.name == self.name and p.namespace == self.namespace:
                for c in p.containers:
                    if c.name == cname:
                        return sorted(c.device_ids(res))
        return []

    @property
    def allocated_devices(self) -> list[str]:
        return self.allocated()

    # -- actions -----------------------------------------------------------------------------------
    def exec(self, *argv: str, container: str | None = None) -> ExecResult:
        """Run ``argv`` in the container: an :class:`ExecResult` (``returncode``, ``stdout``, ``stderr``).

        On ``sim`` only the commands docs/guides/backends.md lists are answered; others raise
        ``UnsupportedOperationError``.
        """
        return self.backend.exec_pod(
            self.name, list(argv), container=container or self.container, namespace=self.namespace
        )

    def restart_container(self, container: str | None = None) -> None:
        self.backend.restart_container(self.name, container or self.container, self.namespace)

    def delete(self) -> None:
        self.backend.delete_pod(self.name, self.namespace)

    def delete_and_wait_gone(self, timeout: float | None = None) -> None:
        """Delete the pod and wait until neither the scheduler nor the kubelet counts its devices: the API server no
        longer has it (the scheduler drops a pod on its deletion) and its node's pod-resources lists it no more."""
        node = self.node_name
        self.delete()

        def left() -> list[str]:
            where = []
            try:
                self.backend.get_pod(self.name, self.namespace)
                where.append("the API server")
            except ObjectNotFoundError:
                pass
            if node and any(
                p.name == self.name and p.namespace == self.namespace for p in self.backend.pod_resources(node)
            ):
                where.append(f"node {node}'s pod-resources")
            return where

        wait_for(
            left,
            lambda w: not w,
            timeout=self.timeout if timeout is None else timeout,
            what=f"pod {self.namespace}/{self.name} gone, its devices free",
        )

    # -- waits -------------------------------------------------------------------------------------
    def wait_phase(self, *phases: str, timeout: float | None = None) -> str:
        """Wait until the pod is in one of ``phases``; fails with the pod's status and events otherwise,
        at once when the pod reached a terminal phase (``Succeeded``/``Failed``) that is not wanted."""
        seen: list[str] = []

        def probe() -> str:
            seen[:] = [self.phase]
            return seen[0]

        def terminal() -> str | None:
            if seen and seen[0] in TERMINAL_PHASES:
                return f"the pod is {seen[0]}, a terminal phase"
            return start_failure(self.obj) if seen and seen[0] == "Pending" else None

        try:
            return wait_for(
                probe,
                lambda p: p in phases,
                timeout=self.timeout if timeout is None else timeout,
                what=f"pod {self.namespace}/{self.name} phase in {phases}",
                give_up=terminal,
            )
        except WaitTimeout as exc:
            stopped = f"; stopped early: {exc.reason}" if exc.reason else ""
            raise self._failure(
                f"expected pod {self.namespace}/{self.name} to reach phase {'/'.join(phases)}{stopped}"
            ) from None

    def wait_running(self, timeout: float | None = None) -> PodHandle:
        self.wait_phase("Running", timeout=timeout)
        return self

    def wait_container_replaced(self, old_id: str, timeout: float | None = None) -> str:
        """Wait until the default container runs again as another container than ``old_id`` (after a reboot its
        pod's containers are created anew); fails at once when the runtime refuses to create it. Returns its ID."""

        def probe() -> dict[str, Any]:
            return self.container_status()

        def replaced(status: dict[str, Any]) -> bool:
            return status.get("containerID", old_id) != old_id and "running" in (status.get("state") or {})

        try:
            status = wait_for(
                probe,
                replaced,
                timeout=self.timeout if timeout is None else timeout,
                retry_on=(ContainerStatusMissingError,),
                what=f"container {self.container!r} of pod {self.namespace}/{self.name} running again, not as {old_id}",
                give_up=lambda: start_failure(self.obj),
            )
        except WaitTimeout as exc:
            stopped = f"; stopped early: {exc.reason}" if exc.reason else ""
            raise self._failure(
                f"expected container {self.container!r} of pod {self.namespace}/{self.name} to run again "
                f"as a new container{stopped}"
            ) from None
        return str(status["containerID"])

    def wait_event(self, pattern: str, timeout: float | None = None) -> str:
        """Wait for an event on this pod whose ``reason: message`` matches the regex ``pattern``."""
        rx = re.compile(pattern)

        def found(msgs: list[str]) -> bool:
            return any(rx.search(m) for m in msgs)

        try:
            msgs = wait_for(
                lambda: self.event_messages,
                found,
                timeout=self.timeout if timeout is None else timeout,
                what=f"event /{pattern}/",
            )
        except WaitTimeout:
            raise self._failure(f"expected an event matching /{pattern}/ on pod {self.namespace}/{self.name}") from None
        return next(m for m in msgs if rx.search(m))

    def _failure(self, expected: str) -> AssertionError:
        from .evidence import collect_evidence
        from .errors import DevplugAssertionError

        try:
            st = self.status
            seen = f"phase={st.get('phase')!r} reason={st.get('reason')!r} message={st.get('message')!r}"
            events = "; ".join(self.event_messages) or "none"
        except Exception as exc:  # noqa: BLE001 - report what we could not read
            seen, events = f"<could not read pod: {exc}>", "?"
        return DevplugAssertionError(
            f"{expected}; saw {seen}; events: {events}",
            collect_evidence(self.backend, self.node_name, [(self.name, self.namespace)]),
        )


def _count(count: int | None, gpus: int | None) -> int | None:
    if count is not None and gpus is not None:
        raise TypeError(f"give count={count} or its alias gpus={gpus}, not both")
    return count if count is not None else gpus


class PodFactory:
    """``devplug_pod(count=2)``: makes pods requesting the resource under test, deletes them afterwards.

    ``count`` (first argument; ``gpus=`` is an alias) sets the limit of the resource under test, whatever
    it is (the API server copies it into requests). ``limits``/``requests`` set them explicitly (ints or
    quantity strings, e.g. ``requests=1`` alone, or ``limits="0.5"``); ``resources={name: count}`` sets the limits of
    several resources (a plugin that advertises more than one); ``manifest`` takes a full pod dict
    instead. Pods are pinned to ``node`` with a nodeSelector on ``kubernetes.io/hostname`` unless the
    manifest says otherwise, tolerating the taints that node is configured with. Each call returns a
    :class:`PodHandle`.
    """

    _counter = itertools.count(1)

    def __init__(
        self,
        backend: Backend,
        *,
        node: str,
        resource_name: str,
        timeout: float,
        prefix: str = "devplug",
        namespace: str | None = None,
    ) -> None:
        self.backend = backend
        self.node = node
        #: Where pods go unless a manifest says otherwise: the backend's (the cluster backend has its own).
        self.namespace = namespace or getattr(backend, "pod_namespace", "default")
        self.resource_name = resource_name
        self.timeout = timeout
        self.prefix = dns_label(prefix, fallback="devplug")
        self.created: list[tuple[str, str]] = []

    def _tolerations(self, node: str) -> list[dict[str, Any]]:
        """A tainted GPU node's taints: the pod is pinned to it by name (none for a node that does not exist)."""
        try:
            return node_tolerations(self.backend.get_node(node))
        except ObjectNotFoundError:
            return []

    def manifest(
        self,
        count: int | None = None,
        *,
        gpus: int | None = None,
        limits: int | str | None = None,
        requests: int | str | None = None,
        name: str | None = None,
        namespace: str | None = None,
        node: str | None = None,
        image: str = DEFAULT_IMAGE,
        containers: int = 1,
        restart_policy: str | None = None,
        resources: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """The pod :meth:`__call__` would create, for tests that tweak it first. ``resources`` (resource name ->
        count) sets the limits of several resources (or of another one) instead of ``count``."""
        count = _count(count, gpus)
        if resources is not None and (count is not None or limits is not None or requests is not None):
            raise TypeError(
                "give resources={name: count} or count/limits/requests of the resource under test, not both"
            )
        if count is not None and limits is None:
            limits = count
        wanted: dict[str, dict[str, str]] = {}
        if resources is not None:
            wanted["limits"] = {name: str(n) for name, n in resources.items()}
        if limits is not None:
            wanted["limits"] = {self.resource_name: str(limits)}
        if requests is not None:
            wanted["requests"] = {self.resource_name: str(requests)}
        name = name or f"{self.prefix}-{next(self._counter)}"
        spec: dict[str, Any] = {
            "containers": [
                {
                    "name": "main" if i == 0 else f"c{i}",
                    "image": image,
                    "command": ["sleep", "3600"],
                    "resources": wanted,
                }
                for i in range(containers)
            ],
            "nodeSelector": {"kubernetes.io/hostname": node or self.node},
            "terminationGracePeriodSeconds": 1,
        }
        if tolerations := self._tolerations(node or self.node):
            spec["tolerations"] = tolerations
        if restart_policy:
            spec["restartPolicy"] = restart_policy
        meta = {"name": name, "namespace": namespace or self.namespace}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    def __call__(
        self,
        count: int | None = None,
        *,
        gpus: int | None = None,
        manifest: Mapping[str, Any] | None = None,
        wait: bool = False,
        **kwargs: Any,
    ) -> PodHandle:
        """Create a pod (``wait=True``: and wait until it runs). Raises ``PodRejectedError`` on validation."""
        body = dict(manifest) if manifest is not None else self.manifest(_count(count, gpus), **kwargs)
        meta = body.setdefault("metadata", {})
        meta.setdefault("name", f"{self.prefix}-{next(self._counter)}")
        namespace = meta.setdefault("namespace", self.namespace)
        created = self.backend.create_pod(body)
        name = created["metadata"]["name"]
        self.created.append((name, namespace))
        first = _iter_containers(body)[len((body.get("spec") or {}).get("initContainers") or []) :]
        pod = PodHandle(
            self.backend,
            name,
            namespace,
            container=str(first[0]["name"]) if first else "main",
            resource_name=self.resource_name,
            timeout=self.timeout,
        )
        if wait:
            pod.wait_running()
        return pod

    def cleanup(self) -> list[str]:
        """Delete every pod this factory made; returns the errors (cleanup must not stop at the first)."""
        errors = []
        for name, ns in reversed(self.created):
            try:
                self.backend.delete_pod(name, ns)
            except ObjectNotFoundError:
                continue  # already gone (deleted by the test, or its node's kubelet evicted it)
            except Exception as exc:  # noqa: BLE001 - cleanup must not stop at the first; reported by the fixture
                errors.append(f"{ns}/{name}: {exc}")
        self.created.clear()
        return errors


def dns_label(text: str, *, fallback: str) -> str:
    """``text`` as a prefix of names Kubernetes takes as DNS labels (pods, claims: ``[a-z0-9-]``, starting and ending
    alphanumeric), at most 40 characters so a suffix still fits in 63; ``fallback`` when nothing of it is left."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].rstrip("-") or fallback


class ClusterHandle:
    """The cluster under test (``devplug_cluster``): its nodes and a way to deploy plugins on them."""

    def __init__(
        self, backend: Backend, *, timeout: float, reregistration_timeout: float = DEFAULT_REREGISTRATION_TIMEOUT
    ) -> None:
        self.backend = backend
        self.timeout = timeout
        self.reregistration_timeout = reregistration_timeout

    def __repr__(self) -> str:
        return f"ClusterHandle(backend={self.backend.name!r})"

    @property
    def kubeconfig(self) -> str | None:
        """A kubeconfig for kubectl or the ``kubernetes`` client while the run lasts (sim with
        ``--devplug-control-plane real``: its admin kubeconfig); ``None`` where the backend has none to give."""
        value = getattr(self.backend, "kubeconfig", None)
        return str(value) if value else None

    def node(self, name: str) -> NodeHandle:
        return NodeHandle(self.backend, name, timeout=self.timeout, reregistration_timeout=self.reregistration_timeout)

    @property
    def nodes(self) -> list[NodeHandle]:
        return [self.node(str(n["metadata"]["name"])) for n in self.backend.list_nodes()]

    def ensure_node(self, spec: NodeSpec) -> NodeHandle:
        """A node with ``spec``'s traits (the sim creates it; kind must have one)."""
        return self.node(self.backend.ensure_node(spec))

    def deploy(self, node: NodeHandle | str, spec: PluginSpec, *, changes: PluginChanges | None = None) -> PluginHandle:
        """Deploy ``spec`` on ``node`` and return its handle (not waited for: see ``wait_ready``); the
        handle reports what tests do to the plugin to ``changes``."""
        handle = node if isinstance(node, NodeHandle) else self.node(node)
        self.backend.deploy_plugin(handle.name, spec)
        return PluginHandle(self.backend, handle, spec, changes=changes)

    def pods(self, node: NodeHandle | str, resource_name: str, *, prefix: str = "devplug") -> PodFactory:
        """A :class:`PodFactory` pinned to ``node`` (``factory(count=1)`` makes pods); call ``cleanup()`` when done."""
        name = node.name if isinstance(node, NodeHandle) else node
        return PodFactory(self.backend, node=name, resource_name=resource_name, timeout=self.timeout, prefix=prefix)
