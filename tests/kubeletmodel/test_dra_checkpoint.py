"""dra_manager_state: upstream's test vectors (pkg/kubelet/cm/dra/state/checkpointer_test.go), Go's JSON
rules on both levels, the round trip and how a corrupt file is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_devplug.kubeletmodel.releases import KubeVersion
from pytest_devplug.errors import CheckpointCorruptError, CheckpointFormatError
from pytest_devplug.kubeletmodel import dracheckpoint as cp

CLAIM1 = "067798be-454e-4be4-9047-1aa06aea63f7"
CLAIM2 = "4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"
POD = "139cdb46-f989-4f17-9561-ca10cfb509a6"
DRIVER = "test-driver.cdi.k8s.io"
CDI = "example.com/example=cdi-example"


def _dev(name: str, *, full: bool = True) -> cp.PreparedDevice:
    return cp.PreparedDevice("worker-1", name, ["test request"] if full else None, [CDI] if full else None)


def _state(name: str, uid: str, *devices: cp.PreparedDevice) -> cp.ClaimInfoState:
    return cp.ClaimInfoState(uid, name, "default", {POD}, {DRIVER: list(devices)})


KUBE_134, KUBE_137 = KubeVersion.of("1.34"), KubeVersion.of("1.37")

# (entries, upstream's expected Checksum of 1.34, of 1.35+ ("ShareID":null on every device)) from
# TestCheckpointStateStore of pkg/kubelet/cm/dra/state/checkpointer_test.go in each release
VECTORS = {
    "single-claim-info-state": ([_state("example", CLAIM1, _dev("dev-1"))], 1656016162, 2570581864),
    "claim-info-state-with-multiple-devices": (
        [_state("example", CLAIM1, _dev("dev-1"), _dev("dev-2"))],
        3369508096,
        1223221469,
    ),
    "two-claim-info-states": (
        [_state("example-1", CLAIM1, _dev("dev-1")), _state("example-2", CLAIM2, _dev("dev-2", full=False))],
        1582256999,
        2820117767,
    ),
}


@pytest.mark.parametrize("case", sorted(VECTORS))
def test_upstream_checksum_vectors(case: str) -> None:
    entries, of_134, of_135 = VECTORS[case]
    for kube, expected in ((KUBE_134, of_134), (KUBE_137, of_135)):
        blob = cp.encode(entries, kube)
        doc = json.loads(blob)
        assert doc["Checksum"] == expected, kube.name
        assert list(doc) == ["Data", "Checksum"]
        assert cp.decode(blob).entries == entries


def test_a_share_id_is_written_where_the_release_has_the_field() -> None:
    """1.35's vector "single-claim-info-state-with-share-id"; a 1.34 kubelet has no such field."""
    entries = [
        _state(
            "example",
            CLAIM1,
            cp.PreparedDevice("worker-1", "dev-1", ["test request"], [CDI], "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"),
        )
    ]
    assert json.loads(cp.encode(entries, KUBE_137))["Checksum"] == 736302156
    assert b"ShareID" not in cp.encode(entries, KUBE_134)


def test_upstream_single_claim_file_byte_for_byte() -> None:
    expected = (
        '{"Data":"{\\"kind\\":\\"DRACheckpoint\\",\\"apiVersion\\":\\"checkpoint.dra.kubelet.k8s.io/v1\\",'
        '\\"ClaimInfoStateList\\":[{\\"ClaimUID\\":\\"067798be-454e-4be4-9047-1aa06aea63f7\\",\\"ClaimName\\":\\"example\\",'
        '\\"Namespace\\":\\"default\\",\\"PodUIDs\\":{\\"139cdb46-f989-4f17-9561-ca10cfb509a6\\":{}},\\"DriverState\\":'
        '{\\"test-driver.cdi.k8s.io\\":{\\"Devices\\":[{\\"PoolName\\":\\"worker-1\\",\\"DeviceName\\":\\"dev-1\\",'
        '\\"RequestNames\\":[\\"test request\\"],\\"CDIDeviceIDs\\":[\\"example.com/example=cdi-example\\"]}]}}}]}",'
        '"Checksum":1656016162}'
    )
    assert cp.encode(VECTORS["single-claim-info-state"][0], KUBE_134).decode() == expected


def test_upstream_incorrect_checksum_is_refused(tmp_path: Path) -> None:
    # upstream's "incorrect-checksum" case: Data keyed "Entries", stored checksum of another Data
    data = (
        '{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":[{"ClaimUID":"'
        + CLAIM1
        + '",'
        '"ClaimName":"example-1","Namespace":"default","PodUIDs":{"' + POD + '":{}},"DriverState":{"' + DRIVER + '":'
        '{"Devices":[{"PoolName":"worker-1","DeviceName":"dev-1","RequestNames":["test request"],"CDIDeviceIDs":["'
        + CDI
        + '"]}]}}},'
        '{"ClaimUID":"' + CLAIM2 + '","ClaimName":"example-2","Namespace":"default","PodUIDs":{"' + POD + '":{}},'
        '"DriverState":{"'
        + DRIVER
        + '":{"Devices":[{"PoolName":"worker-1","DeviceName":"dev-2","RequestNames":null,"CDIDeviceIDs":null}]}}}]}'
    )
    path = tmp_path / cp.CHECKPOINT_NAME
    path.write_text(json.dumps({"Data": data, "Checksum": 2930258365}))
    with pytest.raises(CheckpointCorruptError) as err:
        cp.read_checkpoint(path)
    assert err.value.stored == 2930258365 and err.value.computed == cp.checksum(data) != 2930258365


def test_invalid_json_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / cp.CHECKPOINT_NAME
    path.write_text("{")
    with pytest.raises(CheckpointFormatError, match="not JSON"):
        cp.read_checkpoint(path)


def test_new_checkpoint_has_a_null_list_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / cp.CHECKPOINT_NAME
    cp.write_checkpoint(path, None)
    assert json.loads(json.loads(path.read_text())["Data"])["ClaimInfoStateList"] is None
    assert cp.read_checkpoint(path) is None
    cp.write_checkpoint(path, [])
    assert cp.read_checkpoint(path) == []
    assert not list(tmp_path.glob(".*")), "the temp file of the atomic write was left behind"


def test_go_json_rules_html_escapes_sorted_keys_and_share_id() -> None:
    entry = cp.ClaimInfoState(
        "u",
        "a<b>&c",
        "ns",
        {"z", "a"},
        {"z.example.com": None, "a.example.com": [cp.PreparedDevice("p", "d", None, [], share_id="s-1")]},
    )
    data = cp.encode_data([entry])
    assert "\\u003c" in data and "\\u003e" in data and "\\u0026" in data and "<" not in data
    assert data.index('"a.example.com"') < data.index('"z.example.com"')
    assert '"PodUIDs":{"a":{},"z":{}}' in data
    assert '"z.example.com":{"Devices":null}' in data
    assert '{"PoolName":"p","DeviceName":"d","ShareID":"s-1","RequestNames":null,"CDIDeviceIDs":[]}' in data
    assert cp.decode_data(data) == [entry]


def test_reading_follows_json_unmarshal(tmp_path: Path) -> None:
    # keys match case-insensitively, unknown keys are ignored, null keeps a string as it was
    data = (
        '{"KIND":"DRACheckpoint","claiminfostatelist":[{"claimuid":"u","ClaimName":null,"extra":1,"podUIDs":{"p":{}}}]}'
    )
    (entry,) = cp.decode_data(data) or []
    assert (entry.claim_uid, entry.claim_name, entry.pod_uids, entry.driver_state) == ("u", "", {"p"}, None)
    # as bytes.EqualFold does, the long s and the Kelvin sign fold onto s and k (the device manager's file alike)
    (entry,) = cp.decode_data('{"ClaimInfoStateList":[{"Name\u017fpace":"ns","ClaimUID":"u"}]}') or []
    assert entry.namespace == "ns"
    assert cp.decode_data('{"\u212aind":"DRACheckpoint","ClaimInfoStateList":null}') is None
    with pytest.raises(
        CheckpointFormatError, match="cannot unmarshal number into ClaimInfoState.ClaimUID of type string"
    ):
        cp.decode_data('{"ClaimInfoStateList":[{"ClaimUID":1}]}')
    with pytest.raises(CheckpointFormatError, match="uint32"):
        cp.decode(json.dumps({"Data": "{}", "Checksum": 2**32}).encode())


def test_devplug_checkpoint_verify_and_show_read_dra_manager_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_devplug.cli import main as devplug

    path = tmp_path / cp.CHECKPOINT_NAME
    cp.write_checkpoint(path, VECTORS["single-claim-info-state"][0], KUBE_134)
    assert devplug(["checkpoint", "verify", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: checksum 1656016162 ok\n"
    assert devplug(["checkpoint", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "DRA checkpoint, checksum 1656016162 ok" in out
    assert f"claim default/example uid {CLAIM1} pods {POD}" in out
    assert f"device worker-1/dev-1 requests test request cdi {CDI}" in out
    assert devplug(["checkpoint", "show", "--json", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["checksum"] == {"stored": 1656016162, "computed": 1656016162, "valid": True}
    assert shown["claims"][0]["drivers"][DRIVER][0]["cdi_device_ids"] == [CDI]
    doc = json.loads(path.read_text())
    doc["Checksum"] = 1
    path.write_text(json.dumps(doc))
    assert devplug(["checkpoint", "verify", str(path)]) == 1
    assert capsys.readouterr().err == f"{path}: checksum mismatch: stored 1, computed 1656016162\n"
