"""The device-taint check fails a cluster whose scheduler does not honour DeviceTaintRules.

An upgrade runs kube-apiserver 1.37 (DeviceTaintRules GA, served) beside a kube-scheduler still on 1.36, where
DRADeviceTaintRules is off: the rules are stored but the scheduler hands the tainted devices out. Here that
scheduler is the 1.37 one with the gate off (a wrapper adds ``--feature-gates=DRADeviceTaintRules=false``), the
API server and kube-controller-manager as the release has them, and the correct widget driver: the check must
fail, naming the tainted device it saw allocated.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.backends.base import BackendOptions, NodeSpec
from pytest_devplug.backends.dra import DriverSpec, dra_of
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.dra.assertions import assert_driver_registered, assert_slices_published
from pytest_devplug.dra.conformance import test_scheduling
from pytest_devplug.dra.handles import ClaimFactory, DRANodeHandle, DriverHandle

from ..support import control_plane_binaries

WIDGET = Path(__file__).resolve().parents[1] / "fixture_plugins" / "dra_widget.py"


@pytest.fixture(scope="module")
def skewed_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimBackend]:
    scheduler = control_plane_binaries()["kube-scheduler"]
    bin_dir = tmp_path_factory.mktemp("skewed-bin")
    wrapper = bin_dir / "kube-scheduler"
    wrapper.write_text(
        f'#!/bin/sh\nexec {shlex.quote(str(scheduler))} "$@" --feature-gates=DRADeviceTaintRules=false\n'
    )
    wrapper.chmod(0o755)
    backend = SimBackend(BackendOptions(control_plane="real", k8s_bin_dir=str(bin_dir), timeout=20.0))
    backend.start()
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def widget(skewed_backend: SimBackend) -> Iterator[DriverHandle]:
    node_name = skewed_backend.ensure_node(NodeSpec("skewed"))
    dra = dra_of(skewed_backend)
    spec = DriverSpec(
        driver_name="skew.devplug.example", argv=[sys.executable, str(WIDGET), "--driver-name", "skew.devplug.example"]
    )
    dra.deploy_driver(node_name, spec)
    try:
        driver = DriverHandle(
            DRANodeHandle(skewed_backend, dra, node_name, timeout=20.0, reregistration_timeout=40.0), spec
        )
        assert_driver_registered(driver)
        assert_slices_published(driver)
        yield driver
    finally:
        dra.remove_driver(node_name)


def test_taint_check_fails_a_scheduler_that_ignores_device_taint_rules(
    skewed_backend: SimBackend, widget: DriverHandle
) -> None:
    factory = ClaimFactory(skewed_backend, widget, timeout=20.0, prefix="skew")
    try:
        with pytest.raises(AssertionError) as failure:
            test_scheduling.test_device_taint_keeps_claims_off_tainted_devices(factory, widget)
    finally:
        assert not factory.cleanup()
    text = str(failure.value)
    assert "the scheduler allocated" in text and "does not tolerate" in text, (
        f"the check failed, but not naming the bug: {text}"
    )
