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

#: The downstream project's device plugin: widgets with opaque IDs (a hash, like many real plugins), no
#: topology, no mock NVML. ``--health-file`` makes it read its devices' health from a JSON file (the way
#: a downstream project injects faults); ``--fault`` makes it misbehave the way real plugins do.
WIDGET_PLUGIN = """
\"\"\"example.com/widget: a minimal device plugin on the pytest_devplug.api stubs.\"\"\"
import argparse, hashlib, json, os, signal, threading
from concurrent import futures

import grpc
from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb, v1beta1_pb2_grpc as pbg

p = argparse.ArgumentParser()
p.add_argument("--plugin-dir", required=True)
p.add_argument("--count", type=int, default=3)
p.add_argument("--health-file",
               help='JSON {"count": N, "removed": [id], "unhealthy": [id], "fail_allocate": [id | "*"]}')
p.add_argument("--fault", choices=["none", "register-before-serve", "inject-nothing"], default="none")
args = p.parse_args()
RESOURCE, NAME = "example.com/widget", "widget.sock"
SOCK, KUBELET = os.path.join(args.plugin_dir, NAME), os.path.join(args.plugin_dir, "kubelet.sock")
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())


def widget_id(i):
    return hashlib.sha256(f"widget{i}".encode()).hexdigest()[:12]  # opaque: names no device path


def health():
    h = {"count": args.count, "removed": [], "unhealthy": [], "fail_allocate": []}
    if args.health_file:
        try:
            with open(args.health_file) as fh:
                h.update(json.load(fh))
        except (OSError, ValueError) as exc:
            print("health file unreadable, keeping defaults:", exc, flush=True)
    return h


def devices():
    h = health()
    ids = [widget_id(i) for i in range(h["count"]) if widget_id(i) not in h["removed"]]
    return [pb.Device(ID=i, health="Unhealthy" if i in h["unhealthy"] else "Healthy") for i in ids]


def index(device_id):
    return next(i for i in range(health()["count"]) if widget_id(i) == device_id)


class Widgets(pbg.DevicePluginServicer):
    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request, context):
        sent = devices()
        yield pb.ListAndWatchResponse(devices=sent)
        while context.is_active() and not stop.wait(0.1):
            now = devices()
            if now != sent:
                sent = now
                yield pb.ListAndWatchResponse(devices=sent)

    def Allocate(self, request, context):
        failing = health()["fail_allocate"]
        out = pb.AllocateResponse()
        for c in request.container_requests:
            bad = [d for d in c.devices_ids if "*" in failing or d in failing]
            if bad:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"widgets {bad} do not answer")
            r = out.container_responses.add()
            if args.fault != "inject-nothing":
                nodes = [f"/dev/widget{index(d)}" for d in c.devices_ids]
                r.envs["WIDGET_DEVICES"] = ",".join(nodes)
                for n in nodes:
                    r.devices.add(container_path=n, host_path="/dev/null", permissions="rw")
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


def kubelet_identity():
    try:
        st = os.stat(KUBELET)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


seen = kubelet_identity()
while not stop.wait(0.1):
    now = kubelet_identity()
    # A restarted kubelet removes our socket, then serves a new kubelet.sock: re-serve and register then
    # (reacting to our socket's removal alone races the kubelet's clean-up).
    if args.fault != "register-before-serve" and now is not None and now != seen:
        seen = now
        server.stop(0)
        server = serve()
        try:
            register()
            print("re-registered", flush=True)
        except grpc.RpcError as exc:
            print("re-register failed:", exc.details(), flush=True)
            seen = None  # try again on the next tick
server.stop(0)
"""

CONFTEST = """
import os, sys, pathlib
import pytest
from pytest_devplug import PluginSpec

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="session")
def devplug_plugin_spec():
    \"\"\"Point pytest-devplug at this project's plugin.\"\"\"
    return PluginSpec(
        resource_name="example.com/widget",
        argv=[sys.executable, str(HERE / "widget_plugin.py"), "--plugin-dir", "{plugin_dir}",
              "--fault", os.environ.get("WIDGET_FAULT", "none")],
    )
"""

#: The same project with fault injection: its plugin reads a health file, and its conftest gives the
#: suite a FaultInjector that writes it (what docs/guides/device-plugins.md's "Fault injection" section shows).
CONFTEST_WITH_FAULTS = """
import hashlib, json, os, pathlib, sys
import pytest
from pytest_devplug import FaultInjector, FaultNotSupportedError, PluginSpec

HERE = pathlib.Path(__file__).parent
INITIAL = {"count": 3, "removed": [], "unhealthy": [], "fail_allocate": []}


@pytest.fixture(scope="session")
def health_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("widget") / "health.json"
    path.write_text(json.dumps(INITIAL))
    return path


@pytest.fixture(scope="session")
def devplug_plugin_spec(health_file):
    return PluginSpec(
        resource_name="example.com/widget",
        argv=[sys.executable, str(HERE / "widget_plugin.py"), "--plugin-dir", "{plugin_dir}",
              "--health-file", str(health_file)],
    )


class HealthFileFaults:
    \"\"\"The suite's fault contract for the widget plugin: edits the health file it re-reads.\"\"\"

    def __init__(self, path):
        self.path = path

    def _edit(self, fn):
        h = json.loads(self.path.read_text())
        fn(h)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(h))
        os.replace(tmp, self.path)  # atomic: the plugin never reads half a file

    @property
    def device_ids(self):
        h = json.loads(self.path.read_text())
        ids = [hashlib.sha256(f"widget{i}".encode()).hexdigest()[:12] for i in range(h["count"])]
        return [i for i in ids if i not in h["removed"]]

    def set_unhealthy(self, device_id):
        self._edit(lambda h: h["unhealthy"].append(device_id))

    def set_healthy(self, device_id):
        self._edit(lambda h: h.update(unhealthy=[i for i in h["unhealthy"] if i != device_id]))

    def fail_allocate(self, device_id=None):
        self._edit(lambda h: h["fail_allocate"].append(device_id or "*"))

    def add_device(self):
        if os.environ.get("WIDGET_FIXED_INVENTORY"):
            raise FaultNotSupportedError("widgets are soldered on")
        self._edit(lambda h: h.update(count=h["count"] + 1))
        return self.device_ids[-1]

    def remove_device(self, device_id):
        if os.environ.get("WIDGET_FIXED_INVENTORY"):
            raise FaultNotSupportedError("widgets are soldered on")
        self._edit(lambda h: h["removed"].append(device_id))


@pytest.fixture
def devplug_faults(devplug_plugin, health_file) -> FaultInjector:
    yield HealthFileFaults(health_file)
    health_file.write_text(json.dumps(INITIAL))  # the suite redeploys the plugin next
"""

TEST_WIDGET = """
from pytest_devplug import (
    assert_allocatable, assert_allocate_injections, assert_checkpoint_survives_kubelet_restart,
    assert_limit_rules, assert_registered, assert_reregisters_after_kubelet_restart,
)


def test_widget_end_to_end(devplug_plugin, devplug_pod):
    assert devplug_plugin.resource_name == "example.com/widget"
    assert_registered(devplug_plugin, count=3)
    assert_allocatable(devplug_plugin, 3, capacity=3)
    pod = devplug_pod(gpus=2, wait=True)
    nodes = sorted(d.container_path for d in pod.view().devices)
    assert len(pod.allocated_devices) == 2 and len(nodes) == 2
    assert_allocate_injections(
        pod,
        env={"WIDGET_DEVICES": lambda v: sorted(v.split(",")) == nodes},
        device_nodes=nodes,
    )
    assert pod.exec("printenv", "WIDGET_DEVICES").stdout.strip() == pod.env["WIDGET_DEVICES"]
    assert {n[5:] for n in nodes} <= set(pod.exec("ls", "/dev").stdout.split())
    assert_checkpoint_survives_kubelet_restart(devplug_plugin, pod)


def test_widget_rules_and_restart(devplug_plugin, devplug_pod):
    assert_limit_rules(devplug_pod)
    assert_reregisters_after_kubelet_restart(devplug_plugin, count=3)


def test_widget_has_no_mock(devplug_plugin):
    import pytest
    from pytest_devplug import MockControlsUnavailableError
    with pytest.raises(MockControlsUnavailableError):
        devplug_plugin.mock
"""

TEST_CONFORMANCE = "from pytest_devplug.conformance.suite import *  # noqa: F401,F403\n"

#: Fault tests: they run where the project gives the suite a FaultInjector, and skip naming the contract where not.
FAULT_TESTS = (
    "test_unhealthy_device_leaves_allocatable_not_capacity",
    "test_device_turning_unhealthy_under_running_pod",
    "test_removed_and_added_devices_change_capacity",
    "test_failing_allocate_fails_the_pod",
    "test_health_reported_after_kubelet_and_plugin_restarts",
    "test_device_health_reported_for_a_pod_that_never_started",
    "test_failing_prestart_keeps_the_container_from_starting",  # with an injector: the pre_start skip below
)
#: Conformance tests that cannot apply to the widget plugin whatever its conftest, and the reason each gives.
OTHER_SKIPS = {
    "test_convention_ids_visible_in_injections": "convention check 'ids-visible'",
    "test_convention_ids_visible_single_device_pod_sees_only_its_id": "convention check 'ids-visible'",
    "test_convention_nvidia_env_lists_assigned_ids": "convention check 'nvidia-env'",
    "test_convention_numa_packing_two_devices_on_one_node": "convention check 'numa-packing'",
    "test_convention_numa_packing_fills_one_node_first": "convention check 'numa-packing'",
    "test_single_numa_node_policy_rejects_cross_numa_request": "report no topology",
    "test_prestart_container_called_before_start": "registered with pre_start_required=false",
    "test_failing_prestart_keeps_the_container_from_starting": "registered with pre_start_required=false",
    "test_every_resource_registers_and_allocates": "serves one resource",
    "test_every_resource_reregisters_after_kubelet_restart": "serves one resource",
    "test_convention_rolling_update_without_downtime": "convention check 'rolling-update'",
    "test_critical_xid_turns_that_gpu_unhealthy": "convention check 'nvml-xid'",
    "test_application_xids_leave_the_gpu_healthy": "convention check 'nvml-xid'",
    "test_convention_exclusive_devices_reach_one_container": "convention check 'exclusive-devices'",
}
EXPECTED_SKIPS = {**OTHER_SKIPS, **{t: "needs a fault injector" for t in FAULT_TESTS}}
SUITE_SIZE = 48


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(widget_plugin=WIDGET_PLUGIN, conftest=CONFTEST, test_widget=TEST_WIDGET)
    pytester.makepyfile(test_conformance=TEST_CONFORMANCE)
    return pytester


def _skip_reasons(result: pytest.RunResult) -> str:
    return "\n".join(ln for ln in result.outlines if ln.startswith("SKIPPED"))


def _assert_skips(result: pytest.RunResult, expected: dict[str, str]) -> None:
    """Exactly the expected tests skipped, each labelled with its name and saying why."""
    reasons = _skip_reasons(result)
    assert result.parseoutcomes().get("skipped", 0) == len(expected), reasons
    for name, why in expected.items():
        assert any(f": {name}: " in ln and why in ln for ln in reasons.splitlines()), f"{name} ({why}):\n{reasons}"


def test_downstream_project_passes_with_its_own_plugin(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "--devplug-timeout=30", timeout=400)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()[-6000:]
    _assert_skips(result, EXPECTED_SKIPS)
    assert outcomes["passed"] == 3 + SUITE_SIZE - len(EXPECTED_SKIPS), outcomes
    # The fault skips name the contract a project implements to run them.
    assert "no conftest overrides the devplug_faults fixture to return a pytest_devplug.FaultInjector" in _skip_reasons(
        result
    )


def test_downstream_fault_injector_runs_the_fault_tests(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its own FaultInjector (a health file) the project's plugin goes through the health and
    failing-Allocate tests like the included one; an injector that cannot add/remove devices skips only that test."""
    project.makeconftest(CONFTEST_WITH_FAULTS)
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rs", "--devplug-timeout=30", "test_conformance.py", timeout=400
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()[-6000:]
    _assert_skips(result, OTHER_SKIPS)
    assert outcomes["passed"] == SUITE_SIZE - len(OTHER_SKIPS), outcomes
    monkeypatch.setenv("WIDGET_FIXED_INVENTORY", "1")
    fixed = project.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-rs",
        "--devplug-timeout=30",
        "test_conformance.py",
        "-k",
        "removed_and_added",
        timeout=120,
    )
    _assert_skips(
        fixed,
        {
            "test_removed_and_added_devices_change_capacity": (
                "the fault injector cannot remove a device: widgets are soldered on"
            )
        },
    )


def test_devplug_conformance_cli_against_downstream_plugin(project: pytest.Pytester) -> None:
    """The one-liner a plugin project puts in its CI, run from the project directory."""
    cmd = f"{{python}} {project.path / 'widget_plugin.py'} --plugin-dir {{plugin_dir}}"
    devplug = os.path.join(os.path.dirname(sys.executable), "devplug")
    result = project.run(
        devplug,
        "conformance",
        "--backend",
        "sim",
        "--plugin-cmd",
        cmd,
        "--resource-name",
        "example.com/widget",
        "--timeout",
        "30",
        "--",
        "-q",
        timeout=400,
    )
    assert result.ret == 0, result.stdout.str()[-6000:]
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") == len(EXPECTED_SKIPS) and "failed" not in outcomes, outcomes


def test_missing_faults_fail_mode_fails_instead_of_skipping(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--devplug-missing-faults=fail",
        "-k",
        "test_failing_allocate_fails_the_pod",
        timeout=120,
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*needs a fault injector*FaultInjector*"])


def test_plugin_registering_before_serving_fails_registration(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WIDGET_FAULT", "register-before-serve")
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--devplug-timeout=15", "-k", "test_registers_its_resource", timeout=120
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    errors = "\n".join(ln for ln in result.outlines if ln.startswith("E "))
    assert "expected resource example.com/widget registered" in errors, out[-4000:]
    assert "must be serving on its socket BEFORE it calls Register" in errors, out[-4000:]
    assert "devplug: kubelet log" in out  # the evidence section is attached to the report


def test_plugin_injecting_nothing_fails_injection_test(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WIDGET_FAULT", "inject-nothing")
    result = project.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--devplug-timeout=30",
        "-k",
        "test_allocate_injections_reach_the_container",
        timeout=120,
    )
    result.assert_outcomes(failed=1)
    errors = [ln for ln in result.outlines if ln.startswith("E ")]
    assert any("Allocate injected nothing into container main" in ln for ln in errors), result.stdout.str()[-4000:]
    assert not any("appear in no injection" in ln for ln in errors), errors  # one clear message, not a cascade


def test_failed_injection_check_prints_what_was_injected(project: pytest.Pytester) -> None:
    """Opaque IDs fail the opt-in ids-visible check, and the message shows the injections to act on."""
    project.makepyfile(
        test_ids="""
        from pytest_devplug import assert_allocate_injections

        def test_ids_visible(devplug_pod):
            assert_allocate_injections(devplug_pod(gpus=1, wait=True), ids_visible=True)
        """
    )
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--devplug-timeout=30", "test_ids.py", timeout=120)
    result.assert_outcomes(failed=1)
    errors = "\n".join(ln for ln in result.outlines if ln.startswith("E "))
    assert "appear in no injection" in errors, result.stdout.str()[-4000:]
    assert "injected into container main:" in errors and "env WIDGET_DEVICES=/dev/widget" in errors, errors
    assert "device /dev/null -> /dev/widget" in errors, errors
