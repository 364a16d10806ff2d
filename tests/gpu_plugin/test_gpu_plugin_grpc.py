"""The GPU plugin end to end over its real gRPC socket, with a fake kubelet and the mock NVML."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import grpc
import pytest

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb

from devplug_gpu_plugin.server import default_socket_name

from .gpu_plugin_helpers import RESOURCE, SOCKET, UUIDS, WAIT, FakeKubelet, MockStateFile

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


def allocate(reg, *containers: list[str]) -> pb.AllocateResponse:  # type: ignore[no-untyped-def]
    req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers])
    return reg.stub.Allocate(req, timeout=5)


def test_serves_first_then_registers_with_options(start_plugin, kubelet: FakeKubelet, plugin_dir: Path) -> None:
    start_plugin()
    reg = kubelet.next_registration()
    assert reg.request.version == "v1beta1"
    assert reg.request.endpoint == SOCKET
    assert reg.request.resource_name == RESOURCE
    assert reg.request.options.get_preferred_allocation_available is True
    assert reg.request.options.pre_start_required is False
    # The fake kubelet got these from the plugin's socket while Register was still in flight.
    assert reg.options.get_preferred_allocation_available is True
    assert reg.options.pre_start_required is False
    assert stat.S_ISSOCK(os.stat(plugin_dir / SOCKET).st_mode)


def test_list_and_watch_full_list_with_numa_topology(start_plugin, kubelet: FakeKubelet) -> None:
    start_plugin()
    msg = kubelet.next_registration().next_update()
    assert [d.ID for d in msg.devices] == UUIDS  # ordered by minor number
    assert {d.health for d in msg.devices} == {HEALTHY}
    assert [[n.ID for n in d.topology.nodes] for d in msg.devices] == [[0], [0], [1], [1]]


def test_critical_xid_unhealthy_and_ignored_xid_changes_nothing(
    start_plugin, kubelet: FakeKubelet, mock_state: MockStateFile
) -> None:
    plugin = start_plugin()
    reg = kubelet.next_registration()
    reg.next_update()
    mock_state.xid(UUIDS[0], 13)  # ignored by default
    plugin.wait_log(f"Xid 13 on {UUIDS[0]} is in the ignored list")
    reg.assert_no_update(within=0.3)
    mock_state.xid(UUIDS[1], 79)
    reg.wait_for(lambda h: h[UUIDS[1]] == UNHEALTHY, "GPU1 Unhealthy after Xid 79")
    assert reg.health() == {UUIDS[0]: HEALTHY, UUIDS[1]: UNHEALTHY, UUIDS[2]: HEALTHY, UUIDS[3]: HEALTHY}
    # Xids are sticky: an unrelated change republishes the list with GPU1 still Unhealthy.
    mock_state.set(UUIDS[3], lost=True)
    reg.wait_for(lambda h: h[UUIDS[3]] == UNHEALTHY, "GPU3 lost")
    assert reg.health()[UUIDS[1]] == UNHEALTHY


def test_ignored_xids_are_configurable(start_plugin, kubelet: FakeKubelet, mock_state: MockStateFile) -> None:
    start_plugin("--ignored-xids", "79")
    reg = kubelet.next_registration()
    reg.next_update()
    mock_state.xid(UUIDS[0], 79)
    reg.assert_no_update(within=0.5)
    mock_state.xid(UUIDS[0], 13)  # not ignored any more
    reg.wait_for(lambda h: h[UUIDS[0]] == UNHEALTHY, "GPU0 Unhealthy after Xid 13")


def test_lost_gpu_unhealthy_and_back_healthy_clearing_xid(
    start_plugin, kubelet: FakeKubelet, mock_state: MockStateFile
) -> None:
    plugin = start_plugin()
    reg = kubelet.next_registration()
    reg.next_update()
    mock_state.xid(UUIDS[2], 48)
    reg.wait_for(lambda h: h[UUIDS[2]] == UNHEALTHY, "GPU2 Unhealthy after Xid 48")
    mock_state.set(UUIDS[0], lost=True)
    reg.wait_for(lambda h: h[UUIDS[0]] == UNHEALTHY, "GPU0 Unhealthy when lost")
    mock_state.set(UUIDS[2], lost=True)
    # Its health does not change, so wait for the plugin to have seen it lost before bringing it back:
    # two quick rewrites of the state file can reach the plugin as one.
    plugin.wait_log(f"{UUIDS[2]} Unhealthy (Xid 48 -> lost; Xid 48)")
    mock_state.set(UUIDS[2], lost=False)  # lost and back = reset: the Xid is cleared too
    mock_state.set(UUIDS[0], lost=False)
    reg.wait_for(lambda h: set(h.values()) == {HEALTHY}, "all four Healthy again")
    assert len(reg.health()) == 4


def test_added_and_removed_gpus_change_the_list(start_plugin, kubelet: FakeKubelet, mock_state: MockStateFile) -> None:
    start_plugin()
    reg = kubelet.next_registration()
    reg.next_update()
    new = "GPU-4a000000-0000-4000-8000-000000000004"
    mock_state.gpus.append({"uuid": new, "minor": 4, "numa_node": None, "name": "NVIDIA T4", "memory_mib": 15360})
    mock_state.write()
    msg = reg.wait_for(lambda h: new in h, "the added GPU")
    added = next(d for d in msg.devices if d.ID == new)
    assert added.health == HEALTHY
    assert not added.HasField("topology"), "a GPU without a NUMA node must carry no topology"
    mock_state.gpus = [g for g in mock_state.gpus if g["uuid"] != UUIDS[0]]
    mock_state.write()
    msg = reg.wait_for(lambda h: UUIDS[0] not in h, "GPU0 removed")
    assert [d.ID for d in msg.devices] == UUIDS[1:] + [new]


def test_kubelet_restart_reregisters_on_the_new_socket_with_same_health(
    start_plugin, kubelet_factory, plugin_dir: Path, mock_state: MockStateFile
) -> None:
    plugin = start_plugin()
    first = kubelet_factory()
    reg = first.next_registration()
    reg.next_update()
    mock_state.xid(UUIDS[1], 79)
    reg.wait_for(lambda h: h[UUIDS[1]] == UNHEALTHY, "GPU1 Unhealthy")
    # A restart after the registration completed (the Xid arrives fast enough to beat its answer).
    plugin.wait_log("registered with kubelet")
    # What the kubelet does on restart: stop, delete every socket in the dir, serve kubelet.sock.
    first.stop()
    for p in plugin_dir.iterdir():
        if stat.S_ISSOCK(p.lstat().st_mode):
            p.unlink()
    second = kubelet_factory()
    again = second.next_registration(timeout=WAIT)
    # Event driven, not upstream's fixed 10 s wait nor a poll: the plugin saw kubelet.sock appear (inotify)
    # and re-registered because of it. How fast that is on a quiet machine is a benchmark, not a test here.
    log = plugin.wait_log("re-registered in")
    assert "plugin dir: kubelet.sock created" in log, log
    assert again.request.endpoint == SOCKET
    msg = again.next_update()
    assert {d.ID: d.health for d in msg.devices}[UUIDS[1]] == UNHEALTHY, "health must survive re-registration"
    assert sum(d.health == HEALTHY for d in msg.devices) == 3


def test_kubelet_sock_recreated_alone_registers_again(start_plugin, kubelet_factory, plugin_dir: Path) -> None:
    start_plugin()
    first = kubelet_factory()
    first.next_registration().next_update()
    first.stop()
    (plugin_dir / "kubelet.sock").unlink(missing_ok=True)  # gRPC's stop may have removed it
    assert (plugin_dir / SOCKET).exists()  # our own socket stays: only the kubelet's is new
    second = kubelet_factory()
    again = second.next_registration()
    assert len(again.next_update().devices) == 4


def test_own_socket_deleted_serves_and_registers_again(start_plugin, kubelet: FakeKubelet, plugin_dir: Path) -> None:
    start_plugin()
    kubelet.next_registration().next_update()
    (plugin_dir / SOCKET).unlink()
    again = kubelet.next_registration()
    assert again.options.get_preferred_allocation_available  # the new socket answered during Register
    assert len(again.next_update().devices) == 4
    assert allocate(again, [UUIDS[0]]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[0]


def test_preferred_allocation_over_grpc(start_plugin, kubelet: FakeKubelet) -> None:
    start_plugin()
    reg = kubelet.next_registration()
    reg.next_update()
    u = UUIDS
    req = pb.PreferredAllocationRequest(
        container_requests=[
            # no constraint: one NUMA node, lowest minors first
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=[u[3], u[1], u[2], u[0]], allocation_size=2),
            # must-include on node 1 pulls its neighbour
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=u, must_include_deviceIDs=[u[3]], allocation_size=2
            ),
            # node 1 fits exactly (no leftovers) while node 0 has one
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=[u[0], u[2], u[3]], allocation_size=2),
            # more than one node holds: exact size anyway
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=u, allocation_size=3),
        ]
    )
    resp = reg.stub.GetPreferredAllocation(req, timeout=5)
    got = [list(r.deviceIDs) for r in resp.container_responses]
    assert got[0] == [u[0], u[1]]
    assert got[1] == [u[3], u[2]]
    assert got[2] == [u[2], u[3]]
    assert len(got[3]) == 3 and len(set(got[3])) == 3


def test_allocate_envvar_default(start_plugin, kubelet: FakeKubelet, tmp_path: Path) -> None:
    start_plugin("--dev-root", str(tmp_path / "devroot"))
    reg = kubelet.next_registration()
    reg.next_update()
    resp = allocate(reg, [UUIDS[2], UUIDS[0]], [UUIDS[3]])
    assert len(resp.container_responses) == 2
    first, second = resp.container_responses
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == f"{UUIDS[2]},{UUIDS[0]}"
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[3]
    specs = {(d.container_path, d.host_path, d.permissions) for d in first.devices}
    root = tmp_path / "devroot"
    assert specs == {
        ("/dev/nvidiactl", f"{root}/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", f"{root}/nvidia-uvm", "rw"),
        ("/dev/nvidia2", f"{root}/nvidia2", "rw"),
        ("/dev/nvidia0", f"{root}/nvidia0", "rw"),
    }
    assert {d.container_path for d in second.devices} == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia3"}
    assert not first.cdi_devices and not first.annotations and not first.mounts


def test_allocate_other_strategies_cdi_spec_and_env_flags(
    start_plugin, kubelet: FakeKubelet, tmp_path: Path, mock_state: MockStateFile
) -> None:
    cdi_dir, dev_root, libs = tmp_path / "cdi", tmp_path / "devroot", "/usr/lib/x86_64-linux-gnu/nvidia"
    # Flags through their DP_* environment variables, as the DaemonSet sets them.
    start_plugin(
        "--device-list-strategy",
        "cdi-cri",
        env={
            "DP_DEVICE_LIST_STRATEGY": "ignored-because-the-flag-wins",
            "DP_CDI_SPEC_DIR": str(cdi_dir),
            "DP_DEV_ROOT": str(dev_root),
            "DP_DRIVER_LIB_DIR": libs,
            "DP_CREATE_DEV_NODES": "true",
        },
    )
    reg = kubelet.next_registration()
    reg.next_update()
    cri = allocate(reg, [UUIDS[1], UUIDS[2]]).container_responses[0]
    assert [c.name for c in cri.cdi_devices] == [f"{RESOURCE}={UUIDS[1]}", f"{RESOURCE}={UUIDS[2]}"]
    assert not cri.devices and "NVIDIA_VISIBLE_DEVICES" not in cri.envs  # CDI carries the edits

    spec = json.loads((cdi_dir / "devplug-example.com-gpu.json").read_text())
    assert spec["kind"] == RESOURCE and spec["cdiVersion"].startswith("0.")
    assert [d["name"] for d in spec["devices"]] == UUIDS
    assert spec["devices"][2]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia2", "hostPath": f"{dev_root}/nvidia2", "permissions": "rw"}
    ]
    assert {n["path"] for n in spec["containerEdits"]["deviceNodes"]} == {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert spec["containerEdits"]["mounts"][0]["hostPath"] == libs
    assert "ro" in spec["containerEdits"]["mounts"][0]["options"]
    for name in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia3"):
        assert (dev_root / name).exists(), f"--create-dev-nodes did not create {name}"
    # The spec follows the device list.
    mock_state.gpus.pop(0)
    mock_state.write()
    reg.wait_for(lambda h: UUIDS[0] not in h, "GPU0 removed")
    deadline = time.monotonic() + WAIT
    while UUIDS[0] in (cdi_dir / "devplug-example.com-gpu.json").read_text():
        assert time.monotonic() < deadline, "CDI spec still lists the removed GPU"
        time.sleep(0.02)
    assert not [p for p in cdi_dir.iterdir() if p.name.startswith(".tmp")], "temp files left behind"


def test_allocate_volume_mounts_and_cdi_annotations(start_plugin, kubelet: FakeKubelet, tmp_path: Path) -> None:
    start_plugin(
        "--device-list-strategy",
        "volume-mounts,cdi-annotations",
        "--cdi-spec-dir",
        str(tmp_path / "cdi"),
        "--driver-lib-dir",
        "/opt/nvidia/lib",
    )
    reg = kubelet.next_registration()
    reg.next_update()
    r = allocate(reg, [UUIDS[0], UUIDS[3]]).container_responses[0]
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    mounts = {(m.container_path, m.host_path, m.read_only) for m in r.mounts}
    assert mounts == {
        (f"/var/run/nvidia-container-devices/{UUIDS[0]}", "/dev/null", False),
        (f"/var/run/nvidia-container-devices/{UUIDS[3]}", "/dev/null", False),
        ("/opt/nvidia/lib", "/opt/nvidia/lib", True),
    }
    assert {d.container_path for d in r.devices} == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia0",
        "/dev/nvidia3",
    }
    assert dict(r.annotations) == {
        "cdi.k8s.io/devplug-gpu_example.com-gpu": f"{RESOURCE}={UUIDS[0]},{RESOURCE}={UUIDS[3]}"
    }
    assert (tmp_path / "cdi" / "devplug-example.com-gpu.json").is_file()


def test_allocate_rejects_unknown_and_unhealthy_and_fail_allocate(
    start_plugin, kubelet: FakeKubelet, mock_state: MockStateFile
) -> None:
    mock_state.gpu(UUIDS[3])["fail_allocate"] = True
    mock_state.write()
    start_plugin()
    reg = kubelet.next_registration()
    reg.next_update()
    with pytest.raises(grpc.RpcError) as unknown:
        allocate(reg, [UUIDS[0], "GPU-does-not-exist"])
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-does-not-exist" in unknown.value.details()

    mock_state.xid(UUIDS[1], 79)
    reg.wait_for(lambda h: h[UUIDS[1]] == UNHEALTHY, "GPU1 Unhealthy")
    with pytest.raises(grpc.RpcError) as unhealthy:
        allocate(reg, [UUIDS[0]], [UUIDS[1]])
    assert unhealthy.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert UUIDS[1] in unhealthy.value.details() and "Unhealthy" in unhealthy.value.details()

    with pytest.raises(grpc.RpcError) as failed:
        allocate(reg, [UUIDS[2], UUIDS[3]])
    assert failed.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    assert UUIDS[3] in failed.value.details()
    assert allocate(reg, [UUIDS[2]]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[2]


def test_pre_start_required_flag(start_plugin, kubelet: FakeKubelet) -> None:
    plugin = start_plugin("--pre-start-required")
    reg = kubelet.next_registration()
    assert reg.request.options.pre_start_required is True
    assert reg.options.pre_start_required is True
    resp = reg.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=[UUIDS[0], UUIDS[2]]), timeout=5)
    assert resp == pb.PreStartContainerResponse()
    plugin.wait_log(f"PreStartContainer: devices {UUIDS[0]},{UUIDS[2]}")


def test_fail_pre_start_refuses_prestart_for_that_gpu(
    start_plugin, kubelet: FakeKubelet, mock_state: MockStateFile
) -> None:
    """``fail_pre_start`` in the mock state: PreStartContainer answers an error naming the GPU; others still pass."""
    plugin = start_plugin("--pre-start-required")
    reg = kubelet.next_registration()
    mock_state.set(UUIDS[1], fail_pre_start=True)
    with pytest.raises(grpc.RpcError) as failed:
        reg.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=[UUIDS[0], UUIDS[1]]), timeout=5)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert UUIDS[1] in failed.value.details() and "fail_pre_start" in failed.value.details()
    plugin.wait_log("PreStartContainer refused")
    assert (
        reg.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=[UUIDS[0]]), timeout=5)
        == pb.PreStartContainerResponse()
    )
    assert allocate(reg, [UUIDS[1]]).container_responses, "fail_pre_start leaves Allocate alone"


def test_second_resource_from_one_process(start_plugin, kubelet: FakeKubelet, plugin_dir: Path) -> None:
    """``--second-resource NAME=1``: the GPU with the highest minor is NAME's, on its own socket and registration;
    each resource lists and allocates only its own GPUs."""
    plugin = start_plugin("--second-resource", "example.com/gpu-small=1")
    regs = {r.request.resource_name: r for r in (kubelet.next_registration(), kubelet.next_registration())}
    assert set(regs) == {RESOURCE, "example.com/gpu-small"}
    small = regs["example.com/gpu-small"]
    assert small.request.endpoint == "devplug-example.com-gpu-small.sock" != regs[RESOURCE].request.endpoint
    assert [d.ID for d in regs[RESOURCE].next_update().devices] == UUIDS[:3]
    assert [d.ID for d in small.next_update().devices] == UUIDS[3:]
    assert allocate(small, [UUIDS[3]]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[3]
    with pytest.raises(grpc.RpcError) as other:
        allocate(small, [UUIDS[0]])
    assert other.value.code() == grpc.StatusCode.INVALID_ARGUMENT, "a GPU of the other resource is unknown here"
    plugin.signal(signal.SIGTERM)
    assert plugin.wait_exit() == 0, plugin.log()
    assert not list(plugin_dir.glob("devplug-*.sock")), "both sockets are removed on exit"


def test_second_resource_needs_a_gpu_left_for_the_first(start_plugin, kubelet: FakeKubelet) -> None:
    plugin = start_plugin("--second-resource", "example.com/gpu-small=4")
    assert plugin.wait_exit() == 2
    assert "example.com/gpu-small asks for 4 GPUs, the node has 4" in plugin.log()


def test_second_instance_beside_a_live_one_serves_on_its_own_socket(
    start_plugin, kubelet: FakeKubelet, plugin_dir: Path
) -> None:
    """A rolling update: the new instance takes a socket of its own while the old one serves, registers (the
    kubelet switches to it), and the old one's exit leaves it serving; a stale socket file is taken over."""
    first = start_plugin()
    assert kubelet.next_registration().request.endpoint == SOCKET
    second = start_plugin()
    try:
        reg = kubelet.next_registration()
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the second instance's log:\n{second.log()[-3000:]}") from None
    assert reg.request.endpoint != SOCKET and reg.request.endpoint.startswith("devplug-")
    first.signal(signal.SIGTERM)
    assert first.wait_exit() == 0
    assert (plugin_dir / reg.request.endpoint).exists(), "the old instance removed the new one's socket"
    assert [d.ID for d in reg.next_update().devices] == UUIDS
    assert reg.stub.GetDevicePluginOptions(pb.Empty(), timeout=5) is not None
    second.proc.kill()
    assert second.wait_exit() != 0
    third = start_plugin()
    assert kubelet.next_registration().request.endpoint == SOCKET, "nothing answers on the default name: take it"
    third.signal(signal.SIGTERM)
    assert third.wait_exit() == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(start_plugin, kubelet: FakeKubelet, plugin_dir: Path, signum: int) -> None:
    plugin = start_plugin()
    reg = kubelet.next_registration()
    reg.next_update()
    plugin.signal(signum)
    assert plugin.wait_exit() == 0, plugin.log()
    assert not (plugin_dir / SOCKET).exists(), "the plugin left its socket behind"


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'{"gpus": [', "invalid JSON"),
        (b'{"gpus": [{"uuid": "GPU-x"}]}', "gpus[0].minor: missing"),
        (b'{"gpus": [{"uuid": "a", "minor": 0}, {"uuid": "a", "minor": 1}]}', "uuid a appears twice"),
        (b'{"gpus": [{"uuid": "GPU-\xff", "minor": 0}]}', "not UTF-8"),  # issue 11.2: was a traceback, exit 1
        (b'{"gpus": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested deeper than 32 levels"),
    ],
)
def test_malformed_state_at_start_refuses_to_start(
    start_plugin, mock_state: MockStateFile, content: bytes, problem: str
) -> None:
    mock_state.path.write_bytes(content)
    plugin = start_plugin()
    assert plugin.wait_exit() == 2
    out = plugin.log()
    assert str(mock_state.path) in out and problem in out, out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'{"gpus": "not a list"}', "'gpus' must be a list"),
        (b'{"gpus": ["\xff"]}', "not UTF-8"),  # issue 11.2: these killed the watcher for good
        (b"[" * 100_000, "nested deeper than 32 levels"),
    ],
)
def test_malformed_state_later_keeps_last_good_state(
    start_plugin, kubelet: FakeKubelet, mock_state: MockStateFile, content: bytes, problem: str
) -> None:
    plugin = start_plugin()
    reg = kubelet.next_registration()
    reg.next_update()
    mock_state.path.write_bytes(content)
    (line,) = [ln for ln in plugin.wait_log(problem).splitlines() if problem in ln]
    assert f"{mock_state.path}: " in line and "keeping the last good state" in line, line
    reg.assert_no_update(within=0.3)
    assert plugin.proc.poll() is None
    mock_state.xid(UUIDS[0], 79)  # the next good write is applied normally
    reg.wait_for(lambda h: h[UUIDS[0]] == UNHEALTHY and len(h) == 4, "GPU0 Unhealthy")


def test_kubelet_missing_at_start_retries_then_registers(start_plugin, kubelet_factory) -> None:
    plugin = start_plugin()
    plugin.wait_log("waiting for the kubelet", count=2)
    assert plugin.proc.poll() is None
    kubelet = kubelet_factory()
    reg = kubelet.next_registration()
    assert len(reg.next_update().devices) == 4


def test_registration_refused_exits_with_kubelet_message(start_plugin, kubelet_factory) -> None:
    kubelet_factory(refuse='the ResourceName "example.com/gpu" is already taken, says the kubelet')
    plugin = start_plugin()
    assert plugin.wait_exit() != 0
    assert "is already taken, says the kubelet" in plugin.log()


def test_a_socket_the_kubelet_holds_is_left_for_a_fresh_one(start_plugin, kubelet_factory, plugin_dir: Path) -> None:
    """A kubelet of 1.37+ refuses a Register naming a socket it still holds an endpoint on (an earlier instance's it
    has not seen gone: kubernetes/kubernetes#139338 documents it refusing such retries indefinitely): the plugin
    serves on a fresh socket and registers that, instead of exiting into a crash loop."""
    kubelet = kubelet_factory()
    held = default_socket_name(RESOURCE)
    kubelet.held = {held}
    plugin = start_plugin()
    reg = kubelet.next_registration()
    assert reg.request.endpoint != held and reg.request.endpoint.startswith("devplug-"), reg.request.endpoint
    assert len(reg.next_update().devices) == 4
    assert kubelet.refused == [f"{RESOURCE}: device plugin already connected: {plugin_dir / held}"]
    assert not (plugin_dir / held).exists(), "the refused socket is left behind"
    assert plugin.proc.poll() is None
    plugin.wait_log("serving on a fresh socket")


def test_nvml_real_without_library_points_to_mock(start_plugin, plugin_dir: Path, tmp_path: Path) -> None:
    plugin = start_plugin(
        "--plugin-dir",
        str(plugin_dir),
        "--nvml",
        "real",
        "--nvml-lib",
        str(tmp_path / "libnvidia-ml.so.1"),
        base=False,
    )
    assert plugin.wait_exit() not in (0, None)
    assert "--nvml mock" in plugin.log()


def test_mock_without_state_is_a_usage_error(start_plugin, plugin_dir: Path) -> None:
    plugin = start_plugin("--plugin-dir", str(plugin_dir), env={"DP_NVML": "mock"}, base=False)
    assert plugin.wait_exit() == 2
    assert "--mock-state" in plugin.log()
