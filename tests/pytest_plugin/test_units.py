"""Fast tests of the plugin layer's pure parts: mock state, sim exec emulation, checkpoint decoding,
bounded waits, backend selection, option/ini resolution, pod manifests."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_devplug.backends import create_backend, mockstate
from pytest_devplug.backends.base import BackendOptions, ContainerView, DeviceNodeView, MountView, parse_checkpoint
from pytest_devplug.backends.sim import emulate_exec
from pytest_devplug.errors import BackendUnavailableError, ObjectNotFoundError, UnsupportedOperationError, WaitTimeout
from pytest_devplug.handles import PodFactory, parse_quantity
from pytest_devplug.waiting import wait_for

pytest_plugins = ["pytester"]


def test_initial_mock_state_spreads_gpus_over_numa_nodes() -> None:
    s = mockstate.initial_state(4, 2)
    assert [g["numa_node"] for g in s["gpus"]] == [0, 0, 1, 1]
    assert len({g["uuid"] for g in s["gpus"]}) == 4 and [g["minor"] for g in s["gpus"]] == [0, 1, 2, 3]
    assert s["events"] == [] and not any(g["lost"] or g["fail_allocate"] for g in s["gpus"])
    assert [g["numa_node"] for g in mockstate.initial_state(3, 0)["gpus"]] == [None, None, None]


def test_mock_state_edits_follow_the_contract() -> None:
    s = mockstate.initial_state(2, 1)
    u0, u1 = (g["uuid"] for g in s["gpus"])
    s2 = mockstate.with_xid(mockstate.with_xid(s, u0, 79), u1, 48)
    assert s2["events"] == [{"uuid": u0, "xid": 79}, {"uuid": u1, "xid": 48}]
    assert s["events"] == []  # pure: the input is untouched
    assert mockstate.with_lost(s, u1, True)["gpus"][1]["lost"] is True
    assert mockstate.with_fail_allocate(s, u0, True)["gpus"][0]["fail_allocate"] is True
    s3, new = mockstate.with_gpu_added(s, numa_node=0)
    assert new not in (u0, u1) and s3["gpus"][-1]["minor"] == 2
    assert [g["uuid"] for g in mockstate.with_gpu_removed(s3, u0)["gpus"]] == [u1, new]
    with pytest.raises(KeyError, match="no mock GPU"):
        mockstate.with_xid(s, "GPU-nope", 79)


VIEW = ContainerView(
    envs={"WIDGET_IDS": "w-0,w-1", "A": "1"},
    mounts=(MountView("/var/run/widgets/w-0", "/dev/null", True),),
    devices=(DeviceNodeView("/dev/w-0", "/dev/null", "rw"), DeviceNodeView("/dev/dri/card0", "/dev/null", "rw")),
    annotations={},
    cdi_devices=(),
)


def test_sim_exec_answers_only_what_the_record_knows() -> None:
    assert emulate_exec(VIEW, ["env"]).stdout == "A=1\nWIDGET_IDS=w-0,w-1\n"
    assert emulate_exec(VIEW, ["printenv", "WIDGET_IDS"]).stdout == "w-0,w-1\n"
    assert emulate_exec(VIEW, ["printenv", "NOPE"]).returncode == 1
    dev = emulate_exec(VIEW, ["ls", "/dev"]).stdout.split()
    assert {"w-0", "dri", "null", "zero"} <= set(dev) and "nvidia0" not in dev
    assert emulate_exec(VIEW, ["ls", "/var/run/widgets"]).stdout.split() == ["w-0"]
    assert emulate_exec(VIEW, ["ls", "/dev/w-9"]).returncode == 2
    assert emulate_exec(VIEW, ["test", "-e", "/dev/w-0"]).returncode == 0
    assert emulate_exec(VIEW, ["test", "-e", "/dev/w-1"]).returncode == 1
    assert "/var/run/widgets/w-0 bind ro" in emulate_exec(VIEW, ["cat", "/proc/mounts"]).stdout
    for argv in (["nvidia-smi"], ["ls", "/usr/bin"], []):
        with pytest.raises(UnsupportedOperationError):
            emulate_exec(VIEW, argv)


def test_parse_checkpoint_of_a_real_kubelet() -> None:
    raw = (
        b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":'
        b'["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280}'
    )
    cp = parse_checkpoint(raw)
    assert cp.entries == () and cp.registered_devices == {
        "nvidia.com/gpu": ("GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0",)
    }
    entry = {
        "PodUID": "u",
        "ContainerName": "c",
        "ResourceName": "r/x",
        "DeviceIDs": {"-1": ["a"], "0": ["b"]},
        "AllocResp": base64.b64encode(b"\x0a\x00").decode(),
    }
    cp2 = parse_checkpoint(
        json.dumps({"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": None}, "Checksum": 1}).encode()
    )
    assert cp2.entries_for("u")[0].all_device_ids == ["a", "b"] and cp2.entries[0].alloc_resp == b"\x0a\x00"
    with pytest.raises(ValueError, match="cannot unmarshal array into checkpoint.Data"):
        parse_checkpoint(b"[]")


def test_parse_checkpoint_decodes_as_the_kubelet_does() -> None:
    """Go's json.Unmarshal: keys match field names case-insensitively, unknown keys are ignored, a missing Data
    is an empty one (the kubelet's checksum check then refuses it; reading does not judge the checksum)."""
    raw = (
        b'{"data":{"podDeviceEntries":[{"poduid":"u","CONTAINERNAME":"c","ResourceName":"r/x",'
        b'"DeviceIDs":{"0":["b"]},"Extra":1}]},"Checksum":7}'
    )
    (entry,) = parse_checkpoint(raw).entries
    assert (entry.pod_uid, entry.container_name, entry.device_ids, entry.alloc_resp) == ("u", "c", {"0": ("b",)}, b"")
    assert parse_checkpoint(b"{}").entries == () and parse_checkpoint(b"{}").registered_devices == {}
    with pytest.raises(ValueError, match="invalid character"):
        parse_checkpoint(b'\xef\xbb\xbf{"Data":{}}')  # a BOM, which Python's json would skip


def test_wait_for_is_bounded_and_keeps_the_last_value() -> None:
    calls = iter(range(100))
    assert wait_for(lambda: next(calls), lambda v: v >= 3, timeout=5, what="three", interval=0.001) == 3
    t = time.monotonic()
    with pytest.raises(WaitTimeout) as err:
        wait_for(lambda: "no", lambda v: v == "yes", timeout=0.3, what="yes")
    assert time.monotonic() - t < 2 and err.value.last == "no" and "waiting for yes" in str(err.value)
    with pytest.raises(WaitTimeout) as err2:
        empty: dict[str, int] = {}
        wait_for(lambda: empty["k"], lambda v: True, timeout=0.2, what="k", retry_on=(KeyError,))
    assert isinstance(err2.value.last_error, KeyError)
    with pytest.raises(ZeroDivisionError):  # not in retry_on: propagates at once
        wait_for(lambda: 1 / 0, lambda v: True, timeout=5, what="x")


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(BackendUnavailableError, match="unknown devplug backend"):
        create_backend("minikube", BackendOptions())


class _NodesOnly:
    """A backend that answers only ``get_node`` (all ``PodFactory.manifest`` asks of it): node n1, with ``taints``."""

    def __init__(self, *taints: dict[str, str]) -> None:
        self.taints = list(taints)

    def get_node(self, name: str) -> dict[str, Any]:
        if name != "n1":
            raise ObjectNotFoundError(f"node {name} not found")
        return {"metadata": {"name": name}, "spec": {"taints": self.taints}}


def test_pod_factory_manifests() -> None:
    f = PodFactory(_NodesOnly(), node="n1", resource_name="example.com/w", timeout=1, prefix="Test Thing[1]")  # type: ignore[arg-type]
    m = f.manifest(2)
    c = m["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"example.com/w": "2"}} and m["spec"]["nodeSelector"] == {
        "kubernetes.io/hostname": "n1"
    }
    assert m["metadata"]["name"].startswith("test-thing-1-")
    assert f.manifest(requests=1)["spec"]["containers"][0]["resources"] == {"requests": {"example.com/w": "1"}}
    assert parse_quantity("3") == 3 and parse_quantity(None) == 0 and parse_quantity(4) == 4
    assert parse_quantity("1k") == 1000  # how an API server writes 1000 devices
    with pytest.raises(ValueError, match="'500m' is not an integer"):
        parse_quantity("500m")
    with pytest.raises(ValueError, match="'two' is not a quantity"):
        parse_quantity("two")


def test_pods_tolerate_the_taints_their_node_is_configured_with() -> None:
    """A tainted GPU node keeps away every pod but those tolerating it; the run pins its pods to the node by name, so
    they tolerate its configured taints, not those saying the node's state (not-ready, unreachable: a check may be
    waiting one out)."""
    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    state = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}
    f = PodFactory(_NodesOnly(gpu, state), node="n1", resource_name="example.com/w", timeout=1)  # type: ignore[arg-type]
    assert f.manifest(1)["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "tolerations" not in f.manifest(1, node="elsewhere")["spec"], "a node that does not exist has no taints"
    assert (
        "tolerations"
        not in PodFactory(_NodesOnly(state), node="n1", resource_name="r/x", timeout=1).manifest(1)["spec"]
    )  # type: ignore[arg-type]


def test_resource_neutral_names_and_their_gpu_aliases() -> None:
    f = PodFactory(_NodesOnly(), node="n1", resource_name="example.com/w", timeout=1)  # type: ignore[arg-type]
    limits = {"limits": {"example.com/w": "2"}}
    assert f.manifest(2)["spec"]["containers"][0]["resources"] == limits
    assert f.manifest(count=2)["spec"]["containers"][0]["resources"] == limits
    assert f.manifest(gpus=2)["spec"]["containers"][0]["resources"] == limits
    with pytest.raises(TypeError, match="count=1 or its alias gpus=2"):
        f.manifest(1, gpus=2)


def test_options_group_and_ini_keys(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        ["device-plugin end-to-end tests (pytest-devplug):", "*--devplug-backend=*", "*devplug_resource_name (string)*"]
    )
    for opt in (
        "--devplug-plugin-cmd",
        "--devplug-plugin-image",
        "--devplug-plugin-manifest",
        "--devplug-gpus",
        "--devplug-numa-nodes",
        "--devplug-timeout",
        "--devplug-grace-period",
        "--devplug-no-mock",
        "--cluster-name",
        "--keep-cluster",
        "--kind-bin",
        "--kind-image",
        "--kubeconfig",
    ):
        assert opt in result.stdout.str(), opt
    pytester.makeini(
        "[pytest]\ndevplug_resource_name = example.com/ini\ndevplug_plugin_cmd = {python} p.py {plugin_dir}\n"
    )
    pytester.makepyfile(
        test_s="""
        import sys

        def test_settings(devplug_settings):
            s = devplug_settings
            assert s.plugin.resource_name == "example.com/cli"  # the command line beats the ini file
            assert s.plugin.argv == ("{python}", "p.py", "{plugin_dir}")  # filled when it starts, on its node
            argv, _ = s.plugin.command(plugin_dir="/dp", mock_state=None)
            assert argv == [sys.executable, "p.py", "/dp"]
            assert s.plugin.mock is False and s.plugin.pre_start_required is False
            assert s.backend_options.timeout == 7.5 and s.backend_options.cluster_name == "mine"
        """
    )
    pytester.runpytest(
        "--devplug-resource-name=example.com/cli", "--devplug-timeout=7.5", "--cluster-name=mine"
    ).assert_outcomes(passed=1)
    pytester.runpytest("--devplug-backend=docker").stderr.fnmatch_lines(["*invalid choice*"])


def test_an_image_alone_is_the_included_plugin(pytester: pytest.Pytester) -> None:
    """An image without a manifest is deployed with the included plugin's DaemonSet: its defaults (mock,
    conventions, every fault) apply; with a manifest or a command line it is someone else's plugin."""
    check = """
        from pytest_devplug.options import CONVENTIONS

        def test_settings(devplug_settings):
            s = devplug_settings
            assert s.included_plugin is {0}
            assert s.plugin.mock is {0} and s.plugin.pre_start_required is {0}
            assert s.plugin.conventions == (frozenset(CONVENTIONS) if {0} else frozenset())
        """
    pytester.makepyfile(test_included=check.format(True), test_other=check.format(False))
    image = "--devplug-plugin-image=reg.example/gpu:1"
    pytester.runpytest(image, "test_included.py").assert_outcomes(passed=1)
    pytester.runpytest(image, "--devplug-plugin-manifest=ds.yaml", "test_other.py").assert_outcomes(passed=1)
    pytester.runpytest("--devplug-plugin-cmd=./p", "test_other.py").assert_outcomes(passed=1)


def test_evidence_quotes_only_the_current_tests_kubelet_lines() -> None:
    """Sim (klog, local time) and kind (journal short-iso) lines before the window are left out."""
    import time as _time

    from pytest_devplug.evidence import current_test_lines, set_test_window

    start = _time.time()

    def klog(t: float, msg: str) -> str:
        return _time.strftime("I%m%d %H:%M:%S", _time.localtime(t)) + f".{int(t % 1 * 1e6):06d}  1 x.py:1] {msg}"

    def iso(t: float, msg: str) -> str:
        return _time.strftime("%Y-%m-%dT%H:%M:%S+0000", _time.gmtime(t)) + f" node kubelet[1]: {klog(t, msg)}"

    sim_log = "\n".join(
        [klog(start - 60, "old"), "  continuation of old", klog(start + 1, "new"), "  continuation of new"]
    )
    kind_log = "\n".join([iso(start - 60, "old"), iso(start + 1, "new")])
    try:
        set_test_window(start)
        assert current_test_lines(sim_log) == sim_log.splitlines()[2:]
        assert [ln.endswith("new") for ln in current_test_lines(kind_log)] == [True]
        assert current_test_lines("no stamps here\nat all") == ["no stamps here", "at all"]
        set_test_window(None)
        assert current_test_lines(sim_log) == sim_log.splitlines()
    finally:
        set_test_window(None)


def test_run_container_options_merge_like_the_kubelet(caplog: pytest.LogCaptureFixture) -> None:
    """deviceRunContainerOptions: first setting wins, device nodes and mounts de-duplicated by container
    path (within one response too: two IDs sharing a node), CDI names once; conflicts are logged."""
    import logging

    from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
    from pytest_devplug.kubeletmodel.runoptions import run_container_options

    a = pb.ContainerAllocateResponse(envs={"X": "1"}, annotations={"k": "a"})
    a.devices.add(container_path="/dev/g0", host_path="/dev/g0", permissions="rw")
    a.devices.add(container_path="/dev/g0", host_path="/dev/g0", permissions="rw")
    a.mounts.add(container_path="/m", host_path="/h1")
    a.cdi_devices.add(name="v.io/c=0")
    b = pb.ContainerAllocateResponse(envs={"X": "2", "Y": "3"}, annotations={"k": "b"})
    b.devices.add(container_path="/dev/g0", host_path="/dev/other", permissions="r")
    b.mounts.add(container_path="/m", host_path="/h2")
    b.cdi_devices.add(name="v.io/c=0")
    log = logging.getLogger("devplug-test-runoptions")
    with caplog.at_level(logging.ERROR, logger=log.name):
        opts = run_container_options([a, b], log)
    assert opts.envs == {"X": "1", "Y": "3"} and opts.annotations == {"k": "a"}
    assert [(d.container_path, d.host_path, d.permissions) for d in opts.devices] == [("/dev/g0", "/dev/g0", "rw")]
    assert [(m.container_path, m.host_path) for m in opts.mounts] == [("/m", "/h1")]
    assert opts.cdi_devices == ("v.io/c=0",)
    text = caplog.text
    for needle in (
        "Environment variable has conflicting",
        "conflicting mapping host devices",
        "conflicting mapping host mounts",
        "Annotation has conflicting",
    ):
        assert needle in text, text


def test_the_kubelet_model_imports_neither_side_of_the_layering() -> None:
    """kubeletmodel/ holds rules both sim/ and backends/ use; importing either (or anything above them) would
    tie the layers in a knot."""
    import ast

    import pytest_devplug.kubeletmodel as km

    allowed = ("pytest_devplug.kubeletmodel", "pytest_devplug.errors", "pytest_devplug.api")
    package = ["pytest_devplug", "kubeletmodel"]
    imported = []
    for path in Path(km.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported += [(path.name, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                imported.append((path.name, ".".join([*base, *([node.module] if node.module else [])])))
    bad = [f"{f}: {name}" for f, name in imported if name.startswith("pytest_devplug") and not name.startswith(allowed)]
    assert len(imported) > 10 and bad == []
