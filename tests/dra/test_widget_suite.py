"""The DRA suite judged on a driver whose faults we control (``tests/fixture_plugins/dra_widget.py``).

A downstream project (its own conftest: the driver spec and a ``DRAFaultInjector`` over the driver's control
file) runs ``from pytest_devplug.dra.conformance.suite import *``; on one shared control plane, every fault check
passes on the correct driver (the others pass on dra-example-driver: ``tests/peers/test_dra_example.py``), and
broken variants of the driver fail exactly the check about their bug, with a message naming it: the suite can
fail, and says why.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_devplug.backends.base import BackendOptions, NodeSpec
from pytest_devplug.backends.dra import DriverSpec, dra_of
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.controlplane.binaries import cache_root
from pytest_devplug.deployment import SessionDeployment
from pytest_devplug.dra.assertions import assert_driver_registered, assert_slices_published
from pytest_devplug.dra.conformance import (
    test_device_status,
    test_faults,
    test_prepare,
    test_registration,
    test_restarts,
    test_scheduling,
    test_slices,
)
from pytest_devplug.dra.handles import ClaimFactory, DRANodeHandle, DriverHandle
from pytest_devplug.dra.plugin import driver_deployment
from pytest_devplug.dra.resyncwatch import ResyncWatch, assert_slices_back_after_an_update_then_a_kubelet_start
from pytest_devplug.handles import ClusterHandle

from ..support import control_plane_bin_dir, parse_junit

pytest_plugins = ["pytester"]

WIDGET = Path(__file__).resolve().parents[1] / "fixture_plugins" / "dra_widget.py"
DRIVER = "dra.devplug.example"
#: The suite on the widget: control plane start plus ~25 checks, each a second or two on a quiet machine.
SUITE_TIMEOUT_S = 600

CONFTEST = f"""
import json, sys
from pathlib import Path
import pytest
from pytest_devplug.dra import DriverSpec

CONTROL = Path(__file__).parent / "control.json"


@pytest.fixture(scope="session")
def devplug_driver_spec():
    CONTROL.write_text("{{}}")
    return DriverSpec(driver_name={DRIVER!r}, argv=[sys.executable, {str(WIDGET)!r}, "--control", str(CONTROL)])


class WidgetFaults:
    \"\"\"The DRAFaultInjector of the widget: edits its control file.\"\"\"
    def __init__(self, driver):
        self.driver = driver
    def _edit(self, **kw):
        doc = json.loads(CONTROL.read_text() or "{{}}")
        doc.update(kw)
        CONTROL.write_text(json.dumps(doc))
    @property
    def devices(self):
        return self.driver.devices()
    def set_unhealthy(self, pool, device):
        doc = json.loads(CONTROL.read_text() or "{{}}")
        self._edit(unhealthy=sorted(set(doc.get("unhealthy", [])) | {{device}}))
    def set_healthy(self, pool, device):
        doc = json.loads(CONTROL.read_text() or "{{}}")
        self._edit(unhealthy=sorted(set(doc.get("unhealthy", [])) - {{device}}))
    def fail_prepare(self, fail=True):
        self._edit(fail_prepare=fail)
    def fail_unprepare(self, fail=True):
        self._edit(fail_unprepare=fail)


@pytest.fixture
def devplug_dra_faults(devplug_driver):
    yield WidgetFaults(devplug_driver)
    CONTROL.write_text("{{}}")
"""


@pytest.fixture(scope="module")
def real_cache() -> Path:
    return cache_root()


@pytest.fixture(scope="module")
def k8s_bin_dir() -> Path:
    return control_plane_bin_dir()


def test_downstream_project_runs_the_suite_with_its_driver_and_injector(
    pytester: pytest.Pytester, real_cache: Path, k8s_bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its conftest's ``devplug_driver_spec`` and ``devplug_dra_faults`` are the ones the suite uses (a registration
    check and a fault check, selected: every check runs on the widget below, on one control plane)."""
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(real_cache))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_dra_conformance="from pytest_devplug.dra.conformance.suite import *  # noqa: F403\n",
        test_own=(
            "def test_own_check_fails(devplug_driver):\n"
            "    assert not devplug_driver.devices(), 'a failure of its own'\n"
        ),
    )
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--devplug-control-plane",
        "real",
        f"--devplug-k8s-bin-dir={k8s_bin_dir}",
        f"--junitxml={junit}",
        "-rfEs",
        "-k",
        "test_driver_registers_with_the_kubelet or test_failed_prepare_keeps_pod_pending or test_own_check_fails",
        timeout=SUITE_TIMEOUT_S,
    )
    output = "\n".join(result.outlines[-80:])
    assert junit.exists(), output
    verdicts = parse_junit(junit).verdicts()
    assert verdicts == {
        "test_driver_registers_with_the_kubelet": "passed",
        "test_failed_prepare_keeps_pod_pending_then_runs": "passed",
        "test_own_check_fails": "failed",
    }, f"{json.dumps(verdicts, indent=1)}\n{output}"
    # a check of its own that fails with a plain assert gets the driver's evidence in its report
    text = result.stdout.str()
    for section in (
        "devplug: driver log",
        "devplug: kubelet DRA calls",
        "devplug: resource slices",
        "devplug: dra_manager_state",
    ):
        assert section in text, f"no {section!r} section in the failure report:\n{text[-4000:]}"


# -- broken drivers, one check each, on one control plane -----------------------------------------


@pytest.fixture(scope="module")
def real_backend(k8s_bin_dir: Path) -> Iterator[SimBackend]:
    backend = SimBackend(BackendOptions(control_plane="real", k8s_bin_dir=str(k8s_bin_dir), timeout=20.0))
    backend.start()
    yield backend
    backend.close()


@pytest.fixture
def broken_driver(
    real_backend: SimBackend, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[str], DriverHandle]]:
    """Deploys the widget with ``--break <variant>`` (and a control file: :func:`_faults`) on a node of its own;
    removes it afterwards."""
    made: list[str] = []

    def deploy(variant: str, *extra: str) -> DriverHandle:
        node_name = real_backend.ensure_node(NodeSpec(f"broken-{len(made)}-{abs(hash(request.node.name)) % 10000}"))
        dra = dra_of(real_backend)
        node = DRANodeHandle(real_backend, dra, node_name, timeout=20.0, reregistration_timeout=40.0)
        control = tmp_path / f"control-{len(made)}.json"
        control.write_text("{}")
        spec = DriverSpec(
            driver_name=f"{variant}.devplug.example",
            argv=[
                sys.executable,
                str(WIDGET),
                "--break",
                variant,
                "--driver-name",
                f"{variant}.devplug.example",
                "--control",
                str(control),
                *extra,
            ],
        )
        dra.deploy_driver(node_name, spec)
        made.append(node_name)
        driver = DriverHandle(node, spec)
        assert_driver_registered(driver)
        assert_slices_published(driver)
        return driver

    yield deploy
    for name in made:
        dra_of(real_backend).remove_driver(name)


class WidgetFaults:
    """The widget's DRAFaultInjector, editing its control file (the conftest above does the same downstream)."""

    def __init__(self, driver: DriverHandle, control: Path) -> None:
        self.driver, self.control = driver, control

    def _edit(self, **kw: Any) -> None:
        doc = json.loads(self.control.read_text() or "{}")
        doc.update(kw)
        self.control.write_text(json.dumps(doc))

    @property
    def devices(self) -> list[tuple[str, str]]:
        return self.driver.devices()

    def set_unhealthy(self, pool: str, device: str) -> None:
        self._edit(unhealthy=sorted({*json.loads(self.control.read_text() or "{}").get("unhealthy", []), device}))

    def set_healthy(self, pool: str, device: str) -> None:
        self._edit(unhealthy=sorted({*json.loads(self.control.read_text() or "{}").get("unhealthy", [])} - {device}))

    def fail_prepare(self, fail: bool = True) -> None:
        self._edit(fail_prepare=fail)

    def fail_unprepare(self, fail: bool = True) -> None:
        self._edit(fail_unprepare=fail)


@pytest.fixture(scope="module")
def widget(
    real_backend: SimBackend, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SessionDeployment[DriverHandle], Path]]:
    """The correct widget on a node of its own, deployed as the suite's fixtures deploy a driver."""
    control = tmp_path_factory.mktemp("widget") / "control.json"
    control.write_text("{}")
    dra = dra_of(real_backend)
    name = real_backend.ensure_node(NodeSpec("widget"))
    node = DRANodeHandle(real_backend, dra, name, timeout=20.0, reregistration_timeout=40.0)
    spec = DriverSpec(driver_name=DRIVER, argv=[sys.executable, str(WIDGET), "--control", str(control)])
    yield driver_deployment(node, spec), control
    dra.remove_driver(name)


#: The check of health reported as device taints: judged on the widget with ``--health taints`` (below).
TAINT_CHECK = "test_device_health_reported_as_device_taints"
#: Every other check of the suite that needs a fault, with the widget's injector: they pass on a correct driver.
FAULT_CHECKS = {
    name: getattr(test_faults, name) for name in dir(test_faults) if name.startswith("test_") and name != TAINT_CHECK
}


@pytest.mark.parametrize("name", sorted(FAULT_CHECKS))
def test_fault_checks_pass_on_a_driver_with_an_injector(
    name: str, real_backend: SimBackend, widget: tuple[SessionDeployment[DriverHandle], Path]
) -> None:
    deployment, control = widget
    driver = deployment.get(name)
    factory = ClaimFactory(real_backend, driver, timeout=20.0, prefix=name)
    args = {"devplug_driver": driver, "devplug_claims": factory, "devplug_dra_faults": WidgetFaults(driver, control)}
    check = FAULT_CHECKS[name]
    try:
        check(**{n: args[n] for n in check.__code__.co_varnames[: check.__code__.co_argcount]})
    finally:
        control.write_text("{}")
        factory.cleanup()
        deployment.reset_if_needed()


def test_health_by_device_taints_passes_on_a_driver_that_taints(
    real_backend: SimBackend, broken_driver: Callable[..., DriverHandle]
) -> None:
    """The widget with ``--health taints`` (no health service; an Unhealthy device tainted NoSchedule in its slice)."""
    driver = broken_driver("none", "--health", "taints")
    factory = ClaimFactory(real_backend, driver, timeout=20.0, prefix="taints")
    try:
        test_faults.test_device_health_reported_as_device_taints(factory, driver, _faults(driver))
    finally:
        factory.cleanup()


def test_health_by_device_taints_skips_a_driver_with_a_health_stream(
    real_backend: SimBackend, broken_driver: Callable[..., DriverHandle]
) -> None:
    driver = broken_driver("none")
    factory = ClaimFactory(real_backend, driver, timeout=20.0, prefix="stream")
    try:
        with pytest.raises(pytest.skip.Exception, match="reports device health through its health stream"):
            test_faults.test_device_health_reported_as_device_taints(factory, driver, _faults(driver))
    finally:
        factory.cleanup()


def test_device_status_check_passes_a_driver_that_merges_and_skips_one_that_writes_none(
    real_backend: SimBackend, broken_driver: Callable[..., DriverHandle]
) -> None:
    """The widget with ``--device-status`` keeps the condition another writer put on its entry and passes; without
    it, the widget writes nothing there and the check skips, saying so."""
    for extra, skipped in ((("--device-status",), False), ((), True)):
        driver = broken_driver("none", *extra)
        factory = ClaimFactory(real_backend, driver, timeout=20.0, prefix="status")
        try:
            if skipped:
                with pytest.raises(pytest.skip.Exception, match="writes nothing into a claim's status.devices"):
                    test_device_status.test_device_status_keeps_what_others_wrote(factory, driver)
            else:
                test_device_status.test_device_status_keeps_what_others_wrote(factory, driver)
        finally:
            factory.cleanup()


def test_update_then_kubelet_start_check_passes_a_driver_that_republishes(
    broken_driver: Callable[..., DriverHandle],
) -> None:
    """The correct widget puts back the device the check dropped from its slice, in place, and publishes its slice
    again after the kubelet's start deleted it (its watch-less loop looks every 0.3 s: a 2 s bound)."""
    driver = broken_driver("none")
    assert_slices_back_after_an_update_then_a_kubelet_start(driver, republish_s=2.0)


def _resync(backend: SimBackend, driver: DriverHandle, factory: ClaimFactory) -> None:
    """The resync check on a copy of the broken driver; a 2 s republish bound (the widget republishes within 0.3 s).
    The copy itself gets the same 20 s to come up as every driver here: a Python process start alone took over 5 s
    on a loaded machine, and a copy that never came up fails the check for another reason than the bug."""
    cluster = ClusterHandle(backend, timeout=20.0)
    with ResyncWatch(cluster, driver.spec, driver.node.name, f"{driver.node.name}-rs", republish_s=2.0) as watch:
        test_slices.test_node_slices_removed_on_kubelet_start_then_published_again(watch, driver)


def _faults(driver: DriverHandle) -> WidgetFaults:
    """The injector of a widget deployed with ``--control FILE``."""
    argv = list(driver.spec.argv)
    return WidgetFaults(driver, Path(argv[argv.index("--control") + 1]))


class _NoteSink:
    """What a check that notes how it ran (``request.node.user_properties``) needs of its ``request`` here."""

    def __init__(self) -> None:
        self.node = SimpleNamespace(user_properties=[])


#: variant -> (how to run the check it must fail, a text its failure must contain)
BROKEN: dict[str, tuple[Callable[[SimBackend, DriverHandle, ClaimFactory], None], str]] = {
    "prepare-not-idempotent": (
        lambda b, d, f: test_prepare.test_prepare_is_idempotent(f, d),
        "preparing the claim again answered",
    ),
    "wrong-device": (
        lambda b, d, f: test_prepare.test_claim_prepared_and_container_sees_it(f, d),
        "the scheduler allocated",
    ),
    "unprepare-unknown-fails": (
        lambda b, d, f: test_prepare.test_unprepared_when_pod_deleted_and_unprepare_is_idempotent(f, d),
        "unpreparing the claim a second time failed",
    ),
    "no-republish": (_resync, "expected no-republish.devplug.example to publish its devices again"),
    "exit-on-refusal": (lambda b, d, f: test_registration.test_recovers_after_refused_registration(d), "exited"),
    "first-request-only": (lambda b, d, f: test_prepare.test_claim_with_several_requests(f, d), "the driver prepared"),
    "no-request-names": (
        lambda b, d, f: test_prepare.test_claim_with_several_requests(f, d),
        "the driver named the requests",
    ),
    "sub-request-names": (
        lambda b, d, f: test_prepare.test_prioritized_list_gets_the_next_choice(f, d),
        "a device named for gpu/one reaches no container",
    ),
    "unprepare-per-device": (
        lambda b, d, f: test_scheduling.test_admin_access_leaves_the_pod_using_the_device_alone(f, d),
        "which pod",
    ),
    "keep-specs": (
        lambda b, d, f: test_scheduling.test_noexecute_taint_evicts_the_pod_and_unprepares_its_claim(f, d),
        "after its pod was evicted for a NoExecute device taint, but left the CDI spec file(s)",
    ),
    "forget-on-restart": (
        lambda b, d, f: test_restarts.test_unprepare_after_a_restart_removes_the_claims_cdi_specs(f, d),
        "left the CDI spec file(s) its prepare wrote",
    ),
    "spec-in-subdir": (
        lambda b, d, f: test_prepare.test_claim_prepared_and_container_sees_it(f, d),
        "a subdirectory of /var/run/cdi: a runtime reads only the spec files directly in",
    ),
    "reboot-loses-spec": (
        lambda b, d, f: test_restarts.test_pods_come_back_with_their_devices_after_a_node_reboot(f, d, _NoteSink()),
        "CDI device injection failed: unresolvable CDI devices",
    ),
    "no-reuse": (
        lambda b, d, f: test_scheduling.test_devices_prepared_again_for_a_new_claim_after_cleanup(f, d),
        "is in use by claim",
    ),
    "health-unlisted": (
        lambda b, d, f: test_faults.test_device_health_reaches_pod_status(f, d, WidgetFaults(d, Path("/nonexistent"))),
        "lists no health service in GetInfo",
    ),
    "taint-effect-none": (
        lambda b, d, f: test_faults.test_device_health_reported_as_device_taints(f, d, _faults(d)),
        "no effect keeps new claims off it",
    ),
    "taint-every-device": (
        lambda b, d, f: test_faults.test_device_health_reported_as_device_taints(f, d, _faults(d)),
        "tainted devices other than the Unhealthy",
    ),
    "stale-after-update": (
        lambda b, d, f: assert_slices_back_after_an_update_then_a_kubelet_start(d, republish_s=2.0),
        "inherits kubernetes/kubernetes#140011",
    ),
    "status-replaces": (
        lambda b, d, f: test_device_status.test_device_status_keeps_what_others_wrote(f, d),
        "dropped what another writer had put there: the DevplugObserved condition",
    ),
}


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_broken_driver_fails_the_check_about_its_bug(
    variant: str, real_backend: SimBackend, broken_driver: Callable[[str], DriverHandle]
) -> None:
    check, text = BROKEN[variant]
    driver = broken_driver(variant)
    factory = ClaimFactory(real_backend, driver, timeout=20.0, prefix=variant)
    try:
        with pytest.raises(AssertionError) as failure:
            check(real_backend, driver, factory)
    finally:
        factory.cleanup()
        if not driver.node.kubelet_running:
            driver.node.start_kubelet()
    assert text in str(failure.value), f"the check failed, but not naming the bug ({text!r}): {failure.value}"
