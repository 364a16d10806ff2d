"""The device manager against the real GPU plugin subprocess (and a fake plugin for faults):
registration, ListAndWatch, health, grace period, allocation rules and texts, restart."""

from __future__ import annotations

import logging
import random
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from .dm_helpers import GPU, DmMockState, DmWaiter, FakePlugin, dm_capacity_probe, dm_gpu
from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.kubeletmodel.checkpoint import CHECKPOINT_NAME
from pytest_devplug.kubeletmodel.checkpointfile import read_checkpoint
from pytest_devplug.sim.devicemanager import DeviceManager
from pytest_devplug.errors import AdmissionError, PreStartError
from pytest_devplug.kubeletmodel.views import ContainerSpec, PodSpecView
from pytest_devplug.procs.process import PluginProcess
from pytest_devplug.sim.registration import is_extended_resource_name, plugin_socket_path

Make = Callable[..., tuple[DeviceManager, DmWaiter]]


def pod(uid: str, *containers: ContainerSpec) -> PodSpecView:
    return PodSpecView(uid=uid, name=f"pod-{uid}", namespace="default", containers=containers)


def gpus(n: int, name: str = "c") -> ContainerSpec:
    return ContainerSpec(name, {GPU: n})


def wait_cap(dm: DeviceManager, w: DmWaiter, cap: int | None, alloc: int | None, timeout: float = 10.0) -> None:
    w.until(f"capacity/allocatable {cap}/{alloc}", dm_capacity_probe(dm), lambda s: s == (cap, alloc), timeout)


def registered(dm: DeviceManager, w: DmWaiter, n: int = 2) -> None:
    wait_cap(dm, w, n, n)


def registered_in_checkpoint(dm: DeviceManager) -> dict[str, list[str] | None] | None:
    try:
        return read_checkpoint(dm.checkpoint_path).registered_devices
    except FileNotFoundError:
        return None


def admit_error(dm: DeviceManager, p: PodSpecView, c: ContainerSpec, **kw: Any) -> AdmissionError:
    with pytest.raises(AdmissionError) as exc:
        dm.admit_container(p, c, **kw)
    return exc.value


# --- registration -----------------------------------------------------------------------------


def test_registration_gives_capacity_equal_allocatable(dm_make: Make, dm_plugin: Callable[..., PluginProcess]) -> None:
    dm, w = dm_make()
    dm_plugin()
    registered(dm, w, 2)
    assert dm.resources() == [GPU]
    assert dm.device_health(GPU) == {"GPU-0000": "Healthy", "GPU-0001": "Healthy"}
    opts = dm.plugin_options(GPU)
    assert opts is not None and opts.get_preferred_allocation_available and not opts.pre_start_required
    assert dm.device_numa(GPU, "GPU-0001") == [1]
    assert w.changes > 0
    w.until(
        "healthy devices in the checkpoint",
        lambda: registered_in_checkpoint(dm),
        lambda r: r == {GPU: ["GPU-0000", "GPU-0001"]},
    )
    assert read_checkpoint(dm.checkpoint_path).pod_device_entries is None


def register_raw(sock_dir: Path, version: str, resource: str, endpoint: str = "x.sock") -> grpc.RpcError:
    from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"unix://{sock_dir / 'kubelet.sock'}") as ch:
        with pytest.raises(grpc.RpcError) as exc:
            pb_grpc.RegistrationStub(ch).Register(
                pb.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource), timeout=10
            )
    return exc.value


def test_register_rejects_unsupported_version_with_upstream_text(dm_make: Make, dm_dir: Path) -> None:
    dm, _ = dm_make()
    err = register_raw(dm_dir, "v1alpha", GPU)
    assert err.code() == grpc.StatusCode.UNKNOWN
    # upstream formats api.SupportedVersions (a Go array) with %q
    assert (
        err.details() == 'requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]'
    )
    assert dm.resources() == []


@pytest.mark.parametrize(
    "name",
    [
        "gpu",
        "kubernetes.io/gpu",
        "foo.kubernetes.io/gpu",
        "requests.example.com/gpu",
        "example.com/gpu/x",
        "Example.com/gpu",
        "example.com/-gpu",
        "/gpu",
        "example.com/" + "g" * 64,
        "example.com/gpu\n",
        "example.com/has space",
        "e" * 250 + ".com/gpu",
    ],
)
def test_register_rejects_invalid_resource_names(dm_make: Make, dm_dir: Path, name: str) -> None:
    dm, _ = dm_make()
    err = register_raw(dm_dir, "v1beta1", name)
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == f'the ResourceName "{name}" is invalid'
    assert dm.resources() == []


@pytest.mark.parametrize("name", ["example.com/gpu", "nvidia.com/gpu", "a.b/c_d.e-f", "example.com/" + "g" * 63])
def test_extended_resource_names_accepted(name: str) -> None:
    assert is_extended_resource_name(name)


def test_failing_get_device_plugin_options_is_not_registered(dm_make: Make, dm_fake: Callable[..., FakePlugin]) -> None:
    dm, _ = dm_make()
    f = dm_fake()
    f.options_error = "options broken"
    with pytest.raises(grpc.RpcError) as exc:
        f.register()
    assert exc.value.code() == grpc.StatusCode.UNKNOWN
    assert exc.value.details() == "failed to get device plugin options: rpc error: code = Unknown desc = options broken"
    assert dm.resources() == []
    assert dm.capacity() == ({}, {}, [])
    assert f.law_calls == 0


def test_register_fails_when_plugin_socket_cannot_be_dialed(dm_make: Make, dm_dir: Path) -> None:
    dm, _ = dm_make()
    dm.dial_timeout = 0.3
    err = register_raw(dm_dir, "v1beta1", GPU, endpoint="nobody-serves-this.sock")
    assert err.details() == "failed to dial device plugin: context deadline exceeded"
    assert dm.resources() == []


def _silent_socket(path: Path) -> socket.socket:
    """A socket that listens but never answers: the kubelet's dial of it hangs until its timeout."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen(16)
    return s


def test_plugins_stuck_in_their_dial_do_not_hold_up_a_healthy_registration(
    dm_make: Make, dm_dir: Path, dm_fake: Callable[..., FakePlugin], caplog: pytest.LogCaptureFixture
) -> None:
    """grpc-go serves each Register on its own goroutine: a healthy plugin registers while eight
    others still wait out their dial (the embedded kubelet served four at a time)."""
    caplog.set_level(logging.INFO)
    dm, w = dm_make()
    dm.dial_timeout = 5.0
    silent = [_silent_socket(dm_dir / f"stuck{i}.sock") for i in range(8)]
    done: list[str] = []

    def register_stuck(i: int) -> None:
        register_raw(dm_dir, "v1beta1", f"example.com/stuck{i}", endpoint=f"stuck{i}.sock")
        done.append(f"stuck{i}")

    threads = [threading.Thread(target=register_stuck, args=(i,), daemon=True) for i in range(8)]
    try:
        for t in threads:
            t.start()
        w.until(
            "the kubelet serving 8 Register calls",
            lambda: sum("Got registration request" in r.getMessage() for r in caplog.records),
            lambda n: n == 8,
        )
        f = dm_fake()
        f.register()
        done.append("healthy")
        registered(dm, w, 2)
        assert done == ["healthy"], "the healthy plugin waited for a stuck one"
    finally:
        for t in threads:
            t.join(timeout=15)
        for s in silent:
            s.close()
    assert sorted(done) == ["healthy"] + [f"stuck{i}" for i in range(8)]
    assert dm.resources() == [GPU]


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [("/abs/p.sock", "abs/p.sock"), ("a/../p.sock", "p.sock"), ("./p.sock", "p.sock"), ("p.sock", "p.sock")],
)
def test_endpoint_is_joined_to_the_plugin_dir_like_filepath_join(dm_dir: Path, endpoint: str, expected: str) -> None:
    assert plugin_socket_path(dm_dir, endpoint) == dm_dir / expected


def test_absolute_endpoint_is_dialled_inside_the_plugin_dir(
    dm_make: Make, dm_dir: Path, dm_fake: Callable[..., FakePlugin]
) -> None:
    """Upstream dials ``filepath.Join(socketDir, endpoint)``: ``/x.sock`` is ``<dir>/x.sock``."""
    dm, w = dm_make()
    outside = dm_dir.parent / "outside.sock"
    decoy = _silent_socket(outside)  # what ``Path(dir) / "/abs"`` used to dial
    try:
        f = dm_fake("inside.sock")
        with grpc.insecure_channel(f"unix://{dm_dir / 'kubelet.sock'}") as ch:
            from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pb_grpc

            pb_grpc.RegistrationStub(ch).Register(
                pb.RegisterRequest(version="v1beta1", endpoint="/inside.sock", resource_name=GPU), timeout=10
            )
        registered(dm, w, 2)
        assert f.law_calls == 1
        dm.dial_timeout = 0.3
        err = register_raw(dm_dir, "v1beta1", "example.com/out", endpoint=str(outside))
        assert err.details() == "failed to dial device plugin: context deadline exceeded"
    finally:
        decoy.close()


def test_start_removes_only_sockets(dm_dir: Path, dm_make: Make) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(dm_dir / "stale.sock"))
    stale.close()
    (dm_dir / "notes.txt").write_text("keep")
    (dm_dir / "subdir").mkdir()
    dm_make()
    assert not (dm_dir / "stale.sock").exists()
    assert (dm_dir / "notes.txt").read_text() == "keep"
    assert (dm_dir / "subdir").is_dir()
    assert (dm_dir / "kubelet.sock").is_socket()


# --- ListAndWatch, health, grace period ---------------------------------------------------------


def test_list_and_watch_end_marks_unhealthy_no_redial_then_removed(
    dm_make: Make, dm_fake: Callable[..., FakePlugin]
) -> None:
    dm, w = dm_make(grace_period=1.0)
    f = dm_fake()
    f.register()
    registered(dm, w, 2)
    f.end_stream()
    wait_cap(dm, w, 2, 0)
    assert dm.device_health(GPU) == {"dev-0": "Unhealthy", "dev-1": "Unhealthy"}
    removed: list[list[str]] = []

    def probe() -> tuple[dict[str, int], list[str]]:
        cap, _, rem = dm.capacity()
        removed.append(rem)
        return cap, rem

    w.until("resource removed after the grace period", probe, lambda s: s == ({}, [GPU]), timeout=5)
    assert dm.capacity() == ({}, {}, [])  # reported once, then forgotten
    assert dm.resources() == []
    assert f.law_calls == 1  # the kubelet never re-dials
    assert registered_in_checkpoint(dm) == {}


def test_plugin_stopped_gives_zero_of_n_then_zero_of_zero(
    dm_make: Make, dm_plugin: Callable[..., PluginProcess]
) -> None:
    dm, w = dm_make()
    p = dm_plugin()
    registered(dm, w, 2)
    p.stop()
    wait_cap(dm, w, 2, 0)
    assert dm.resources() == [GPU]
    dm.grace_period = 0.3  # observed 0/N under the default; now let the grace period run out
    w.until("resource removed", lambda: dm.capacity()[2], lambda r: r == [GPU], timeout=5)
    assert dm.capacity() == ({}, {}, [])


def test_unhealthy_then_healthy_again(
    dm_make: Make, dm_plugin: Callable[..., PluginProcess], dm_state: DmMockState
) -> None:
    dm_state.write([dm_gpu(0, 0)])
    dm, w = dm_make()
    dm_plugin()
    registered(dm, w, 1)
    dm_state.set("GPU-0000", lost=True)
    wait_cap(dm, w, 1, 0)
    assert dm.device_health(GPU) == {"GPU-0000": "Unhealthy"}
    w.until("checkpoint without healthy devices", lambda: registered_in_checkpoint(dm), lambda r: r == {GPU: []})
    dm_state.set("GPU-0000", lost=False)
    wait_cap(dm, w, 1, 1)


def test_reregistration_replaces_endpoint_and_old_stream_end_is_ignored(
    dm_make: Make, dm_fake: Callable[..., FakePlugin]
) -> None:
    dm, w = dm_make()
    a = dm_fake("a.sock")
    a.register()
    registered(dm, w, 2)
    b = dm_fake("b.sock", devices=[pb.Device(ID=f"b-{i}", health="Healthy") for i in range(3)])
    b.register()
    registered(dm, w, 3)
    a.stop()  # the replaced endpoint's stream ends: must not touch b's devices
    changes = w.changes
    b.set_devices([pb.Device(ID=f"b-{i}", health="Healthy") for i in range(3)])
    w.until("a ListAndWatch update from b", lambda: w.changes, lambda c: c > changes)
    assert dm.capacity()[:2] == ({GPU: 3}, {GPU: 3})
    assert set(dm.device_health(GPU)) == {"b-0", "b-1", "b-2"}


def test_second_instance_failing_its_registration_leaves_the_first_serving(
    dm_make: Make, dm_fake: Callable[..., FakePlugin]
) -> None:
    """Upstream's "DP2 takes long time to start working": a second instance whose GetDevicePluginOptions fails
    is not registered and the first one's endpoint keeps serving (allocations go to it); a third instance then
    takes over, and the first one's exit leaves it registered."""
    dm, w = dm_make()
    dp1 = dm_fake("dp1.sock")
    dp1.register()
    registered(dm, w, 2)
    dp2 = dm_fake("dp2.sock")
    dp2.options_error = "GetDevicePluginOptions failed"
    with pytest.raises(grpc.RpcError) as exc:
        dp2.register()
    assert "failed to get device plugin options" in str(exc.value.details())
    assert dm.capacity()[:2] == ({GPU: 2}, {GPU: 2}) and dp2.law_calls == 0
    p = pod("u1", gpus(1))
    dm.admit_container(p, p.containers[0])
    assert len(dp1.allocate_calls) == 1
    dp3 = dm_fake("dp3.sock")
    dp3.register()
    w.until("dp3's stream", lambda: dp3.law_calls, lambda n: n == 1)
    dp1.stop()
    q = pod("u2", gpus(1))
    dm.admit_container(q, q.containers[0])
    assert len(dp3.allocate_calls) == 1 and len(dp1.allocate_calls) == 1
    assert dm.capacity()[:2] == ({GPU: 2}, {GPU: 2})


# --- allocation -----------------------------------------------------------------------------------


def test_allocate_records_devices_options_and_checkpoint(
    dm_make: Make, dm_plugin: Callable[..., PluginProcess]
) -> None:
    dm, w = dm_make()
    dm_plugin()
    registered(dm, w)
    p = pod("u1", gpus(1))
    dm.admit_container(p, p.containers[0])
    devs = dm.container_devices("u1", "c")[GPU]
    assert len(devs) == 1
    assert dm.container_options("u1", "c").envs["NVIDIA_VISIBLE_DEVICES"] == devs[0]
    assert dm.pod_devices() == {"u1": {"c": {GPU: devs}}}
    (entry,) = read_checkpoint(dm.checkpoint_path).pod_device_entries or []
    assert (entry.pod_uid, entry.container_name, entry.resource_name) == ("u1", "c", GPU)
    assert entry.device_ids == {dm.device_numa(GPU, devs[0])[0]: devs}
    resp = pb.ContainerAllocateResponse.FromString(entry.alloc_resp or b"")
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == devs[0]
    # a second container gets the other device; a third finds none
    q = pod("u2", gpus(1))
    dm.admit_container(q, q.containers[0])
    assert set(dm.container_devices("u2", "c")[GPU]) | set(devs) == {"GPU-0000", "GPU-0001"}
    r = pod("u3", gpus(1))
    err = admit_error(dm, r, r.containers[0])
    assert err.reason == "UnexpectedAdmissionError"
    assert err.message == (
        f"Allocate failed due to requested number of devices unavailable for {GPU}. Requested: 1, Available: 0, "
        "which is unexpected"
    )
    # freeing u1 (no longer active) makes its device available again
    dm.sources_ready = True
    dm.remove_stale_pods({"u2"})
    dm.admit_container(r, r.containers[0])
    assert dm.container_devices("u3", "c") == {GPU: devs}


def test_readmission_reuses_devices_without_rpc(dm_make: Make, dm_fake: Callable[..., FakePlugin]) -> None:
    dm, w = dm_make()
    f = dm_fake()
    f.register()
    registered(dm, w)
    p = pod("u1", gpus(1))
    dm.admit_container(p, p.containers[0])
    dm.admit_container(p, p.containers[0])  # container restart
    assert len(f.allocate_calls) == 1
    bigger = pod("u1", gpus(2))
    err = admit_error(dm, bigger, bigger.containers[0])
    assert err.message == (
        f'Allocate failed due to pod "u1" container "c" changed request for resource "{GPU}" from 1 to 2, '
        "which is unexpected"
    )


def test_unknown_resource_is_not_a_device_plugin_resource(dm_make: Make, dm_fake: Callable[..., FakePlugin]) -> None:
    dm, w = dm_make()
    dm_fake().register()
    registered(dm, w)
    p = pod("u1", ContainerSpec("c", {"example.com/other": 1}))
    dm.admit_container(p, p.containers[0])  # upstream skips resources no plugin ever advertised
    assert dm.container_devices("u1", "c") == {}


def test_no_healthy_and_unregistered_errors(dm_make: Make, dm_fake: Callable[..., FakePlugin]) -> None:
    dm, w = dm_make()
    f = dm_fake()
    f.register()
    registered(dm, w)
    holder = pod("u0", gpus(1))
    dm.admit_container(holder, holder.containers[0])
    f.end_stream()
    wait_cap(dm, w, 2, 0)
    p = pod("u1", gpus(1))
    assert admit_error(dm, p, p.containers[0]).message == (
        f"Allocate failed due to no healthy devices present; cannot allocate unhealthy devices {GPU}, "
        "which is unexpected"
    )
    dm.grace_period = 0.3
    w.until("removal after grace", lambda: dm.capacity()[2], lambda r: r == [GPU], timeout=5)
    # u0 still holds a device of the removed resource, so it is still a device-plugin resource
    assert admit_error(dm, p, p.containers[0]).message == (
        f"Allocate failed due to cannot allocate unregistered device {GPU}, which is unexpected"
    )


def test_previously_allocated_devices_no_longer_healthy(
    dm_make: Make, dm_plugin: Callable[..., PluginProcess], dm_state: DmMockState
) -> None:
    dm, w = dm_make()
    dm_plugin()
    registered(dm, w)
    p = pod("u1", gpus(1))
    dm.admit_container(p, p.containers[0])
    (dev,) = dm.container_devices("u1", "c")[GPU]
    dm_state.set(dev, lost=True)
    wait_cap(dm, w, 2, 1)
    assert admit_error(dm, p, p.containers[0]).message == (
        "Allocate failed due to previously allocated devices are no longer healthy; "
        f"cannot allocate unhealthy devices {GPU}, which is unexpected"
    )


def test_allocate_rpc_failure_rolls_back(
    dm_make: Make, dm_plugin: Callable[..., PluginProcess], dm_state: DmMockState
) -> None:
    dm_state.write([dm_gpu(0, 0, fail_allocate=True)])
    dm, w = dm_make()
    dm_plugin()
    registered(dm, w, 1)
    p = pod("u1", gpus(1))
    err = admit_error(dm, p, p.containers[0])
    assert err.reason == "UnexpectedAdmissionError"
    assert err.message.startswith("Allocate failed due to rpc error: code = ")
    assert err.message.endswith(", which is unexpected")
    assert dm.pod_devices() == {}
    dm_state.set("GPU-0000", fail_allocate=False)
    q = pod("u2", gpus(1))

    def admit_q() -> str:
        """'' once admitted; while the plugin has not yet reloaded its mock state, the Allocate error."""
        try:
            dm.admit_container(q, q.containers[0])
        except AdmissionError as e:
            assert "fail_allocate" in e.message, e.message  # anything else: the device leaked
            return e.message
        return ""

    w.until("the plugin reloading its mock state", admit_q, lambda m: m == "")  # the device was not leaked
    assert dm.container_devices("u2", "c") == {GPU: ["GPU-0000"]}


def test_allocate_with_zero_responses_fails(dm_make: Make, dm_fake: Callable[..., FakePlugin]) -> None:
    dm, w = dm_make()
    f = dm_fake()
    f.allocate_empty = True
    f.register()
    registered(dm, w)
    p = pod("u1", gpus(1))
    assert admit_error(dm, p, p.containers[0]).message == (
        "Allocate failed due to no containers return in allocation response "
        "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}, which is unexpected"
    )
    f.allocate_empty = False
    q = pod("u2", gpus(2))
    dm.admit_container(q, q.containers[0])
    assert dm.container_devices("u2", "c") == {GPU: ["dev-0", "dev-1"]}


def test_preferred_allocation_first_answer_used_and_validated(
    dm_make: Make, dm_fake: Callable[..., FakePlugin]
) -> None:
    dm, w = dm_make()
    f = dm_fake(devices=[pb.Device(ID=f"dev-{i}", health="Healthy") for i in range(4)])
    f.options = pb.DevicePluginOptions(get_preferred_allocation_available=True)
    f.preferred = ["dev-3", "dev-2"]
    f.register()
    registered(dm, w, 4)
    p = pod("u1", gpus(2))
    dm.admit_container(p, p.containers[0])
    assert dm.container_devices("u1", "c") == {GPU: ["dev-2", "dev-3"]}
    (req,) = f.preferred_calls
    assert sorted(req.available_deviceIDs) == ["dev-0", "dev-1", "dev-2", "dev-3"]
    assert list(req.must_include_deviceIDs) == [] and req.allocation_size == 2
    # an answer naming taken or unknown devices is ignored; the kubelet fills up itself
    f.preferred = ["dev-3", "bogus"]
    q = pod("u2", gpus(2))
    dm.admit_container(q, q.containers[0])
    assert dm.container_devices("u2", "c") == {GPU: ["dev-0", "dev-1"]}


def test_init_container_devices_are_reused_sidecar_devices_are_not(
    dm_make: Make, dm_fake: Callable[..., FakePlugin]
) -> None:
    dm, w = dm_make()
    dm_fake().register()
    registered(dm, w)
    init = ContainerSpec("init", {GPU: 2}, init=True)
    app = ContainerSpec("app", {GPU: 2})
    p = pod("u1", init, app)
    dm.admit_container(p, init)
    dm.admit_container(p, app)
    assert dm.container_devices("u1", "app") == dm.container_devices("u1", "init") == {GPU: ["dev-0", "dev-1"]}
    side = ContainerSpec("side", {GPU: 1}, init=True, sidecar=True)
    app1 = ContainerSpec("app", {GPU: 2})
    q = pod("u2", side, app1)
    dm.sources_ready = True
    dm.remove_stale_pods({"u2"})
    dm.admit_container(q, side)
    err = admit_error(dm, q, app1)
    assert "requested number of devices unavailable" in err.message and "Requested: 2, Available: 1" in err.message


def test_pre_start_container(
    dm_make: Make, dm_plugin: Callable[..., PluginProcess], dm_fake: Callable[..., FakePlugin]
) -> None:
    dm, w = dm_make()
    proc = dm_plugin("--pre-start-required")
    registered(dm, w)
    p = pod("u1", gpus(1))
    with pytest.raises(PreStartError, match=r"^no devices found allocated in local cache for pod u1, container c, "):
        dm.pre_start_container(p, p.containers[0])
    dm.admit_container(p, p.containers[0])
    dm.pre_start_container(p, p.containers[0])
    (dev,) = dm.container_devices("u1", "c")[GPU]
    w.until("PreStartContainer in the plugin log", proc.log, lambda t: f"PreStartContainer: devices {dev}" in t)


def test_pre_start_failure_and_skip(dm_make: Make, dm_fake: Callable[..., FakePlugin]) -> None:
    dm, w = dm_make()
    f = dm_fake()
    f.options = pb.DevicePluginOptions(pre_start_required=True)
    f.prestart_error = "cannot prepare"
    f.register()
    registered(dm, w)
    p = pod("u1", gpus(1))
    dm.admit_container(p, p.containers[0])
    with pytest.raises(PreStartError) as exc:
        dm.pre_start_container(p, p.containers[0])
    assert (
        str(exc.value)
        == "device plugin PreStartContainer rpc failed with err: rpc error: code = Unknown desc = cannot prepare"
    )
    # a new instance registers on a socket of its own (1.37 refuses one the kubelet holds), without
    # pre_start_required: the resource's options are the newest registration's, so no call any more
    g = dm_fake("g.sock")
    g.register()
    w.until("g's stream", lambda: g.law_calls, lambda n: n == 1)
    dm.pre_start_container(p, p.containers[0])
    assert len(f.prestart_calls) == 1 and g.prestart_calls == []


def test_container_options_merge_first_setting_wins(dm_make: Make, dm_fake: Callable[..., FakePlugin]) -> None:
    dm, w = dm_make()
    a = dm_fake("a.sock", resource="a.example.com/dev")
    a.envs = {"SHARED": "from-a", "A": "1"}
    b = dm_fake("b.sock", resource="b.example.com/dev")
    b.envs = {"SHARED": "from-b", "B": "1"}
    a.register()
    b.register()
    w.until("both resources", lambda: dm.capacity()[1], lambda c: c == {"a.example.com/dev": 2, "b.example.com/dev": 2})
    c = ContainerSpec("c", {"a.example.com/dev": 1, "b.example.com/dev": 1})
    dm.admit_container(pod("u1", c), c)
    assert dm.container_options("u1", "c").envs == {"SHARED": "from-a", "A": "1", "B": "1"}


def test_concurrent_admissions_never_double_allocate(dm_make: Make, dm_fake: Callable[..., FakePlugin]) -> None:
    dm, w = dm_make()
    f = dm_fake(devices=[pb.Device(ID=f"dev-{i}", health="Healthy") for i in range(8)])
    f.options = pb.DevicePluginOptions(get_preferred_allocation_available=True)
    f.preferred = ["dev-0", "dev-1"]  # everyone prefers the same devices: a race magnet
    f.register()
    registered(dm, w, 8)
    dm.sources_ready = True
    active: set[str] = set()
    lock = threading.Lock()
    problems: list[str] = []
    rejected = 0

    def check() -> None:
        owners: dict[str, str] = {}
        for uid, cs in dm.pod_devices().items():
            for d in cs["c"][GPU]:
                if d in owners:
                    problems.append(f"{d} held by {owners[d]} and {uid}")
                owners[d] = uid

    def worker(k: int) -> None:
        nonlocal rejected
        rnd = random.Random(k)
        for i in range(25):
            uid = f"w{k}-{i}"
            p = pod(uid, gpus(rnd.choice([1, 2, 3])))
            with lock:
                active.add(uid)
            try:
                dm.admit_container(p, p.containers[0])
            except AdmissionError as err:
                assert "requested number of devices unavailable" in err.message, err.message
                with lock:
                    rejected += 1
            check()
            with lock:
                active.discard(uid)
                snapshot = set(active)
            dm.remove_stale_pods(snapshot)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "workers did not finish within 60 s"
    assert problems == []
    dm.remove_stale_pods(set())
    assert dm.pod_devices() == {}
    assert len(f.allocate_calls) + rejected == 200
    big = pod("all", gpus(8))
    dm.admit_container(big, big.containers[0])  # nothing leaked by rejections or races


def test_numa_node_minus_one_is_filed_as_no_topology_before_and_after_a_restart(
    dm_dir: Path, dm_make: Make, dm_fake: Callable[..., FakePlugin]
) -> None:
    """A device the plugin reports on NUMA node ``-1`` is filed under ``-1``, the key of a device without topology
    (``allocateContainerResources``), so pod-resources lists it without topology (``getContainerDevices`` skips
    ``nodeWithoutTopology``), before a restart and after it from the checkpoint alike; the allocatable list keeps the
    device as the plugin sent it."""
    dm, w = dm_make()
    dev = pb.Device(ID="odd", health="Healthy")
    dev.topology.nodes.add(ID=-1)
    f = dm_fake(devices=[dev])
    f.register()
    registered(dm, w, 1)
    p = pod("u1", gpus(1))
    dm.admit_container(p, p.containers[0])
    assert dm.container_device_topology("u1", "c") == {GPU: {"odd": []}}
    assert dm.allocatable_devices() == {GPU: [("odd", -1)]}
    (entry,) = read_checkpoint(dm.checkpoint_path).pod_device_entries or []
    assert entry.device_ids == {-1: ["odd"]}
    dm.stop()
    again, _ = dm_make()
    assert again.container_device_topology("u1", "c") == {GPU: {"odd": []}}


# --- restart ---------------------------------------------------------------------------------------


def test_restart_rebuilds_from_checkpoint(dm_dir: Path, dm_make: Make, dm_plugin: Callable[..., PluginProcess]) -> None:
    dm, w = dm_make()
    proc = dm_plugin()
    registered(dm, w)
    p = pod("u1", gpus(1, "running"), gpus(1, "stopped"))
    dm.admit_container(p, p.containers[0])
    dm.admit_container(p, p.containers[1])
    before = dm.pod_devices()
    dm.stop()
    allocs = proc.log().count("Allocate:")

    dm2 = DeviceManager(dm_dir, grace_period=300.0, on_change=w.notify)
    dm2.start()
    try:
        assert dm2.resources() == [GPU]  # a stopped endpoint from RegisteredDevices
        assert dm2.pod_devices() == before
        assert dm2.container_options("u1", "running").envs["NVIDIA_VISIBLE_DEVICES"] == before["u1"]["running"][GPU][0]
        dm2.admit_container(p, p.containers[0], container_running=True)  # keeps its devices, no RPC
        err = admit_error(dm2, p, p.containers[1])
        assert err.reason == "UnexpectedAdmissionError"
        assert err.message == (
            f"Allocate failed due to no healthy devices present; cannot allocate unhealthy devices {GPU}, "
            "which is unexpected"
        )
        # the plugin notices the new kubelet.sock and registers again
        wait_cap(dm2, w, 2, 2, timeout=15)
        dm2.sources_ready = True
        dm2.admit_container(p, p.containers[1])  # reuses its checkpointed device, no RPC
        assert dm2.pod_devices() == before
        assert proc.log().count("Allocate:") == allocs
    finally:
        dm2.stop()


def test_corrupt_checkpoint_starts_empty(dm_dir: Path, dm_make: Make, caplog: pytest.LogCaptureFixture) -> None:
    dm, _ = dm_make()
    (dm_dir / CHECKPOINT_NAME).write_text(
        '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"example.com/gpu":["a"]}},"Checksum":1}'
    )
    dm.stop()
    with caplog.at_level(logging.ERROR):
        dm2 = DeviceManager(dm_dir)
        dm2.start()
    try:
        assert dm2.resources() == []
        assert "checksum mismatch" in caplog.text
    finally:
        dm2.stop()
