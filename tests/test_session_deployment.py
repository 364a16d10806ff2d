"""The plugin fixtures and the DRA fixtures keep what they test through one class, ``SessionDeployment``: the same
error after a failed start, the same kubelet recovery, the same restore rules (judged on each side's real
``Deployable`` over a fake node); and the helpers both sides share (DNS-label prefixes, ``fault``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

import pytest

from pytest_devplug.backends.base import Backend, PluginSpec, PodResourcesDevices
from pytest_devplug.backends.dra import DRABackend, DriverSpec
from pytest_devplug.conformance import _support as plugin_support
from pytest_devplug.deployment import SessionDeployment
from pytest_devplug.dra.conformance import _support as dra_support
from pytest_devplug.dra.handles import ClaimFactory, DRANodeHandle, DriverHandle
from pytest_devplug.dra.plugin import driver_deployment
from pytest_devplug.errors import FaultNotSupportedError, PluginNotReadyError
from pytest_devplug.handles import ClusterHandle, PodFactory, dns_label
from pytest_devplug.plugin import plugin_deployment

RES = "example.com/gpu"
DRIVER = "gpu.example.com"
#: The fake node answers at once; a wait that is not satisfied at once is a bug of the fake or of the deployment.
TIMEOUT = 2.0


class FakeNode:
    """One node as both sides' handles ask it (a ``Backend`` for the plugin, a ``DRABackend`` and its API for the
    driver): its kubelet and the one plugin or driver on it. ``calls`` records what was done to them, in order."""

    name = "n1"

    def __init__(self) -> None:
        self.kubelet = True
        self.running = False
        #: What the plugin lists or the driver publishes while it runs as deployed.
        self.devices = ("gpu-0", "gpu-1")
        self.listed: tuple[str, ...] = ()
        self.calls: list[str] = []

    # -- the kubelet: a start deletes the node's slices and forgets the plugin's devices -------------------------
    def kubelet_running(self, node: str) -> bool:
        return self.kubelet

    def stop_kubelet(self, node: str) -> None:
        self.kubelet = False

    def start_kubelet(self, node: str) -> None:
        self.calls.append("start_kubelet")
        self.kubelet, self.listed = True, ()

    # -- the plugin or driver --------------------------------------------------------------------------------
    def _deploy(self, node: str, spec: object) -> None:
        self.calls.append("deploy")
        self._start(node)

    def _remove(self, node: str) -> None:
        self.calls.append("remove")
        self.running, self.listed = False, ()

    def _start(self, node: str) -> None:
        self.calls.append("start")
        self.running, self.listed = True, self.devices if self.kubelet else ()

    def _stop(self, node: str) -> None:
        self.calls.append("stop")
        self.running = False

    def _running(self, node: str) -> bool:
        return self.running

    def _exit(self, node: str) -> str | None:
        return None

    deploy_plugin = deploy_driver = _deploy
    remove_plugin = remove_driver = _remove
    start_plugin = start_driver = _start
    stop_plugin = stop_driver = _stop
    plugin_running = driver_running = _running
    plugin_exit = driver_exit = _exit

    # -- what the kubelet and the API server show --------------------------------------------------------------
    def get_node(self, name: str) -> dict[str, Any]:
        n = str(len(self.listed))
        return {"metadata": {"name": name}, "status": {"capacity": {RES: n}, "allocatable": {RES: n}}}

    def allocatable_devices(self, node: str) -> list[PodResourcesDevices]:
        return [PodResourcesDevices(RES, self.listed)]

    def driver_usable(self, node: str, driver: str) -> bool:
        return self.running and self.kubelet

    @property
    def rest(self) -> FakeNode:
        return self

    def items(self, path: str, **query: str) -> list[dict[str, Any]]:
        """The node's ResourceSlices (one pool, one slice)."""
        pool = {"name": self.name, "generation": 1, "resourceSliceCount": 1}
        spec = {"driver": DRIVER, "nodeName": self.name, "pool": pool, "devices": [{"name": d} for d in self.listed]}
        return [{"metadata": {"name": f"{self.name}-slice"}, "spec": spec}] if self.listed else []


def plugin_side(node: FakeNode) -> SessionDeployment[Any]:
    cluster = ClusterHandle(cast(Backend, node), timeout=TIMEOUT)
    return plugin_deployment(cluster, cluster.node(node.name), PluginSpec(resource_name=RES))


def driver_side(node: FakeNode) -> SessionDeployment[Any]:
    handle = DRANodeHandle(
        cast(Backend, node), cast(DRABackend, node), node.name, timeout=TIMEOUT, reregistration_timeout=TIMEOUT
    )
    return driver_deployment(handle, DriverSpec(driver_name=DRIVER))


SIDES: dict[str, Callable[[FakeNode], SessionDeployment[Any]]] = {"plugin": plugin_side, "driver": driver_side}


@pytest.fixture(params=sorted(SIDES))
def side(request: pytest.FixtureRequest) -> tuple[FakeNode, SessionDeployment[Any]]:
    node = FakeNode()
    return node, SIDES[request.param](node)


def test_a_failed_start_fails_every_later_test_with_one_error(
    side: tuple[FakeNode, SessionDeployment[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test whose set-up waited reports the failure itself; the next ones fail at once with PluginNotReadyError
    pointing there, without deploying or waiting again."""
    node, deployment = side

    def never_ready(handle: object) -> None:
        raise AssertionError("never registered\nmore detail")

    monkeypatch.setattr(deployment.subject, "wait_ready", never_ready)
    with pytest.raises(AssertionError, match="never registered") as first:
        deployment.get("test_first")
    assert not isinstance(first.value, PluginNotReadyError), "the first test must report the failure itself"
    with pytest.raises(PluginNotReadyError) as later:
        deployment.get("test_second")
    what = deployment.subject.what
    assert str(later.value) == f"{what} did not come up (reported in full in test_first): never registered", later.value
    assert node.calls == ["deploy", "start"], f"deployed or waited for again after the failure: {node.calls}"


def test_a_kubelet_left_stopped_is_started_before_the_redeploy(side: tuple[FakeNode, SessionDeployment[Any]]) -> None:
    """A test that faulted the devices and failed with the kubelet down: the kubelet runs again before the redeploy
    (a deployment on a stopped kubelet never comes up)."""
    node, deployment = side
    handle = deployment.get("test_one")
    node.calls.clear()
    handle.mark_changed(devices=True)
    deployment.node.stop_kubelet()
    try:
        deployment.reset_if_needed("test_one")
    finally:  # on a stopped kubelet the redeploy's wait fails: say why first
        assert node.calls[:1] == ["start_kubelet"], f"redeployed with the kubelet stopped: {node.calls}"
    assert node.calls == ["start_kubelet", "remove", "deploy", "start"], node.calls
    assert node.kubelet and deployment.ready and deployment.get("test_two") is not handle


def test_a_stopped_one_is_started_again_not_redeployed(side: tuple[FakeNode, SessionDeployment[Any]]) -> None:
    node, deployment = side
    handle = deployment.get("test_one")
    handle.stop()
    node.calls.clear()
    deployment.reset_if_needed("test_one")
    assert node.calls == ["start"], node.calls
    assert deployment.get("test_two") is handle


def test_one_running_but_not_as_it_came_up_is_restarted(side: tuple[FakeNode, SessionDeployment[Any]]) -> None:
    """The test restarted the kubelet, which forgot the devices (deleted the slices): restarting what runs brings
    them back at once; no redeploy."""
    node, deployment = side
    handle = deployment.get("test_one")
    deployment.node.stop_kubelet()
    deployment.node.start_kubelet()
    node.calls.clear()
    deployment.reset_if_needed("test_one")
    assert node.calls == ["stop", "start"], node.calls
    assert node.listed == node.devices and deployment.get("test_two") is handle


def test_an_unchanged_one_is_left_alone(side: tuple[FakeNode, SessionDeployment[Any]]) -> None:
    node, deployment = side
    handle = deployment.get("test_one")
    node.calls.clear()
    deployment.reset_if_needed("test_one")
    assert node.calls == [] and deployment.get("test_two") is handle


def test_one_never_waited_for_is_left_for_the_next_test(side: tuple[FakeNode, SessionDeployment[Any]]) -> None:
    """A registration check's deployment (``*_started``): the next test waits for it, as deployed."""
    node, deployment = side
    handle = deployment.started()
    deployment.reset_if_needed("test_registers")
    assert node.calls == ["deploy", "start"] and deployment.get("test_next") is handle


def test_one_never_waited_for_and_changed_is_deployed_afresh(side: tuple[FakeNode, SessionDeployment[Any]]) -> None:
    """A registration check that stopped it: removed, and deployed afresh for the next test (not waited for as
    stopped)."""
    node, deployment = side
    handle = deployment.started()
    handle.stop()
    deployment.reset_if_needed("test_registers")
    assert node.calls == ["deploy", "start", "stop", "remove"], node.calls
    assert deployment.get("test_next") is not handle and node.calls[4:] == ["deploy", "start"], node.calls


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
NAMES = ["Test Thing[1]", "test_a[" + "x" * 80 + "-]", "test_ümlaut[-1-]", "___", "", "a" * 39 + "-b"]


@pytest.mark.parametrize("name", NAMES)
def test_pod_and_claim_names_are_dns_labels_whatever_the_test_is_called(name: str) -> None:
    """Both factories name objects ``<prefix>-<kind>-<n>`` from the test's name: the prefix must be a DNS label that
    leaves room for the suffix within 63 characters."""
    for prefix in (dns_label(name, fallback="devplug"), dns_label(name, fallback="dra")):
        assert DNS_LABEL.fullmatch(prefix) and len(prefix) <= 40, f"{name!r} -> {prefix!r}"
    pods = PodFactory(cast(Backend, FakeNode()), node="n1", resource_name=RES, timeout=TIMEOUT, prefix=name)
    node = DRANodeHandle(
        cast(Backend, FakeNode()), cast(DRABackend, FakeNode()), "n1", timeout=TIMEOUT, reregistration_timeout=TIMEOUT
    )
    claims = ClaimFactory(
        cast(Backend, FakeNode()), DriverHandle(node, DriverSpec(driver_name=DRIVER)), timeout=TIMEOUT, prefix=name
    )
    for made in (pods.manifest(1)["metadata"]["name"], claims.manifest()["metadata"]["name"]):
        assert DNS_LABEL.fullmatch(made) and len(made) <= 63, f"{name!r} -> {made!r}"


@pytest.mark.parametrize(
    ("support", "injector"), [(plugin_support, "fault injector"), (dra_support, "DRA fault injector")]
)
def test_a_fault_the_injector_cannot_make_skips_naming_it(support: Any, injector: str) -> None:
    with pytest.raises(pytest.skip.Exception, match=f"^the {injector} cannot remove a device: soldered on$"):
        with support.fault("remove a device"):
            raise FaultNotSupportedError("soldered on")
    with pytest.raises(ValueError, match="not a fault"), support.fault("remove a device"):
        raise ValueError("not a fault")
