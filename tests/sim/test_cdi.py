"""CDI resolution on the embedded kubelet: spec files read and validated as upstream's CDI library does, the
container getting the named devices' edits, and a name no spec resolves refusing the container, naming it
and the specs seen."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_devplug import ClusterHandle, NodeSpec, PluginSpec, PodFactory, assert_allocate_injections
from pytest_devplug.backends.base import BackendOptions, ExecResult
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.settings import default_plugin_argv
from pytest_devplug.kubeletmodel import cdi
from pytest_devplug.kubeletmodel.views import DeviceNodeView, MountView
from pytest_devplug.errors import UnresolvableCdiDevicesError

SPEC: dict[str, Any] = {
    "cdiVersion": "0.6.0",
    "kind": "example.com/gpu",
    "containerEdits": {"env": ["SHARED=1"], "deviceNodes": [{"path": "/dev/examplectl"}]},
    "devices": [
        {
            "name": "gpu0",
            "containerEdits": {"deviceNodes": [{"path": "/dev/ex0", "hostPath": "/host/ex0", "permissions": "rw"}]},
        },
        {
            "name": "gpu1",
            "containerEdits": {
                "env": ["WHICH=1"],
                "mounts": [{"hostPath": "/lib/x", "containerPath": "/usr/lib/x", "options": ["ro"]}],
            },
        },
    ],
}


def write(directory: Path, name: str, spec: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(spec))
    return path


def test_resolve_applies_the_spec_edits_once_then_each_devices(tmp_path: Path) -> None:
    write(tmp_path / "run", "example.json", SPEC)
    edits = cdi.resolve(["example.com/gpu=gpu0", "example.com/gpu=gpu1"], [tmp_path / "etc", tmp_path / "run"])
    assert edits.env == {"SHARED": "1", "WHICH": "1"}
    assert edits.device_nodes == [
        DeviceNodeView("/dev/examplectl", "/dev/examplectl", "rwm"),
        DeviceNodeView("/dev/ex0", "/host/ex0", "rw"),
    ]
    assert edits.mounts == [MountView("/usr/lib/x", "/lib/x", True)]


def test_a_later_directory_wins_and_equal_priority_conflicts(tmp_path: Path) -> None:
    other = json.loads(json.dumps(SPEC))
    other["containerEdits"] = {"env": ["SHARED=run"]}
    write(tmp_path / "etc", "a.json", SPEC)
    write(tmp_path / "run", "b.json", other)
    assert cdi.resolve(["example.com/gpu=gpu0"], [tmp_path / "etc", tmp_path / "run"]).env == {"SHARED": "run"}
    write(tmp_path / "run", "c.json", other)  # the same devices twice in /var/run/cdi: both unresolvable
    with pytest.raises(UnresolvableCdiDevicesError, match="conflicting device 'example.com/gpu=gpu0'"):
        cdi.resolve(["example.com/gpu=gpu0"], [tmp_path / "etc", tmp_path / "run"])


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"cdiVersion": "0.2.9"}, "invalid version '0.2.9'"),
        ({"kind": "example.com"}, "invalid kind 'example.com'"),
        ({"kind": "9vendor/gpu"}, "invalid vendor '9vendor': should start with a letter"),
        ({"kind": "example.com/gpu-"}, "invalid class 'gpu-': should end with a letter or digit"),
        ({"devices": []}, "invalid spec, no devices"),
        ({"devices": [{"name": "a/b", "containerEdits": {"env": ["A=1"]}}]}, "invalid character '/'"),
        ({"devices": [{"name": "a", "containerEdits": {}}]}, "invalid device 'a', empty device edits"),
        ({"devices": [{"name": "a", "containerEdits": {"env": ["=1"]}}]}, "invalid environment variable '=1'"),
        (
            {"devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"path": "/d", "type": "x"}]}}]},
            "invalid type 'x'",
        ),
        (
            {"devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"path": "/d", "permissions": "rx"}]}}]},
            "invalid permissions 'rx'",
        ),
        ({"devices": [{"name": "a", "containerEdits": {"mounts": [{"hostPath": "/h"}]}}]}, "empty container path"),
        (
            {"devices": [{"name": "a", "containerEdits": {"hooks": [{"hookName": "later", "path": "/h"}]}}]},
            "invalid hook name 'later'",
        ),
        ({"devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}] * 2}, "multiple device 'a'"),
        ({"deviceNodes": []}, "unknown field(s) ['deviceNodes'] in the spec"),
    ],
)
def test_an_invalid_spec_is_ignored_saying_why(tmp_path: Path, change: dict[str, Any], rule: str) -> None:
    path = write(tmp_path, "bad.json", {**SPEC, **change})
    with pytest.raises(UnresolvableCdiDevicesError) as info:
        cdi.resolve(["example.com/gpu=gpu0"], [tmp_path])
    assert info.value.names == ["example.com/gpu=gpu0"]
    assert rule in info.value.seen[str(path)], info.value.seen


def test_unresolvable_names_say_which_and_what_was_seen(tmp_path: Path) -> None:
    write(tmp_path, "example.json", SPEC)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "broken.yaml").write_text("kind: [unclosed")
    with pytest.raises(UnresolvableCdiDevicesError) as info:
        cdi.resolve(["example.com/gpu=gpu0", "example.com/gpu=gpu7", "other.com/x=y"], [tmp_path])
    text = str(info.value)
    assert text.startswith("unresolvable CDI devices example.com/gpu=gpu7, other.com/x=y; specs seen: "), text
    assert "example.json: example.com/gpu devices ['gpu0', 'gpu1']" in text and "broken.json: ignored (" in text, text
    assert "broken.yaml: ignored (" in text and "cannot parse: while parsing a flow sequence" in text, text
    with pytest.raises(UnresolvableCdiDevicesError, match=r"specs seen: .*nowhere: no spec files"):
        cdi.resolve(["example.com/gpu=gpu0"], [tmp_path / "nowhere"])


def test_names_from_annotations() -> None:
    assert cdi.names_from_annotations({"cdi.k8s.io/b": "v/c=2", "cdi.k8s.io/a": "v/c=0, v/c=1", "other": "v/c=9"}) == [
        "v/c=0",
        "v/c=1",
        "v/c=2",
    ]


@pytest.fixture(params=["cdi-cri", "cdi-annotations"])
def cdi_plugin(request: pytest.FixtureRequest) -> Iterator[tuple[ClusterHandle, PodFactory, Path]]:
    """The included plugin answering with CDI names, writing its spec to the node's /var/run/cdi."""
    backend = SimBackend(BackendOptions(timeout=20.0))
    backend.start()
    try:
        cluster = ClusterHandle(backend, timeout=20.0)
        node = cluster.ensure_node(NodeSpec("devplug-cdi", numa_nodes=1))
        argv = [*default_plugin_argv("nvidia.com/gpu"), "--device-list-strategy", request.param]
        plugin = cluster.deploy(node, PluginSpec(argv=argv, mock=True, gpus=2, numa_nodes=1, standard_paths=True))
        plugin.wait_listed()
        pods = cluster.pods(node, "nvidia.com/gpu", prefix="cdi")
        try:
            yield cluster, pods, backend.cluster.node("devplug-cdi").node_dir / "cdi"  # type: ignore[attr-defined]
        finally:
            pods.cleanup()
    finally:
        backend.close()


def test_the_container_gets_the_cdi_specs_edits(cdi_plugin: tuple[ClusterHandle, PodFactory, Path]) -> None:
    _, pods, _ = cdi_plugin
    pod = pods(gpus=1, wait=True)
    (uuid,) = pod.allocated_devices
    minor = int(uuid[-1])  # mock GPU n has minor n
    paths = sorted(d.container_path for d in pod.device_nodes)
    assert paths == ["/dev/nvidia-uvm", f"/dev/nvidia{minor}", "/dev/nvidiactl"], paths  # none came in the response
    assert {"nvidiactl", f"nvidia{minor}"} <= set(pod.exec("ls", "/dev").stdout.split())


def test_a_name_no_spec_resolves_refuses_the_container(cdi_plugin: tuple[ClusterHandle, PodFactory, Path]) -> None:
    _, pods, spec_dir = cdi_plugin
    for spec in spec_dir.iterdir():
        spec.unlink()  # the plugin's spec is gone: its names resolve to nothing
    pod = pods(gpus=1)
    with pytest.raises(AssertionError) as info:
        pod.wait_running()
    text = str(info.value)
    assert (
        "the runtime refused to create container" in text and "unresolvable CDI devices nvidia.com/gpu=GPU-" in text
    ), text
    assert f"specs seen: {spec_dir.parent / 'cdi'}: no spec files" in text, text


def test_a_runtime_that_does_not_apply_cdi_edits_fails_the_injection_check(
    cdi_plugin: tuple[ClusterHandle, PodFactory, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a CDI name should bring (the spec's device nodes) must be in the container: a runtime without CDI
    (containerd 1.6 ignores CRI's CDIDevices) starts the container without them, and the check says so."""
    _, pods, _ = cdi_plugin
    pod = pods(gpus=1, wait=True)
    assert_allocate_injections(pod)
    bare = ExecResult(2, "", "ls: cannot access '/dev/nvidiactl': No such file or directory\n")
    monkeypatch.setattr(SimBackend, "exec_pod", lambda *a, **kw: bare)
    with pytest.raises(
        AssertionError,
        match=r"\['/dev/nvidia-uvm', '/dev/nvidia\d', '/dev/nvidiactl'\] were injected .* the "
        r"container has nothing there: the runtime did not apply them \(does it resolve CDI names\?\)",
    ):
        assert_allocate_injections(pod)
