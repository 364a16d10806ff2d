"""In-process tests of the plugin's pure logic and of the mock NVML as pynvml sees it."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from devplug_gpu_plugin import cli, watch
from devplug_gpu_plugin.allocation import (
    AllocationConfig,
    AllocationError,
    cdi_spec,
    container_response,
    ensure_dev_nodes,
    preferred_allocation,
    replica_ids,
)
from devplug_gpu_plugin.devices import DeviceState, GpuInfo, Probe, UnsafeDeviceIdError
from devplug_gpu_plugin.health import HealthMonitor
from devplug_gpu_plugin.mock_faults import MockFaults
from pytest_devplug.nvml import STATE_ENV, mock_library

from .gpu_plugin_helpers import UUIDS, MockStateFile


def infos(numa: list[int | None]) -> dict[str, GpuInfo]:
    return {f"g{i}": GpuInfo(uuid=f"g{i}", name="x", minor=i, numa_node=n) for i, n in enumerate(numa)}


# ---- preferred allocation --------------------------------------------------------------------
class TestPreferredAllocation:
    gpus = infos([0, 0, 1, 1, 1, None])

    def pick(self, available: list[str], must: list[str], size: int) -> list[str]:
        return preferred_allocation(available, must, size, self.gpus)

    def test_exact_size_and_stable_minor_order(self) -> None:
        assert self.pick(["g4", "g3", "g2"], [], 2) == ["g2", "g3"]
        assert self.pick(["g1", "g0"], [], 1) == ["g0"]
        assert self.pick(["g0", "g1"], [], 0) == []

    def test_node_with_fewest_leftovers_wins(self) -> None:
        # node 0 holds 2 (no leftover), node 1 holds 3 (one leftover): node 0
        assert self.pick(["g2", "g3", "g4", "g0", "g1"], [], 2) == ["g0", "g1"]
        assert self.pick(["g0", "g2", "g3", "g4"], [], 2) == ["g2", "g3"]  # node 0 cannot hold 2

    def test_must_include_kept_and_its_node_preferred(self) -> None:
        assert self.pick(["g0", "g1", "g2", "g3", "g4"], ["g4"], 2) == ["g4", "g2"]
        assert self.pick(["g0", "g1", "g2", "g3", "g4"], ["g1", "g4"], 3) == ["g1", "g4", "g0"]

    def test_spills_to_fullest_node_then_no_numa(self) -> None:
        got = self.pick(["g0", "g2", "g3", "g4", "g5"], [], 5)
        assert got[:3] == ["g2", "g3", "g4"] and got[3:] == ["g0", "g5"]

    def test_must_include_larger_than_size_is_truncated(self) -> None:
        assert self.pick(["g0", "g1", "g2"], ["g2", "g0", "g1"], 2) == ["g0", "g1"]

    def test_unknown_ids_come_last(self) -> None:
        assert self.pick(["zz", "g3"], [], 2) == ["g3", "zz"]


# ---- device state / health policy ------------------------------------------------------------
def test_xid_is_sticky_until_lost_and_back() -> None:
    state = DeviceState()
    info = GpuInfo("u", "x", 0, 0)
    state.update_inventory([Probe(info, lost=False)])
    v = state.snapshot().version
    assert state.mark_xid("u", 79) == ["u Healthy -> Unhealthy (Xid 79)"]
    assert state.wait_for_change(v, 1).version == v + 1
    state.update_inventory([Probe(info, lost=False)])
    assert not state.get("u").healthy  # type: ignore[union-attr]
    state.update_inventory([Probe(info, lost=True)])
    state.update_inventory([Probe(info, lost=False)])
    assert state.get("u").healthy  # type: ignore[union-attr]
    assert state.mark_xid("nope", 79) == []


# ---- Allocate responses ----------------------------------------------------------------------
def _snapshot() -> DeviceState:
    state = DeviceState()
    state.update_inventory([Probe(GpuInfo(f"g{i}", "x", i, i // 2), lost=False) for i in range(3)])
    return state


def test_container_response_envvar_and_errors() -> None:
    snap = _snapshot().snapshot()
    cfg = AllocationConfig("v.io/gpu", dev_root="/host/dev")
    r = container_response(["g2"], snap, cfg)
    assert dict(r.envs) == {"NVIDIA_VISIBLE_DEVICES": "g2"}
    assert [(d.host_path, d.container_path) for d in r.devices][-1] == ("/host/dev/nvidia2", "/dev/nvidia2")
    with pytest.raises(AllocationError, match="unknown device gX") as exc:
        container_response(["g0", "gX"], snap, cfg)
    assert exc.value.code == "invalid_argument"
    with pytest.raises(AllocationError, match="allocating GPU g1 failed: boom") as exc:
        container_response(["g0", "g1"], snap, cfg, fault=lambda u: "boom" if u == "g1" else None)
    assert exc.value.code == "internal"


def test_replicas_share_their_gpus_device_node() -> None:
    """--replicas 2: IDs <uuid>::0/1; two replicas of one GPU get its node once per ID, its UUID once."""
    snap = _snapshot().snapshot()
    cfg = AllocationConfig("v.io/gpu", replicas=2)
    assert replica_ids("g0", 2) == ["g0::0", "g0::1"] and replica_ids("g0", 1) == ["g0"]
    r = container_response(["g1::1", "g1::0"], snap, cfg)
    assert dict(r.envs) == {"NVIDIA_VISIBLE_DEVICES": "g1"}
    assert [d.container_path for d in r.devices].count("/dev/nvidia1") == 2
    for bad in ("g1", "g1::2"):  # not advertised with 2 replicas
        with pytest.raises(AllocationError, match=f"unknown device {bad} "):
            container_response([bad], snap, cfg)
    with pytest.raises(AllocationError, match="unknown device g1::0 "):
        container_response(["g1::0"], snap, AllocationConfig("v.io/gpu"))
    with pytest.raises(AllocationError, match="allocating GPU g1 failed: boom"):
        container_response(["g1::1"], snap, cfg, fault=lambda u: "boom" if u == "g1" else None)


def test_cdi_spec_shape() -> None:
    gpus = _snapshot().snapshot().gpus
    spec = cdi_spec(AllocationConfig("v.io/gpu", strategies=("cdi-cri",), dev_root="/d"), gpus)
    assert spec["kind"] == "v.io/gpu"
    assert [d["name"] for d in spec["devices"]] == ["g0", "g1", "g2"]
    assert "mounts" not in spec["containerEdits"]


def test_ensure_dev_nodes_creates_missing_only(tmp_path: Path) -> None:
    (tmp_path / "nvidia0").write_text("keep")
    created = ensure_dev_nodes(str(tmp_path), [0, 1])
    assert sorted(os.path.basename(p) for p in created) == ["nvidia-uvm", "nvidia1", "nvidiactl"]
    assert (tmp_path / "nvidia0").read_text() == "keep"
    assert ensure_dev_nodes(str(tmp_path), [0, 1]) == []


def test_ensure_dev_nodes_never_follows_a_symlink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11: the node was checked, then opened and chmod-ed 0666 by name, so a symlink put
    there in between made the plugin create or open its target and make it world-writable."""
    target = tmp_path / "target"
    target.write_text("secret")
    target.chmod(0o600)
    dev = tmp_path / "dev"
    dev.mkdir()

    def no_mknod(*_: object) -> None:
        raise PermissionError("not privileged")  # take the regular-file fallback

    real_lexists = os.path.lexists

    def lexists_then_race(path: str) -> bool:
        seen = real_lexists(path)
        if path.endswith("nvidia1") and not seen:
            os.symlink(target, path)  # planted between the check and the create
        return seen

    monkeypatch.setattr(os, "mknod", no_mknod)
    monkeypatch.setattr(os.path, "lexists", lexists_then_race)
    created = ensure_dev_nodes(str(dev), [0, 1])
    assert str(dev / "nvidia1") not in created and (dev / "nvidia1").is_symlink()
    assert (target.stat().st_mode & 0o777, target.read_text()) == (0o600, "secret")
    assert (dev / "nvidia0").stat().st_mode & 0o777 == 0o666
    assert str(dev / "nvidia0") in created


@pytest.mark.parametrize(
    "uuid", ["../../../../etc/passwd", "GPU-a,GPU-b", "GPU a", "", ".hidden", "-rf", "GPU-\n", "x" * 256]
)
def test_unsafe_uuids_are_refused_and_the_last_good_list_kept(uuid: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 11: a UUID became a volume-mount path and an item of NVIDIA_VISIBLE_DEVICES."""
    state = DeviceState()
    good = [Probe(GpuInfo(uuid=f"GPU-{i}", name="x", minor=i, numa_node=0), lost=False) for i in range(2)]
    state.update_inventory(good)
    before = state.snapshot()
    bad = [good[0], Probe(GpuInfo(uuid=uuid, name="x", minor=7, numa_node=0), lost=False)]
    with pytest.raises(UnsafeDeviceIdError, match="GPU 7 reports UUID"):
        state.update_inventory(bad)
    assert state.snapshot() == before

    class BadProbe(HealthMonitor):
        def probe(self) -> list[Probe]:
            return bad

    BadProbe(state).refresh()
    assert state.snapshot() == before
    assert "not safe as a device ID" in caplog.text and "keeping the last device list" in caplog.text


# ---- CLI -------------------------------------------------------------------------------------
def test_cli_env_equivalents_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("DP_"):
            monkeypatch.delenv(k)
    args = cli.parse_args(["--nvml", "mock", "--mock-state", "/s.json"])
    assert args.plugin_dir == "/var/lib/kubelet/device-plugins"
    assert args.resource_name == "nvidia.com/gpu"
    assert args.socket_name is None, "chosen at start: devplug-<resource>.sock unless another instance serves on it"
    assert args.second_resource is None
    assert args.device_list_strategy == ("envvar",)
    assert args.ignored_xids == (13, 31, 43, 45, 68, 109)
    assert args.cdi_spec_dir == "/var/run/cdi" and args.dev_root == "/dev"
    assert args.pre_start_required is False and args.create_dev_nodes is False
    monkeypatch.setenv("DP_NVML", "mock")
    monkeypatch.setenv("DP_MOCK_STATE", "/m.json")
    monkeypatch.setenv("DP_RESOURCE_NAME", "example.com/gpu")
    monkeypatch.setenv("DP_PRE_START_REQUIRED", "true")
    monkeypatch.setenv("DP_DEVICE_LIST_STRATEGY", "cdi-cri,volume-mounts")
    monkeypatch.setenv("DP_IGNORED_XIDS", "")
    monkeypatch.setenv("DP_SOCKET_NAME", "x.sock")
    args = cli.parse_args([])
    assert (args.nvml, args.mock_state, args.resource_name) == ("mock", "/m.json", "example.com/gpu")
    assert cli.parse_args(["--socket-name", "", "--second-resource", "example.com/mig-1g=2"]).second_resource == (
        "example.com/mig-1g",
        2,
    )
    assert args.pre_start_required is True
    assert args.device_list_strategy == ("cdi-cri", "volume-mounts")
    assert args.ignored_xids == ()
    assert args.socket_name == "x.sock"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device-list-strategy", "bogus"], "unknown strategy 'bogus'"),
        (["--ignored-xids", "1,x"], "--ignored-xids"),
        (["--resource-name", "gpu"], "not an extended resource name"),
        (["--nvml", "mock"], "--mock-state"),
        (["--replicas", "0"], "--replicas: must be at least 1"),
        (["--replicas", "two"], "--replicas: expected a whole number"),
        (["--second-resource", "example.com/mig"], "is not NAME=N"),
        (["--second-resource", "mig=1"], "is not NAME=N"),
        (["--second-resource", "example.com/mig=0"], "is not NAME=N"),
        (["--second-resource", "nvidia.com/gpu=1"], "is already --resource-name"),
        (["--second-resource", "example.com/mig=1", "--socket-name", "x.sock"], "each resource has its own"),
    ],
)
def test_cli_rejects_bad_flags(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


# ---- the mock libnvidia-ml through pynvml ----------------------------------------------------
@contextlib.contextmanager
def _mock_nvml(path: Path) -> Iterator[None]:
    """pynvml on pytest-devplug's mock library for the duration, then pynvml as it was (no library)."""
    os.environ[STATE_ENV] = str(path)
    lib = ctypes.CDLL(str(mock_library()))
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    # The library is loaded once per process (dlopen hands every test the same copy, tests/nvml's too): an earlier
    # test that left it initialised leaves it on that test's state file, watching it, and this nvmlInit would only
    # count up, reading and watching nothing of ours (the malformed-reload test then waits in vain for the
    # library's line). Start from uninitialised.
    with contextlib.suppress(pynvml.NVMLError_Uninitialized):
        for _ in range(64):
            pynvml.nvmlShutdown()
    pynvml.nvmlInit()
    try:
        yield
    finally:
        pynvml.nvmlShutdown()
        with pynvml.libLoadLock:
            pynvml.nvmlLib = None
            pynvml._nvmlGetFunctionPointer_cache.clear()
        del os.environ[STATE_ENV]


@pytest.fixture
def nvml(mock_state: MockStateFile) -> Iterator[None]:
    with _mock_nvml(mock_state.path):
        yield


def _wait(cond, what: str, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_mock_answers_pynvml_like_the_library(nvml: None) -> None:
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlDeviceGetCount() == 4
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetUUID(h) == UUIDS[2]
    addr = ctypes.cast(h, ctypes.c_void_p).value
    assert ctypes.cast(pynvml.nvmlDeviceGetHandleByUUID(UUIDS[2]), ctypes.c_void_p).value == addr
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-40GB"
    assert pynvml.nvmlDeviceGetMemoryInfo(h).total == 40960 * 1024 * 1024
    assert pynvml.nvmlDeviceGetMinorNumber(h) == 2
    assert pynvml.nvmlDeviceGetNumaNodeId(h) == 1
    assert pynvml.nvmlDeviceGetPciInfo(h).busId == "000010DE:00:02.0"
    assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == (8, 0)
    assert pynvml.nvmlDeviceGetSupportedEventTypes(h) & pynvml.nvmlEventTypeXidCriticalError
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(h)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(4)


def test_mock_lost_numa_null_and_add_remove(nvml: None, mock_state: MockStateFile) -> None:
    h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    mock_state.gpu(UUIDS[1])["lost"] = True
    mock_state.gpus.append({"uuid": "GPU-new", "minor": 9, "numa_node": None})
    mock_state.write()
    _wait(lambda: pynvml.nvmlDeviceGetCount() == 5, "the added GPU")
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUUID(h1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNumaNodeId(pynvml.nvmlDeviceGetHandleByIndex(4))
    mock_state.gpus.pop(0)
    mock_state.write()
    _wait(lambda: pynvml.nvmlDeviceGetCount() == 4, "the removed GPU")
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))  # index 0 is the lost GPU now


def test_mock_events_delivered_once_history_skipped(tmp_path: Path) -> None:
    state = MockStateFile(tmp_path / "s.json")
    state.events = [{"uuid": UUIDS[0], "xid": 31}]  # history at load: never delivered
    state.write()
    with _mock_nvml(state.path):
        es = pynvml.nvmlEventSetCreate()
        h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError, es)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(es, 50)
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(pynvml.nvmlEventSetWait_v2(es, 5000)))
        waiter.start()  # blocks until the event arrives
        state.xid(UUIDS[0], 79)
        waiter.join(5)
        data = got[0]
        assert data.eventType == pynvml.nvmlEventTypeXidCriticalError and data.eventData == 79  # type: ignore[attr-defined]
        assert pynvml.nvmlDeviceGetUUID(data.device) == UUIDS[0]  # type: ignore[attr-defined]
        with pytest.raises(pynvml.NVMLError_Timeout):  # delivered once only
            pynvml.nvmlEventSetWait_v2(es, 50)
        pynvml.nvmlEventSetFree(es)


def test_mock_malformed_reload_keeps_state(
    nvml: None, mock_state: MockStateFile, capfd: pytest.CaptureFixture[str]
) -> None:
    mock_state.write_raw(json.dumps({"gpus": [{"uuid": "only", "minor": "zero"}]}))
    err: list[str] = []  # readouterr() hands each piece out once: a line split across two reads must still match

    def said() -> bool:
        err.append(capfd.readouterr().err)
        return "keeping the last good state" in "".join(err)

    # 15 s: the watcher falls back to a once-a-second stat without inotify, and a loaded 2-core host under xdist
    # once took longer than 5 s (tests_lowest in .ci/run)
    _wait(said, "the library's error line", timeout=15.0)
    assert pynvml.nvmlDeviceGetCount() == 4


def _stop_monitor(monitor: HealthMonitor, mock_state: MockStateFile) -> None:
    """Stop a monitor whose event wait is long: an Xid wakes the wait, which then sees the stop."""
    monitor._stop.set()
    mock_state.xid(UUIDS[0], 13)
    monitor.stop()


def test_health_loop_woken_by_a_lost_gpu_not_by_timeout(nvml: None, mock_state: MockStateFile) -> None:
    state = DeviceState()
    monitor = HealthMonitor(state, wait_ms=30_000)  # a timeout-driven loop would take 30 s
    monitor.start()
    try:
        assert len(state.snapshot().gpus) == 4
        v = state.snapshot().version
        started = time.monotonic()
        mock_state.set(UUIDS[3], lost=True)
        snap = state.wait_for_change(v, 5)
        assert time.monotonic() - started < 2, "the health loop was not woken by the lost GPU"
        assert not snap.by_uuid()[UUIDS[3]].healthy
    finally:
        _stop_monitor(monitor, mock_state)


def test_health_loop_idle_timeout_probes_only_on_change(nvml: None, mock_state: MockStateFile) -> None:
    """A quiet timeout re-probes only when the count changed or a lost GPU answers again."""
    state = DeviceState()
    monitor = HealthMonitor(state, wait_ms=100)
    monitor.start()
    try:
        assert not monitor.needs_probe()
        mock_state.set(UUIDS[1], lost=True)
        _wait(lambda: not state.snapshot().by_uuid()[UUIDS[1]].healthy, "the lost GPU")
        assert not monitor.needs_probe()
        mock_state.set(UUIDS[1], lost=False)
        _wait(lambda: state.snapshot().by_uuid()[UUIDS[1]].healthy, "the GPU back (found by the idle check)")
        mock_state.gpus.append({"uuid": "GPU-new", "minor": 9, "numa_node": 0})
        mock_state.write()
        _wait(lambda: "GPU-new" in state.snapshot().by_uuid(), "the added GPU (found by the idle check)")
    finally:
        monitor.stop()


def test_fault_flags_survive_bad_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = MockStateFile(tmp_path / "s.json")
    faults = MockFaults(str(state.path))
    assert faults.allocate(UUIDS[0]) is None and faults.pre_start(UUIDS[0]) is None
    state.set(UUIDS[0], fail_allocate=True)
    assert faults.allocate(UUIDS[0]) == f"fail_allocate is set for {UUIDS[0]} in mock state {state.path}"
    assert faults.pre_start(UUIDS[0]) is None, "each flag fails its own RPC only"
    state.set(UUIDS[0], fail_allocate=False, fail_pre_start=True)
    assert faults.allocate(UUIDS[0]) is None
    assert faults.pre_start(UUIDS[0]) == f"fail_pre_start is set for {UUIDS[0]} in mock state {state.path}"
    # json's RecursionError leaves the stack at its limit: a finalizer of an earlier test's garbage run there by the
    # collector (an unclosed channel's ResourceWarning) cannot even be reported and fails this test. Collect first,
    # and keep the collector off while the nesting is decoded.
    gc.collect()
    gc.disable()
    try:
        for bad in (b'{"gpus": [\xff]}', b"[" * 100_000, b'{"gpus": 1}'):
            state.path.write_bytes(bad)
            assert faults.pre_start(UUIDS[0]) is not None, "a bad file must keep the last good flags"
    finally:
        gc.enable()
    assert caplog.text.count("keeping the last fail_allocate/fail_pre_start flags") == 3
    state.path.unlink()
    assert faults.pre_start(UUIDS[0]) is not None


# ---- inotify ---------------------------------------------------------------------------------
def test_no_inotify_instance_left_falls_back_to_the_periodic_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a host whose inotify instances are used up (EMFILE) the plugin keeps running: its run loop checks the
    plugin dir every second anyway."""
    import errno

    from devplug_gpu_plugin import server as srv

    def exhausted() -> watch.Inotify:
        raise OSError(errno.EMFILE, "inotify_init1: Too many open files")

    monkeypatch.setattr(srv, "Inotify", exhausted)
    plugin = srv.PluginServer(srv.ServerConfig(str(tmp_path), "example.com/gpu", "x.sock"), None, threading.Event())  # type: ignore[arg-type]
    plugin.start_watching()
    assert "checking it every second instead" in caplog.text and "Too many open files" in caplog.text


def test_a_socket_path_too_long_for_unix_is_refused_naming_it() -> None:
    from devplug_gpu_plugin import server as srv

    long_dir = "/var/lib/kubelet/" + "d" * 90
    plugin = srv.PluginServer(srv.ServerConfig(long_dir, "example.com/gpu", "devplug-x.sock"), None, threading.Event())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"is 122 bytes: a Unix socket path holds at most 107"):
        plugin.serve()


def test_inotify_sees_create_delete_and_rename(tmp_path: Path) -> None:
    with watch.Inotify() as ino:
        ino.add_watch(str(tmp_path), watch.IN_CREATE | watch.IN_DELETE | watch.IN_MOVED_TO)
        (tmp_path / "a").write_text("x")
        os.replace(tmp_path / "a", tmp_path / "b")
        (tmp_path / "b").unlink()
        seen: list[tuple[str, int]] = []
        deadline = time.monotonic() + 5
        while len(seen) < 3 and time.monotonic() < deadline:
            seen += [(e.name, e.mask) for e in ino.read(1.0)]
        assert ("a", watch.IN_CREATE) in seen
        assert ("b", watch.IN_MOVED_TO) in seen
        assert ("b", watch.IN_DELETE) in seen
        t = threading.Timer(0.05, ino.wake)
        t.start()
        started = time.monotonic()
        assert ino.read(10) == []
        assert time.monotonic() - started < 5


# ---- image and manifest ----------------------------------------------------------------------
PLUGIN_ROOT = Path(__file__).resolve().parents[2] / "plugin_under_test"


def test_daemonset_manifest_matches_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    (ds,) = list(yaml.safe_load_all((PLUGIN_ROOT / "deploy" / "daemonset.yaml").read_text()))
    assert (ds["kind"], ds["metadata"]["namespace"]) == ("DaemonSet", "kube-system")
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"devplug.io/gpu": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    host = {v["hostPath"]["path"] for v in pod["volumes"]}
    for path in (env["DP_PLUGIN_DIR"], os.path.dirname(env["DP_MOCK_STATE"])):
        assert path in mounts and path in host, f"{path} must be a hostPath mounted at the same path"
    assert env["DP_DEV_ROOT"].startswith("/var/lib/devplug/")
    for k in list(os.environ):
        if k.startswith("DP_"):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = cli.parse_args([])  # every DP_* the manifest sets is understood
    assert (args.nvml, args.create_dev_nodes, args.mock_state) == ("mock", True, env["DP_MOCK_STATE"])


def test_dockerfile_shape() -> None:
    text = (PLUGIN_ROOT / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.12-slim" in text and "FROM ${BASE_IMAGE}" in text
    assert 'ENTRYPOINT ["devplug-gpu-plugin"]' in text
