"""The checkpoint must match the kubelet's bytes and checksum exactly, both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.cli import main as devplug
from pytest_devplug.kubeletmodel.checkpoint import CheckpointData, PodDevicesEntry, checksum, decode, encode, render
from pytest_devplug.errors import CheckpointCorruptError, CheckpointFormatError
from pytest_devplug.kubeletmodel.checkpointfile import read_checkpoint, write_checkpoint

DATA = Path(__file__).parent.parent / "data" / "checkpoints"
REAL = sorted(DATA.glob("*.json"))


def test_real_checkpoints_are_present() -> None:
    assert len(REAL) >= 4, REAL


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_kubelet_checkpoint_verifies_and_reencodes_byte_for_byte(path: Path) -> None:
    data = read_checkpoint(path)
    assert encode(data) == path.read_bytes()


def test_facts_page_rendering() -> None:
    data, stored = decode((DATA / "facts-page.json").read_bytes())
    assert render(data) == (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)<nil> "
        "RegisteredDevices:(map[string][]string)map[nvidia.com/gpu:[GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0]]}"
    )
    assert checksum(data) == stored == 3952659280


def test_entry_rendering_shows_types_numa_keys_and_bytes() -> None:
    data = CheckpointData(
        pod_device_entries=[PodDevicesEntry("u", "c", "r/x", {1: ["b"], -1: ["a"], 10: ["c"]}, b"\x0a\x01")],
        registered_devices={"r/x": ["a", "b"]},
    )
    assert render(data) == (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{PodUID:(string)u "
        "ContainerName:(string)c ResourceName:(string)r/x "
        "DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:[a] 1:[b] 10:[c]] AllocResp:([]uint8)[10 1]}] "
        "RegisteredDevices:(map[string][]string)map[r/x:[a b]]}"
    )
    # encoding/json orders the NUMA keys by their text.
    assert b'"DeviceIDs":{"-1":["a"],"1":["b"],"10":["c"]}' in encode(data)


def test_nil_and_empty_are_different_values_for_the_kubelet() -> None:
    nil = CheckpointData(pod_device_entries=None, registered_devices={})
    empty = CheckpointData(pod_device_entries=[], registered_devices={})
    assert checksum(nil) != checksum(empty)
    assert decode(encode(nil))[0] == nil
    assert decode(encode(empty))[0] == empty


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["Data"]["RegisteredDevices"]["nvidia.com/gpu"].append("GPU-extra"),
        lambda d: d["Data"]["PodDeviceEntries"][0].update(ContainerName="other"),
        lambda d: d["Data"]["PodDeviceEntries"][0]["DeviceIDs"].update({"0": ["x"]}),
        lambda d: d.update(Checksum=d["Checksum"] + 1),
    ],
    ids=["registered", "container", "devices", "checksum"],
)
def test_altered_checkpoint_is_rejected_with_both_values(tmp_path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads((DATA / "two-pods-numa.json").read_text())
    edit(doc)
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointCorruptError) as err:
        read_checkpoint(path)
    assert err.value.stored == doc["Checksum"]
    assert str(err.value.stored) in str(err.value) and str(err.value.computed) in str(err.value)


def test_write_is_atomic_and_round_trips(tmp_path: Path) -> None:
    resp = pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": "GPU-a"})
    data = CheckpointData(
        pod_device_entries=[PodDevicesEntry("uid", "main", "nvidia.com/gpu", {0: ["GPU-a"]}, resp.SerializeToString())],
        registered_devices={"nvidia.com/gpu": ["GPU-a", "GPU-b"]},
    )
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_text("old")
    write_checkpoint(path, data)
    assert read_checkpoint(path) == data
    assert [p.name for p in tmp_path.iterdir()] == ["kubelet_internal_checkpoint"]


@pytest.mark.parametrize(
    ("blob", "problem"),
    [
        (b"{", "not JSON"),
        (b"[]", "cannot unmarshal array into checkpoint.Data"),
        (b'{"Data":{},"Checksum":-1}', r"cannot unmarshal number -1 into checksum.Checksum \(uint64\)"),
        (b'{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"x":[]}}]},"Checksum":1}', "NUMA node 'x' is not an int64"),
        (b'{"Data":{"PodDeviceEntries":[{"AllocResp":"%%"}]},"Checksum":1}', "illegal base64 data"),
        (
            b'{"Data":{"RegisteredDevices":{"r":[1]}},"Checksum":1}',
            r"RegisteredDevices\['r'\]\[0\]: cannot unmarshal number 1 into string",
        ),
    ],
)
def test_malformed_files_name_the_problem(blob: bytes, problem: str) -> None:
    with pytest.raises(CheckpointFormatError, match=problem):
        decode(blob, source="F")


def test_cli_show_decodes_allocate_responses(capsys: pytest.CaptureFixture[str]) -> None:
    assert devplug(["checkpoint", "show", str(DATA / "no-topology.json")]) == 0
    out = capsys.readouterr().out
    assert "checksum 3660592824 ok" in out
    assert "devices on no NUMA node: tegra" in out
    assert "env NVIDIA_VISIBLE_DEVICES=tegra" in out


def test_cli_show_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert devplug(["checkpoint", "show", "--json", str(DATA / "two-pods-numa.json")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checksum"]["valid"] is True
    second = doc["pod_device_entries"][1]
    assert second["devices_by_numa"] == {"1": second["allocate_response"]["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")}


def test_cli_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = DATA / "unsorted-registered.json"
    assert devplug(["checkpoint", "verify", str(good)]) == 0
    bad = tmp_path / "bad"
    bad.write_bytes(good.read_bytes().replace(b"3082069630", b"3082069631"))
    assert devplug(["checkpoint", "verify", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "stored 3082069631" in err and "computed 3082069630" in err
    assert devplug(["checkpoint", "verify", str(tmp_path / "missing")]) == 2
    assert "cannot read" in capsys.readouterr().err
