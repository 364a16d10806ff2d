"""The DRA driver's logic without processes: claims to prepared devices, the CDI spec a runtime resolves, the
slice's devices, the health stream's heartbeat, and the command line of ``--dra``."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from devplug_gpu_plugin import cli
from devplug_gpu_plugin.devices import DeviceState, GpuInfo, Probe
from devplug_gpu_plugin.dra.cdi import CdiLayout, InvalidClaimUidError
from devplug_gpu_plugin.dra.health import HealthService
from devplug_gpu_plugin.dra.prepare import ClaimCheckError, ClaimError, check_claim, prepare_claim
from devplug_gpu_plugin.dra.kubeapi import KubeApiError
from devplug_gpu_plugin.dra.slices import _comparable, slice_devices
from devplug_gpu_plugin.dra.status import CONFLICT_RETRIES, report_device_status, with_device_data
from pytest_devplug.kubeletmodel.cdi import resolve

DRIVER, NODE = "gpu.devplug.io", "node-1"
UID = "0b7c1d2e-0000-4000-8000-00000000000a"


def _state(n: int = 3) -> DeviceState:
    state = DeviceState()
    state.update_inventory(
        [Probe(GpuInfo(f"GPU-{i}aaa-0000", "NVIDIA A100-SXM4-40GB", i, i // 2, 40960), lost=False) for i in range(n)]
    )
    return state


def _claim(*results: tuple[str, str, str, str], uid: str = UID) -> dict[str, Any]:
    """A claim allocated with (request, driver, pool, device) results, as the API server returns it."""
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": r, "driver": d, "pool": p, "device": dev} for r, d, p, dev in results]
                }
            }
        },
    }


def test_check_claim_uses_the_go_helpers_texts() -> None:
    with pytest.raises(ClaimCheckError, match=r"^claim ns/c not allocated$"):
        check_claim({"metadata": {"uid": UID}, "status": {}}, "ns", "c", UID)
    with pytest.raises(ClaimCheckError, match=r"^claim ns/c got replaced$"):
        check_claim(_claim(), "ns", "c", "another-uid")
    check_claim(_claim(), "ns", "c", UID)


def test_prepare_claim_only_this_drivers_results_and_cdi_ids(tmp_path: Path) -> None:
    layout = CdiLayout(DRIVER, str(tmp_path / "cdi"), "/host/dev", "/usr/lib/nvidia")
    claim = _claim(
        ("gpus", DRIVER, NODE, "gpu-2"),
        ("gpus", DRIVER, NODE, "gpu-0"),
        ("nic", "nic.example.com", NODE, "eth-0"),
        ("one/small", DRIVER, NODE, "gpu-1"),
    )
    prepared = prepare_claim(claim, _state().snapshot(), layout, NODE)
    kind = f"{DRIVER}/gpu"
    assert [(d.request, d.pool, d.device) for d in prepared.devices] == [
        ("gpus", NODE, "gpu-2"),
        ("gpus", NODE, "gpu-0"),
        ("one", NODE, "gpu-1"),
    ]
    assert prepared.devices[0].cdi_ids == (f"{kind}={UID}-gpu-2", f"{kind}={UID}-req-gpus")
    assert prepared.devices[2].cdi_ids == (f"{kind}={UID}-gpu-1", f"{kind}={UID}-req-one")
    path = layout.write(UID, prepared.spec or {})
    assert path == str(tmp_path / "cdi" / f"{DRIVER}-gpu_{UID}.json")
    # what a CDI-enabled runtime gives a container using the request "gpus" (the kubelet passes each device's IDs)
    edits = resolve([i for d in prepared.devices[:2] for i in d.cdi_ids], [tmp_path / "cdi"])
    assert edits.env == {"NVIDIA_VISIBLE_DEVICES": "GPU-2aaa-0000,GPU-0aaa-0000"}
    assert sorted((n.container_path, n.host_path, n.permissions) for n in edits.device_nodes) == [
        ("/dev/nvidia-uvm", "/host/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia0", "/host/dev/nvidia0", "rw"),
        ("/dev/nvidia2", "/host/dev/nvidia2", "rw"),
        ("/dev/nvidiactl", "/host/dev/nvidiactl", "rw"),
    ]
    assert [(m.container_path, m.host_path, m.read_only) for m in edits.mounts] == [
        ("/usr/lib/nvidia", "/usr/lib/nvidia", True)
    ]
    one = resolve(prepared.devices[2].cdi_ids, [tmp_path / "cdi"])
    assert one.env == {"NVIDIA_VISIBLE_DEVICES": "GPU-1aaa-0000"}
    assert {n.container_path for n in one.device_nodes} == {"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert layout.remove(UID) is True and layout.remove(UID) is False


def test_a_claim_without_devices_of_this_driver_prepares_to_nothing(tmp_path: Path) -> None:
    prepared = prepare_claim(
        _claim(("nic", "nic.example.com", NODE, "eth-0")), _state().snapshot(), CdiLayout(DRIVER, str(tmp_path)), NODE
    )
    assert prepared.devices == () and prepared.spec is None


@pytest.mark.parametrize(
    "result, fault, message",
    [
        (("g", DRIVER, "node-2", "gpu-0"), None, "claim ns/c: device node-2/gpu-0 is not in this node's pool node-1"),
        (
            ("g", DRIVER, NODE, "gpu-7"),
            None,
            "claim ns/c: device gpu-7 is not on node node-1 (its GPUs: gpu-0, gpu-1, gpu-2)",
        ),
        (
            ("g", DRIVER, NODE, "gpu-1"),
            "fail_allocate is set",
            "claim ns/c: preparing gpu-1 (GPU-1aaa-0000) failed: fail_allocate is set",
        ),
    ],
)
def test_prepare_claim_errors_name_the_claim_and_device(
    result: tuple[str, str, str, str], fault: str | None, message: str
) -> None:
    with pytest.raises(ClaimError) as err:
        prepare_claim(_claim(result), _state().snapshot(), CdiLayout(DRIVER), NODE, fault=lambda uuid: fault)
    assert str(err.value) == message


def test_a_claim_uid_that_is_not_one_names_no_file() -> None:
    for uid in ("../../etc/passwd", "", "a/b", "x" * 200):
        with pytest.raises(InvalidClaimUidError):
            CdiLayout(DRIVER, "/var/run/cdi").spec_path(uid)


def test_slice_devices_and_quantities_compare_by_value() -> None:
    devices = slice_devices(_state(2).snapshot().gpus)
    assert devices[1] == {
        "name": "gpu-1",
        "attributes": {
            "uuid": {"string": "GPU-1aaa-0000"},
            "model": {"string": "NVIDIA A100-SXM4-40GB"},
            "minor": {"int": 1},
        },
        "capacity": {"memory": {"value": "40960Mi"}},
    }
    # what the API server stores: canonical quantities, maybe fields we do not set
    stored = [{**d, "capacity": {"memory": {"value": "40Gi"}}, "taints": []} for d in devices]
    assert _comparable(stored) == _comparable(devices)
    stored[0]["capacity"]["memory"]["value"] = "39Gi"
    assert _comparable(stored) != _comparable(devices)


class _Context:
    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active


def test_health_stream_repeats_itself_so_the_kubelet_never_reads_unknown() -> None:
    state, stopping = _state(1), threading.Event()
    context = _Context()
    stream = HealthService(state, NODE, stopping, heartbeat=0.3).NodeWatchResources(None, context)  # type: ignore[arg-type]
    started = time.monotonic()
    first, second = next(stream), next(stream)
    assert time.monotonic() - started >= 0.3
    assert [(d.device.device_name, d.health) for d in second.devices] == [
        (d.device.device_name, d.health) for d in first.devices
    ]
    state.mark_xid("GPU-0aaa-0000", 79)
    changed = next(stream)  # at once, not at the next heartbeat
    assert time.monotonic() - started < 2.0 and changed.devices[0].message == "Xid 79"
    context.active = False
    assert list(stream) == []


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("DP_") or k in ("NODE_NAME", "KUBECONFIG"):
            monkeypatch.delenv(k)


def test_cli_dra_defaults_and_env_equivalents(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    args = cli.parse_args(["--dra", "--node-name", "n1", "--nvml", "mock", "--mock-state", "/s.json"])
    assert (
        args.dra is True and args.driver_name == "gpu.devplug.io" and args.node_name == "n1" and args.kubeconfig is None
    )
    assert (args.kubelet_registrar_dir, args.kubelet_plugins_dir, args.cdi_root) == (
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/run/cdi",
    )
    monkeypatch.setenv("DP_DRA", "true")
    monkeypatch.setenv("NODE_NAME", "from-env")
    monkeypatch.setenv("KUBECONFIG", "/k/config")
    monkeypatch.setenv("DP_DRIVER_NAME", "gpu.example.com")
    monkeypatch.setenv("DP_CDI_ROOT", "/etc/cdi")
    args = cli.parse_args([])
    assert (args.dra, args.node_name, args.kubeconfig, args.driver_name, args.cdi_root) == (
        True,
        "from-env",
        "/k/config",
        "gpu.example.com",
        "/etc/cdi",
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dra"], "--dra needs this node's name: --node-name or NODE_NAME"),
        (["--dra", "--node-name", "n", "--driver-name", "GPU.example.com"], "is not a DRA driver name"),
        (["--dra", "--node-name", "n", "--driver-name", "1gpu.example.com"], "starting with a letter"),
        (["--dra", "--node-name", "n", "--driver-name", "a" * 64], "at most 63"),
        (
            ["--dra", "--node-name", "n", "--resource-name", "x.com/gpu"],
            "--resource-name is a device-plugin flag; it does nothing with --dra",
        ),
        (["--dra", "--node-name", "n", "--replicas", "2"], "--replicas is a device-plugin flag"),
        (["--driver-name", "gpu.example.com"], "--driver-name needs --dra"),
        (["--cdi-root", "/etc/cdi"], "--cdi-root needs --dra"),
        (["--device-status"], "--device-status needs --dra"),
    ],
)
def test_cli_dra_rejects_bad_flags(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


class _StatusApi:
    """The claim's status as an API server keeps it: a write at an old resourceVersion conflicts; ``others`` writes
    of another party land just before each of this driver's first ``others`` writes."""

    def __init__(self, claim: dict[str, Any], others: int = 0) -> None:
        self.claim, self.others, self.writes = claim, others, 0
        claim["metadata"]["resourceVersion"] = "1"

    def _bump(self) -> None:
        meta = self.claim["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return {**self.claim, "metadata": dict(self.claim["metadata"]), "status": dict(self.claim["status"])}

    def set_claim_device_status(self, namespace: str, name: str, resource_version: str, entries: Any) -> None:
        self.writes += 1
        if self.others:
            self.others -= 1
            devices = self.claim["status"].setdefault("devices", [])
            devices.append({"driver": "nic.example.com", "pool": NODE, "device": f"eth-{self.writes}"})
            self._bump()
        if resource_version != self.claim["metadata"]["resourceVersion"]:
            raise KubeApiError(409, "Conflict (HTTP 409)")
        self.claim["status"]["devices"] = [dict(e) for e in entries]
        self._bump()


def test_device_status_merges_into_what_others_wrote(tmp_path: Path) -> None:
    """``--device-status``: each prepared GPU's data lands in its own entry, beside a condition another writer set on
    it and another driver's entry, both kept; a write that lost to another writer is made again on a fresh read
    (that writer's entry kept too), an unchanged status is not written, and a claim that keeps changing is an error
    naming it."""
    condition = {"type": "Attached", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "t"}
    claim = _claim(("gpus", DRIVER, NODE, "gpu-1"), ("nic", "nic.example.com", NODE, "eth-0"))
    claim["status"]["devices"] = [
        {"driver": "nic.example.com", "pool": NODE, "device": "eth-0", "networkData": {"ips": ["10.0.0.1/24"]}},
        {"driver": DRIVER, "pool": NODE, "device": "gpu-1", "conditions": [condition]},
    ]
    prepared = prepare_claim(claim, _state().snapshot(), CdiLayout(DRIVER, str(tmp_path)), NODE)
    api = _StatusApi(claim, others=1)
    assert report_device_status(api, api.get_claim("ns", "c"), DRIVER, prepared) is True
    assert api.writes == 2
    data = {"uuid": "GPU-1aaa-0000", "model": "NVIDIA A100-SXM4-40GB", "minor": 1}
    assert claim["status"]["devices"] == [
        {"driver": "nic.example.com", "pool": NODE, "device": "eth-0", "networkData": {"ips": ["10.0.0.1/24"]}},
        {"driver": DRIVER, "pool": NODE, "device": "gpu-1", "conditions": [condition], "data": data},
        {"driver": "nic.example.com", "pool": NODE, "device": "eth-1"},
    ]
    assert report_device_status(api, api.get_claim("ns", "c"), DRIVER, prepared) is False and api.writes == 2
    # a device with no entry yet gets one
    assert with_device_data([], DRIVER, {(NODE, "gpu-0"): {"minor": 0}}) == [
        {"driver": DRIVER, "pool": NODE, "device": "gpu-0", "data": {"minor": 0}}
    ]
    busy = _StatusApi(_claim(("gpus", DRIVER, NODE, "gpu-1")), others=CONFLICT_RETRIES)
    with pytest.raises(KubeApiError, match=r"claim ns/c: status.devices changed under 5 writes"):
        report_device_status(busy, busy.get_claim("ns", "c"), DRIVER, prepared)
