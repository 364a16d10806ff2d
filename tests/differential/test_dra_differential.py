"""DRA side by side: the embedded kubelet (with the real control plane) and kind's kubelet 1.34, one included driver
(``devplug-gpu-plugin --dra`` on the mock NVML) on each, compared by what the API server, the kubelet's
``dra_manager_state`` and the container show for the same claim.

What differs by nature (node, namespace, claim and pod names and UIDs, generated slice names) is replaced by
placeholders before comparing; the allocated device too, as each scheduler picks its own free GPU. What still
differs, and why, is the table in docs/guides/backends.md ("DRA on kind"); nothing here hides it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_devplug.backends.base import BackendOptions, NodeSpec
from pytest_devplug.backends.dra import DriverSpec, dra_of
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.dra.assertions import assert_claim_prepared, assert_driver_registered, assert_slices_published
from pytest_devplug.dra.handles import ClaimFactory, ClaimHandle, ClaimPodHandle, DRANodeHandle, DriverHandle
from pytest_devplug.dra.plugin import get_dra_settings
from pytest_devplug.plugin import NODE_NAME
from pytest_devplug.settings import DevplugSettings
from pytest_devplug.kubeletmodel import dracheckpoint as dra_cp

from ..support import control_plane_bin_dir, wait_until
from .diff_helpers import kind_required

pytestmark = pytest.mark.kind


@dataclass
class DRASide:
    """One backend's driver and a claim factory on its node."""

    name: str
    driver: DriverHandle
    claims: ClaimFactory


@pytest.fixture(scope="module")
def _sim_driver(pytestconfig: pytest.Config, devplug_settings: DevplugSettings) -> Iterator[DriverHandle]:
    if devplug_settings.backend != "kind":
        reason = "the DRA differential compares against kind: run it with --devplug-backend kind"
        if kind_required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    settings = get_dra_settings(pytestconfig)
    if not settings.included:
        pytest.skip("the DRA differential runs the included driver on both sides (a driver option was given)")
    timeout = devplug_settings.backend_options.timeout
    backend = SimBackend(
        BackendOptions(control_plane="real", k8s_bin_dir=str(control_plane_bin_dir()), timeout=timeout)
    )
    backend.start()
    try:
        dra = dra_of(backend)
        name = backend.ensure_node(NodeSpec(NODE_NAME))
        node = DRANodeHandle(backend, dra, name, timeout=timeout, reregistration_timeout=40.0)
        spec: DriverSpec = settings.driver
        dra.deploy_driver(name, spec)
        driver = DriverHandle(node, spec)
        assert_driver_registered(driver)
        assert_slices_published(driver)
        yield driver
    finally:
        backend.close()


@pytest.fixture
def dra_sides(
    _sim_driver: DriverHandle,
    devplug_driver: DriverHandle,
    devplug_claims: ClaimFactory,
    request: pytest.FixtureRequest,
) -> Iterator[tuple[DRASide, DRASide]]:
    """(sim, kind) for one scenario; what the sim side made is deleted after it, as devplug_claims does on kind."""
    sim_claims = ClaimFactory(
        _sim_driver.node.backend, _sim_driver, timeout=_sim_driver.node.timeout, prefix=request.node.name
    )
    try:
        yield DRASide("sim", _sim_driver, sim_claims), DRASide("kind", devplug_driver, devplug_claims)
    finally:
        errors = sim_claims.cleanup()
        assert not errors, f"the sim side could not delete {errors}"


def _placeholders(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each concrete value replaced by its placeholder (longest first: a UID inside a CDI name too)."""
    for value in sorted(values, key=len, reverse=True):
        if value:
            text = text.replace(value, values[value])
    return text


def _slices(side: DRASide) -> list[dict[str, Any]]:
    """The driver's slices of its node as a user reads them, names that differ by nature replaced."""
    node = side.driver.node.name
    out = []
    for s in side.driver.slices():
        meta, spec = s.raw.get("metadata") or {}, s.raw.get("spec") or {}
        doc = {
            "generateName": meta.get("generateName"),
            "owners": sorted(
                (o.get("kind"), o.get("name"), bool(o.get("controller"))) for o in meta.get("ownerReferences") or []
            ),
            "spec": spec,
        }
        out.append(json.loads(_placeholders(json.dumps(doc, sort_keys=True), {node: "<node>"})))
    return out


def test_dra_slices_read_the_same(dra_sides: tuple[DRASide, DRASide]) -> None:
    """The driver publishes the same ResourceSlice for its node on both: one pool named after the node, owned by
    the Node, the same devices with the same attributes and capacity."""
    sim, kind = (_slices(s) for s in dra_sides)
    assert sim == kind, f"sim publishes {sim}\nkind publishes {kind}"
    assert len(kind) == 1 and [o[:2] for o in kind[0]["owners"]] == [["Node", "<node>"]], kind


@dataclass
class _Claimed:
    """A claim for one GPU prepared for a running pod on one side."""

    pod: ClaimPodHandle
    claim: ClaimHandle
    #: its ``dra_manager_state`` entry, placeholders in
    entry: dict[str, Any]
    #: concrete value -> placeholder
    values: dict[str, str]


def _claimed(side: DRASide) -> _Claimed:
    claim = side.claims.claim()
    pod = side.claims.pod([claim], wait=True)
    (prepared,) = assert_claim_prepared(pod, side.driver)
    (device,) = claim.allocated
    attrs = next(s.device(device.device) for s in side.driver.slices() if device.device in s.devices)["attributes"]
    values = {
        side.driver.node.name: "<node>",
        claim.namespace: "<ns>",
        claim.name: "<claim>",
        prepared.claim_uid: "<claim-uid>",
        pod.uid: "<pod-uid>",
        str(attrs["uuid"]["string"]): "<uuid>",
        device.device: "<device>",
        f"nvidia{attrs['minor']['int']}": "nvidia<minor>",
    }
    return _Claimed(pod, claim, _entry(side, prepared.claim_uid, values), values)


def _entry(side: DRASide, claim_uid: str, values: Mapping[str, str]) -> dict[str, Any]:
    """The claim's entry in the kubelet's ``dra_manager_state`` (whose checksum must verify), placeholders in."""
    raw = side.driver.dra.read_dra_checkpoint(side.driver.node.name)
    assert raw is not None, f"{side.name}: no dra_manager_state"
    decoded = dra_cp.decode(raw)
    assert decoded.stored == decoded.computed, (
        f"{side.name}: dra_manager_state checksum {decoded.stored} != {decoded.computed}"
    )
    entries = [e for e in json.loads(decoded.data)["ClaimInfoStateList"] or [] if e["ClaimUID"] == claim_uid]
    assert len(entries) == 1, f"{side.name}: dra_manager_state has {len(entries)} entries for claim {claim_uid}"
    return dict(json.loads(_placeholders(json.dumps(entries[0]), values)))


def test_dra_claim_checkpointed_the_same_way(dra_sides: tuple[DRASide, DRASide]) -> None:
    """A claim for one GPU: both kubelets checkpoint the same entry in ``dra_manager_state`` (claim, pod, the
    driver's device with its request and CDI IDs), upstream's format, checksum right."""
    sim, kind = (_claimed(s).entry for s in dra_sides)
    assert sim == kind, f"sim checkpoints {sim}\nkind checkpoints {kind}"


def _container(c: _Claimed) -> dict[str, Any]:
    """What the runtime gives the container (the view: CDI names resolved from the driver's spec files) and what
    the container shows (its env and /dev, run in it)."""
    view = c.pod.view()
    doc = {
        "cdi_devices": sorted(view.cdi_devices),
        "envs": dict(sorted(view.envs.items())),
        "device_nodes": sorted((d.container_path, d.permissions) for d in view.devices),
        "mounts": sorted((m.container_path, m.read_only) for m in view.mounts),
        "shown_env": c.pod.exec("printenv", "NVIDIA_VISIBLE_DEVICES").stdout.strip(),
        "shown_dev": sorted(d for d in c.pod.exec("ls", "/dev").stdout.split() if d.startswith("nvidia")),
    }
    return dict(json.loads(_placeholders(json.dumps(doc, sort_keys=True), c.values)))


def test_dra_container_sees_the_same(dra_sides: tuple[DRASide, DRASide]) -> None:
    """The claim's container gets the same CDI devices, resolved from the spec the driver wrote to the same env
    (``NVIDIA_VISIBLE_DEVICES`` = the allocated GPU's UUID) and device nodes (its ``/dev/nvidia<minor>``, the control
    devices); and it shows them: its env and ``/dev`` as the process inside sees them."""
    sim, kind = (_container(_claimed(s)) for s in dra_sides)
    assert sim == kind, f"sim's container: {sim}\nkind's container: {kind}"
    assert kind["shown_env"] == "<uuid>" and "nvidia<minor>" in kind["shown_dev"], kind


def _restart_then_delete(side: DRASide) -> None:
    c = _claimed(side)
    node = side.driver.node
    uid = next(k for k, v in c.values.items() if v == "<claim-uid>")
    side.driver.mark_changed()  # the restarted kubelet wipes the node's slices: the session's driver is restarted after
    node.restart_kubelet()
    assert_driver_registered(side.driver, node.reregistration_timeout)
    assert _entry(side, uid, c.values) == c.entry, f"{side.name}: the claim's entry changed across the kubelet restart"
    assert c.pod.phase == "Running", f"{side.name}: the pod is {c.pod.phase} after the kubelet restart"
    since = len(node.dra_calls())
    c.pod.delete()
    wait_until(
        f"{side.name}: the claim unprepared after its pod was deleted",
        lambda: [
            x for x in node.dra_calls("NodeUnprepareResources", since=since) if uid in x.claim_uids and not x.error
        ],
        timeout=node.timeout,
        interval=0.5,
    )
    wait_until(
        f"{side.name}: the claim gone from dra_manager_state",
        c.claim.prepared,
        lambda p: p is None,
        timeout=node.timeout,
        interval=0.5,
    )


def test_dra_checkpoint_kept_across_a_kubelet_restart_and_the_claim_unprepared_after(
    dra_sides: tuple[DRASide, DRASide],
) -> None:
    """With the pod running, a kubelet restart leaves its checkpoint entry as it was on both, the pod keeps running,
    and deleting the pod afterwards unprepares the claim (the new kubelet knows it only from the checkpoint): the
    entry goes on both."""
    for side in dra_sides:
        _restart_then_delete(side)
