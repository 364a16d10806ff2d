"""Downstream adoption, proven: a separate project with its own tiny device plugin (example.com/widget)
uses the fixtures and helpers, and runs the shipped conformance suite against its plugin — in its own
pytest run (``from pytest_devplug.conformance.suite import *``) and through ``devplug conformance``.
Broken variants of the plugin make the matching conformance tests fail with messages naming the fault.
"""

from __future__ import annotations

import os
import sys

import pytest

pytest_plugins = ["pytester"]

#: The downstream project's device plugin: 3 widgets, no topology, no mock controls. ``--fault``
#: makes it misbehave the way real plugins do.
WIDGET_PLUGIN = '''
"""example.com/widget: a minimal device plugin on the pytest_devplug.api stubs."""
import argparse, os, signal, threading
from concurrent import futures

import grpc
from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb, v1beta1_pb2_grpc as pbg

p = argparse.ArgumentParser()
p.add_argument("--plugin-dir", required=True)
p.add_argument("--count", type=int, default=3)
p.add_argument("--fault", choices=["none", "register-before-serve", "inject-nothing"], default="none")
args = p.parse_args()
RESOURCE, NAME = "example.com/widget", "widget.sock"
SOCK, KUBELET = os.path.join(args.plugin_dir, NAME), os.path.join(args.plugin_dir, "kubelet.sock")
IDS = [f"widget-{i}" for i in range(args.count)]
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())


class Widgets(pbg.DevicePluginServicer):
    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request, context):
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy") for i in IDS])
        while context.is_active() and not stop.wait(0.2):
            pass

    def Allocate(self, request, context):
        out = pb.AllocateResponse()
        for c in request.container_requests:
            r = out.container_responses.add()
            if args.fault != "inject-nothing":
                r.envs["WIDGET_IDS"] = ",".join(c.devices_ids)
                for d in c.devices_ids:
                    r.devices.add(container_path=f"/dev/{d}", host_path="/dev/null", permissions="rw")
        return out

    def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()


def serve():
    if os.path.exists(SOCK):
        os.unlink(SOCK)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pbg.add_DevicePluginServicer_to_server(Widgets(), server)
    server.add_insecure_port("unix://" + SOCK)
    server.start()
    return server


def register():
    with grpc.insecure_channel("unix://" + KUBELET) as ch:
        pbg.RegistrationStub(ch).Register(
            pb.RegisterRequest(version="v1beta1", endpoint=NAME, resource_name=RESOURCE), timeout=30
        )


if args.fault == "register-before-serve":
    try:
        register()  # the classic bug: the kubelet dials a socket nobody serves yet
    except grpc.RpcError as exc:
        print("register failed:", exc.details(), flush=True)
    server = serve()
else:
    server = serve()
    register()
print("registered", RESOURCE, flush=True)
while not stop.wait(0.1):
    if args.fault != "register-before-serve" and not os.path.exists(SOCK):  # kubelet restarted
        server.stop(0)
        server = serve()
        try:
            register()
            print("re-registered", flush=True)
        except grpc.RpcError as exc:
            print("re-register failed:", exc.details(), flush=True)
server.stop(0)
'''

CONFTEST = '''
import os, sys, pathlib
import pytest
from pytest_devplug import PluginSpec

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="session")
def devplug_plugin_spec():
    """Point pytest-devplug at this project's plugin."""
    return PluginSpec(
        resource_name="example.com/widget",
        argv=[sys.executable, str(HERE / "widget_plugin.py"), "--plugin-dir", "{plugin_dir}",
              "--fault", os.environ.get("WIDGET_FAULT", "none")],
    )
'''

TEST_WIDGET = '''
from pytest_devplug import (
    assert_allocatable, assert_allocate_injections, assert_checkpoint_survives_kubelet_restart,
    assert_gpu_limit_rules, assert_registered, assert_reregisters_after_kubelet_restart,
)


def test_widget_end_to_end(devplug_plugin, devplug_pod):
    assert devplug_plugin.resource_name == "example.com/widget"
    assert_registered(devplug_plugin, count=3)
    assert_allocatable(devplug_plugin, 3, capacity=3)
    pod = devplug_pod(gpus=2, wait=True)
    ids = pod.allocated_devices
    assert len(ids) == 2 and all(i.startswith("widget-") for i in ids)
    assert_allocate_injections(
        pod,
        env={"WIDGET_IDS": lambda v: sorted(v.split(",")) == ids},
        device_nodes=[f"/dev/{i}" for i in ids],
    )
    assert pod.exec("printenv", "WIDGET_IDS").stdout.strip().split(",") == pod.env["WIDGET_IDS"].split(",")
    assert set(ids) <= set(pod.exec("ls", "/dev").stdout.split())
    assert_checkpoint_survives_kubelet_restart(devplug_plugin, pod)


def test_widget_rules_and_restart(devplug_plugin, devplug_pod):
    assert_gpu_limit_rules(devplug_pod)
    assert_reregisters_after_kubelet_restart(devplug_plugin, count=3)


def test_widget_has_no_mock(devplug_plugin):
    import pytest
    from pytest_devplug import MockControlsUnavailableError
    with pytest.raises(MockControlsUnavailableError):
        devplug_plugin.mock
'''

TEST_CONFORMANCE = "from pytest_devplug.conformance.suite import *  # noqa: F401,F403\n"

#: Conformance tests that cannot apply to the widget plugin, and the reason each must give.
EXPECTED_SKIPS = {
    "test_unhealthy_device_leaves_allocatable_not_capacity": "mock-NVML",
    "test_device_turning_unhealthy_under_running_pod": "mock-NVML",
    "test_removed_and_added_devices_change_capacity": "mock-NVML",
    "test_included_plugin_envvar_strategy": "mock-NVML",
    "test_failing_allocate_fails_the_pod": "mock-NVML",
    "test_preferred_allocation_packs_numa_nodes": "mock-NVML",
    "test_allocation_is_numa_aligned": "no topology",
    "test_single_numa_node_policy_rejects_cross_numa_request": "no topology",
    "test_prestart_container_called_before_start": "pre_start_required",
}


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(widget_plugin=WIDGET_PLUGIN, conftest=CONFTEST, test_widget=TEST_WIDGET)
    pytester.makepyfile(test_conformance=TEST_CONFORMANCE)
    return pytester


def _skip_reasons(result: pytest.RunResult) -> str:
    return "\n".join(ln for ln in result.outlines if ln.startswith("SKIPPED"))


def test_downstream_project_passes_with_its_own_plugin(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "--devplug-timeout=10", timeout=240)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()[-6000:]
    assert outcomes.get("skipped", 0) == len(EXPECTED_SKIPS), _skip_reasons(result)
    # Every skip says why; none is a silent pass.
    reasons = _skip_reasons(result)
    assert reasons.count("mock-NVML") == 6 and reasons.count("no topology") == 2 and "pre_start_required" in reasons, reasons
    assert outcomes["passed"] >= 3 + 28 - len(EXPECTED_SKIPS), outcomes
    assert "(example.com/widget) was declared without them" in reasons


def test_devplug_conformance_cli_against_downstream_plugin(project: pytest.Pytester) -> None:
    """The one-liner a plugin project puts in its CI, run from the project directory."""
    cmd = f"{{python}} {project.path / 'widget_plugin.py'} --plugin-dir {{plugin_dir}}"
    devplug = os.path.join(os.path.dirname(sys.executable), "devplug")
    result = project.run(
        devplug, "conformance", "--backend", "sim", "--plugin-cmd", cmd, "--resource-name", "example.com/widget",
        "--timeout", "10", "--", "-q", timeout=240,
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()[-6000:]
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") == len(EXPECTED_SKIPS) and "failed" not in outcomes, outcomes


def test_missing_mock_fail_mode_fails_instead_of_skipping(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--devplug-missing-mock=fail", "-k", "test_failing_allocate_fails_the_pod", timeout=120
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*needs the mock-NVML fault controls*"])


def test_plugin_registering_before_serving_fails_registration(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WIDGET_FAULT", "register-before-serve")
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--devplug-timeout=3", "-k", "test_registers_its_resource", timeout=120
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    errors = "\n".join(ln for ln in result.outlines if ln.startswith("E "))
    assert "expected resource example.com/widget registered" in errors, out[-4000:]
    assert "must be serving on its socket BEFORE it calls Register" in errors, out[-4000:]
    assert "devplug: kubelet log" in out  # the evidence section is attached to the report


def test_plugin_injecting_nothing_fails_injection_test(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WIDGET_FAULT", "inject-nothing")
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--devplug-timeout=10", "-k", "test_allocate_injections_reach_the_container", timeout=120
    )
    result.assert_outcomes(failed=1)
    errors = [ln for ln in result.outlines if ln.startswith("E ")]
    assert any("Allocate injected nothing into container main" in ln for ln in errors), result.stdout.str()[-4000:]
    assert not any("appear in no injection" in ln for ln in errors), errors  # one clear message, not a cascade

