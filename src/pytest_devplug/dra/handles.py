"""Handles for DRA tests: ``driver.slices()``, ``claim.allocated``, ``pod.claim_health``, ``node.dra_checkpoint()``.

As with the device-plugin handles, every property asks the cluster afresh and only the ``wait_*`` methods poll,
each with a bounded timeout that stops at once when the driver process has exited.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from ..backends.base import DEFAULT_IMAGE, Backend, node_tolerations
from ..backends.dra import DRABackend, DRACallRecord, DriverSpec, RegistrationRecord
from ..errors import ObjectNotFoundError, RestError
from ..handles import NodeHandle, PluginChanges, PodHandle, dns_label, exit_report
from ..kuberest import KubeRest
from ..kubeletmodel.cdi import SPEC_DIRS
from ..waiting import wait_for
from .objects import (
    RESOURCE_API,
    AllocatedDevice,
    DRACheckpoint,
    PreparedClaim,
    SliceView,
    claim_manifest,
    device_class_manifest,
    device_taint_rule_manifest,
    list_slices,
    parse_dra_checkpoint,
    template_manifest,
)

__all__ = [
    "DRANodeHandle",
    "DriverHandle",
    "ClaimHandle",
    "ClaimPodHandle",
    "ClaimFactory",
    "EXTENDED_RESOURCE_CLAIM",
    "nested_spec_hint",
    "node_tolerations",
]


class DRANodeHandle(NodeHandle):
    """A node with its kubelet's DRA side: the drivers it registered, its ``dra_manager_state``, its calls."""

    def __init__(
        self, backend: Backend, dra: DRABackend, name: str, *, timeout: float, reregistration_timeout: float
    ) -> None:
        super().__init__(backend, name, timeout=timeout, reregistration_timeout=reregistration_timeout)
        self.dra = dra

    @property
    def kubelet_running(self) -> bool:
        return self.dra.kubelet_running(self.name)

    def registered_drivers(self) -> dict[str, list[str]]:
        return self.dra.registered_drivers(self.name)

    def registration_events(self) -> list[RegistrationRecord]:
        return self.dra.registration_events(self.name)

    def dra_calls(self, method: str | None = None, *, driver: str | None = None, since: int = 0) -> list[DRACallRecord]:
        """The kubelet's NodePrepareResources / NodeUnprepareResources calls on this node, oldest first, from its
        ``since``-th call on (``len(node.dra_calls())`` taken before a step counts the calls after it)."""
        calls = self.dra.dra_calls(self.name)[since:]
        return [c for c in calls if method in (None, c.method) and driver in (None, c.driver)]

    def dra_checkpoint(self) -> DRACheckpoint | None:
        raw = self.dra.read_dra_checkpoint(self.name)
        return None if raw is None else parse_dra_checkpoint(raw)

    def cdi_spec_files(self, *, nested: bool = False) -> dict[str, bytes]:
        """The node's CDI spec files (``/etc/cdi``, ``/var/run/cdi``; ``nested``: and their subdirectories') by path."""
        return self.dra.cdi_spec_files(self.name, nested=nested)

    def prepared_claim(self, namespace: str, name: str) -> PreparedClaim | None:
        """What the kubelet checkpointed for claim ``namespace/name`` (``None``: not tracked)."""
        cp = self.dra_checkpoint()
        return None if cp is None else cp.claim(namespace, name)

    def pending_prepares(self) -> dict[str, str]:
        return self.dra.pending_prepares(self.name)

    def slices(self, driver: str | None = None) -> list[SliceView]:
        return list_slices(self.dra.rest, node=self.name, driver=driver)

    def refuse_next_registration(self, reason: str) -> None:
        self.dra.refuse_next_registration(self.name, reason)


class DriverHandle:
    """The DRA driver under test as deployed on one node; changes are reported to ``changes`` (the deployment
    restarts or redeploys it after the test)."""

    def __init__(self, node: DRANodeHandle, spec: DriverSpec, *, changes: PluginChanges | None = None) -> None:
        self.node = node
        self.dra = node.dra
        self.spec = spec
        self._changes = PluginChanges() if changes is None else changes
        #: stop()/kill() was called and no start() since: an exit then is the test's doing.
        self.stopped = False

    def __repr__(self) -> str:
        return f"DriverHandle({self.name!r} on {self.node.name!r})"

    @property
    def name(self) -> str:
        return self.spec.driver_name

    def mark_changed(self, *, devices: bool = False) -> None:
        self._changes.note(devices=devices)

    # -- the process -------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.dra.driver_running(self.node.name)

    def log(self) -> str:
        return self.dra.driver_log(self.node.name)

    @property
    def restarts(self) -> int:
        """How many times the node restarted the driver's process on its own (``restartCount``)."""
        return self.dra.driver_restarts(self.node.name)

    def stop(self) -> None:
        """SIGTERM; returns once the kubelet has seen the driver go."""
        self.mark_changed()
        self.stopped = True
        self.dra.stop_driver(self.node.name)

    def kill(self) -> None:
        """SIGKILL (its sockets stay behind); returns once the kubelet has seen the driver go."""
        self.mark_changed()
        self.stopped = True
        self.dra.kill_driver(self.node.name)

    def start(self) -> None:
        self.mark_changed()
        self.stopped = False
        self.dra.start_driver(self.node.name)

    def restart(self) -> None:
        self.stop()
        self.start()

    def exited(self, log_lines: int = 12) -> str | None:
        """How the driver process ended and its last log lines; ``None`` while it runs or may still start."""
        how = self.dra.driver_exit(self.node.name)
        return None if how is None else exit_report("driver", how, self.log(), log_lines)

    def crashed(self) -> str | None:
        """:meth:`exited`, unless the test stopped or killed the driver itself (a wait's ``give_up``)."""
        return None if self.stopped else self.exited()

    # -- the kubelet's and the API's view ----------------------------------------------------------
    @property
    def registered(self) -> bool:
        return self.name in self.node.registered_drivers()

    @property
    def usable(self) -> bool:
        """Registered and its DRA socket connected."""
        return self.dra.driver_usable(self.node.name, self.name)

    @property
    def service(self) -> str | None:
        """The DRA service the kubelet chose (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``)."""
        return self.dra.driver_service(self.node.name, self.name)

    def slices(self) -> list[SliceView]:
        """The ResourceSlices of this driver on this node."""
        return self.node.slices(self.name)

    def devices(self) -> list[tuple[str, str]]:
        """(pool, device) of every device the driver publishes for this node."""
        return sorted((s.pool, d) for s in self.slices() for d in s.devices)

    def call(self, method: str, claims: Sequence[Mapping[str, str]]) -> Any:
        """Call the driver's DRA service as the kubelet does (``NodePrepareResources``/``NodeUnprepareResources``)."""
        return self.dra.call_driver(self.node.name, self.name, method, claims)

    def health(self, service: str = "v1alpha1.DRAResourceHealth") -> list[tuple[str, str, str]] | None:
        """What the driver's health stream of ``service`` reports first, (pool, device, health) each; ``None``: it
        does not serve it (UNIMPLEMENTED)."""
        return self.dra.driver_health(self.node.name, self.name, service)

    def listed_services(self) -> tuple[str, ...] | None:
        """What the driver lists in GetInfo (``supported_versions``): its DRA and health services; ``None`` when no
        registration socket answers for it."""
        return self.dra.driver_services(self.node.name, self.name)

    def wait_usable(self, timeout: float | None = None) -> None:
        """Wait until the kubelet has the driver registered and connected; stops at once when it exited."""
        wait_for(
            lambda: self.usable,
            bool,
            timeout=self.node.timeout if timeout is None else timeout,
            what=f"DRA driver {self.name} registered and connected on {self.node.name}",
            give_up=self.crashed,
        )


class ClaimHandle:
    """A ResourceClaim: its allocation (the scheduler's), reservation and what the node's kubelet prepared."""

    def __init__(self, rest: KubeRest, namespace: str, name: str, *, node: DRANodeHandle, timeout: float) -> None:
        self.rest = rest
        self.namespace = namespace
        self.name = name
        self.node = node
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"ClaimHandle({self.namespace}/{self.name})"

    @property
    def obj(self) -> dict[str, Any]:
        try:
            return self.rest.get(f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims/{self.name}")
        except RestError as exc:
            if exc.not_found:
                raise ObjectNotFoundError(str(exc)) from None
            raise

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"]["uid"])

    @property
    def allocation(self) -> dict[str, Any] | None:
        value = (self.obj.get("status") or {}).get("allocation")
        return None if value is None else dict(value)

    @property
    def allocated(self) -> list[AllocatedDevice]:
        """The devices the scheduler allocated (``status.allocation.devices.results``)."""
        return [
            AllocatedDevice.from_result(r) for r in ((self.allocation or {}).get("devices") or {}).get("results") or []
        ]

    @property
    def reserved_for(self) -> list[str]:
        """Names of the pods the claim is reserved for."""
        return [str(r.get("name")) for r in (self.obj.get("status") or {}).get("reservedFor") or []]

    def prepared(self) -> PreparedClaim | None:
        """What the node's kubelet checkpointed for this claim."""
        return self.node.prepared_claim(self.namespace, self.name)

    def wait_allocated(self, timeout: float | None = None) -> list[AllocatedDevice]:
        return wait_for(
            lambda: self.allocated,
            bool,
            timeout=self.timeout if timeout is None else timeout,
            what=f"ResourceClaim {self.namespace}/{self.name} allocated",
        )

    def delete(self) -> None:
        try:
            self.rest.delete(f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims/{self.name}")
        except RestError as exc:
            if not exc.not_found:
                raise


class ClaimPodHandle(PodHandle):
    """A pod using ResourceClaims; ``claims`` resolves the claims made from templates for it."""

    def __init__(
        self, backend: Backend, name: str, namespace: str, *, container: str, timeout: float, node: DRANodeHandle
    ) -> None:
        super().__init__(backend, name, namespace, container=container, resource_name="", timeout=timeout)
        self.node = node

    def claim_names(self) -> dict[str, str | None]:
        """Pod claim name -> the ResourceClaim it uses (``None`` while a template's claim is not made yet); the claim
        the scheduler made for the pod's DRA-backed extended resources is under :data:`EXTENDED_RESOURCE_CLAIM`."""
        pod = self.obj
        status = pod.get("status") or {}
        generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
        out: dict[str, str | None] = {}
        for c in (pod.get("spec") or {}).get("resourceClaims") or []:
            out[str(c["name"])] = c.get("resourceClaimName") or generated.get(c["name"])
        if extended := (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"):
            out[EXTENDED_RESOURCE_CLAIM] = str(extended)
        return out

    @property
    def claims(self) -> list[ClaimHandle]:
        return [
            ClaimHandle(self.node.dra.rest, self.namespace, n, node=self.node, timeout=self.timeout)
            for n in self.claim_names().values()
            if n
        ]

    @property
    def claim_health(self) -> dict[tuple[str, str], str]:
        """``allocatedResourcesStatus`` of the default container for claims: (``claim:<name>[/<request>]``, resourceID)
        -> health."""
        out: dict[tuple[str, str], str] = {}
        for entry in self.container_status().get("allocatedResourcesStatus") or []:
            if str(entry.get("name", "")).startswith("claim:"):
                for r in entry.get("resources") or []:
                    out[(str(entry["name"]), str(r.get("resourceID")))] = str(r.get("health"))
        return out

    @property
    def scheduled_condition(self) -> dict[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == "PodScheduled"), None)


def nested_spec_hint(pod: ClaimPodHandle, driver: DriverHandle) -> str:
    """Where the pod's CDI devices are defined only in a subdirectory of a CDI spec directory, say so: a runtime
    reads only the files directly in ``/etc/cdi`` and ``/var/run/cdi``, and refuses the container. ``""`` when not
    (or when the node cannot be read: a hint must not hide the failure it explains)."""
    try:
        ids = [i for c in pod.claims if (p := c.prepared()) is not None for i in p.cdi_device_ids(driver.name)]
        files = driver.node.cdi_spec_files(nested=True)
    except Exception:  # noqa: BLE001 - a hint must not hide the failure it explains
        return ""
    hints = []
    for cdi_id in ids:
        kind, _, name = cdi_id.partition("=")
        if any(
            kind.encode() in raw and name.encode() in raw
            for path, raw in files.items()
            if path.rsplit("/", 1)[0] in SPEC_DIRS
        ):
            continue
        for path, raw in sorted(files.items()):
            if kind.encode() in raw and name.encode() in raw:
                top = next(d for d in SPEC_DIRS if path.startswith(d + "/"))
                hints.append(
                    f"CDI device {cdi_id} is defined in {path}, a subdirectory of {top}: a runtime reads only the "
                    f"spec files directly in {' and '.join(SPEC_DIRS)}"
                )
                break
    return "; " + "; ".join(hints) if hints else ""


#: The key :meth:`ClaimPodHandle.claim_names` lists the scheduler's claim for the pod's extended resources under.
EXTENDED_RESOURCE_CLAIM = "<extended resources>"


class ClaimFactory:
    """Makes DeviceClasses, ResourceClaims, templates and pods using them for the driver under test; ``cleanup()``
    deletes them (pods first, so the claims are released before they go)."""

    _counter = itertools.count(1)

    def __init__(
        self,
        backend: Backend,
        driver: DriverHandle,
        *,
        timeout: float,
        prefix: str = "dra",
        namespace: str | None = None,
    ) -> None:
        self.backend = backend
        self.driver = driver
        self.rest = driver.dra.rest
        self.node = driver.node
        self.timeout = timeout
        self.prefix = dns_label(prefix, fallback="dra")
        self.namespace: str = namespace or str(getattr(backend, "pod_namespace", "default"))
        self._made: list[str] = []  # API paths, oldest first
        self.pods: list[tuple[str, str]] = []
        self._class: str | None = None

    def _name(self, kind: str) -> str:
        return f"{self.prefix}-{kind}-{next(self._counter)}"

    def _cluster_wide_name(self, kind: str) -> str:
        """A name for a cluster-scoped object: it carries the run's namespace, since runs may share a cluster (two
        DRA suites on nodes of their own both make ``<test>-class-1``)."""
        own = "" if self.namespace == "default" else f"-{self.namespace}"
        return self._name(kind) + own

    def _create(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        made = self.rest.create(collection, body)
        self._made.append(f"{collection}/{made['metadata']['name']}")
        return made

    def device_class(
        self,
        name: str | None = None,
        *,
        selectors: Sequence[Mapping[str, Any]] | None = None,
        extended_resource_name: str | None = None,
    ) -> str:
        """A DeviceClass selecting the driver's devices (and ``selectors``; ``extended_resource_name``: pods asking for
        that extended resource are served by it); its name."""
        body = device_class_manifest(
            name or self._cluster_wide_name("class"),
            self.driver.name,
            selectors,
            extended_resource_name=extended_resource_name,
        )
        return str(self._create(f"{RESOURCE_API}/deviceclasses", body)["metadata"]["name"])

    @property
    def default_class(self) -> str:
        """One DeviceClass of the driver's devices, made at first use."""
        if self._class is None:
            self._class = self.device_class()
        return self._class

    def claim(
        self,
        name: str | None = None,
        *,
        count: int = 1,
        device_class: str | None = None,
        requests: Sequence[Mapping[str, Any]] | None = None,
        selectors: Sequence[Mapping[str, Any]] | None = None,
        tolerations: Sequence[Mapping[str, str]] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> ClaimHandle:
        """A ResourceClaim for ``count`` of the driver's devices, tolerating ``tolerations`` of device taints (or
        ``requests`` as given); ``config``: the driver's opaque parameters for it (e.g. NVIDIA's ``GpuConfig``)."""
        opaque = {self.driver.name: config} if config is not None else None
        body = claim_manifest(
            name or self._name("claim"),
            self.namespace,
            device_class or self.default_class,
            count=count,
            requests=requests,
            selectors=selectors,
            tolerations=tolerations,
            config=opaque,
        )
        made = self._create(f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims", body)
        return ClaimHandle(self.rest, self.namespace, made["metadata"]["name"], node=self.node, timeout=self.timeout)

    def taint_rule(self, pool: str, taint: Mapping[str, str]) -> str:
        """A DeviceTaintRule putting ``taint`` on the driver's devices in ``pool``; its name (``untaint`` removes it,
        ``cleanup`` too)."""
        body = device_taint_rule_manifest(self._cluster_wide_name("taint"), self.driver.name, pool, taint)
        return str(self._create(f"{RESOURCE_API}/devicetaintrules", body)["metadata"]["name"])

    def untaint(self, rule: str) -> None:
        """Delete DeviceTaintRule ``rule``."""
        self.rest.delete(f"{RESOURCE_API}/devicetaintrules/{rule}")

    def template(
        self,
        name: str | None = None,
        *,
        count: int = 1,
        device_class: str | None = None,
        requests: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """A ResourceClaimTemplate; its name."""
        body = template_manifest(
            name or self._name("template"),
            self.namespace,
            device_class or self.default_class,
            count=count,
            requests=requests,
        )
        return str(
            self._create(f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaimtemplates", body)["metadata"]["name"]
        )

    def manifest(
        self,
        claims: Sequence[ClaimHandle | str] = (),
        templates: Sequence[str] = (),
        *,
        name: str | None = None,
        containers: int = 1,
        node: str | None = None,
        image: str = DEFAULT_IMAGE,
        same_names: bool = False,
        limits: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """A pod whose containers each use every claim (by name) and template given, pinned to the node by nodeSelector
        (the scheduler allocates the claims). The claims' entries in the pod are ``c0``, ``c1``, ... (templates ``t0``,
        ...); ``same_names``: each claim's entry is named as the claim, as a kubelet 1.34 reports a claim's device
        health (``allocatedResourcesStatus``) only for an entry named like the ResourceClaim. ``limits``: extended
        resources each container asks for (served by a DeviceClass naming them)."""
        names = [c.name if isinstance(c, ClaimHandle) else c for c in claims]
        pod_claims = [{"name": n if same_names else f"c{i}", "resourceClaimName": n} for i, n in enumerate(names)]
        pod_claims += [{"name": f"t{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
        refs = [{"name": c["name"]} for c in pod_claims]
        target = node or self.node.name
        spec: dict[str, Any] = {
            "containers": [
                {
                    "name": "main" if i == 0 else f"c{i}",
                    "image": image,
                    "command": ["sleep", "3600"],
                    "resources": {
                        "claims": refs,
                        **({"limits": {k: str(v) for k, v in limits.items()}} if limits else {}),
                    },
                }
                for i in range(containers)
            ],
            "resourceClaims": pod_claims,
            "nodeSelector": {"kubernetes.io/hostname": target},
            "terminationGracePeriodSeconds": 1,
        }
        if tolerations := node_tolerations(self.backend.get_node(target), states=True):
            spec["tolerations"] = tolerations
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name or self._name("pod"), "namespace": self.namespace},
            "spec": spec,
        }

    def pod(
        self,
        claims: Sequence[ClaimHandle | str] = (),
        templates: Sequence[str] = (),
        *,
        manifest: Mapping[str, Any] | None = None,
        wait: bool = False,
        **kwargs: Any,
    ) -> ClaimPodHandle:
        """Create a pod using ``claims`` / ``templates`` (none given: a new claim for one device); ``wait``: until it
        runs."""
        if manifest is None and not claims and not templates:
            claims = [self.claim()]
        body = dict(manifest) if manifest is not None else self.manifest(claims, templates, **kwargs)
        created = self.backend.create_pod(body)
        name, namespace = created["metadata"]["name"], created["metadata"].get("namespace", self.namespace)
        self.pods.append((name, namespace))
        app = (body.get("spec") or {}).get("containers") or [{"name": "main"}]
        pod = ClaimPodHandle(
            self.backend, name, namespace, container=str(app[0]["name"]), timeout=self.timeout, node=self.node
        )
        if wait:
            try:
                pod.wait_running()
            except AssertionError as exc:
                if hint := nested_spec_hint(pod, self.driver):
                    exc.args = (f"{exc.args[0]}{hint}", *exc.args[1:])
                raise
        return pod

    def cleanup(self) -> list[str]:
        """Delete every pod and object made here (newest first); the errors, one per object not deleted."""
        errors = []
        for name, ns in reversed(self.pods):
            try:
                self.backend.delete_pod(name, ns)
            except ObjectNotFoundError:
                continue
            except Exception as exc:  # noqa: BLE001 - cleanup must not stop at the first
                errors.append(f"pod {ns}/{name}: {exc}")
        for path in reversed(self._made):
            try:
                self.rest.delete(path)
            except RestError as exc:
                if not exc.not_found:
                    errors.append(f"{path}: {exc}")
        self.pods.clear()
        self._made.clear()
        self._class = None
        return errors
