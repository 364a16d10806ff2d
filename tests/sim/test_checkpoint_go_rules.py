"""The checkpoint reader accepts and refuses what the kubelet's ``json.Unmarshal`` does.

Each expectation below was checked against Go 1.26's ``encoding/json`` decoding into the kubelet's
``checkpoint.Data`` types (see ``tests/reliability/gojson/``, which the fuzz tests run when Go is
installed); the comment on a case says what Go answered.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_devplug.cli import main as devplug
from pytest_devplug.kubeletmodel.checkpoint import CheckpointData, PodDevicesEntry, decode
from pytest_devplug.errors import CheckpointFormatError
from pytest_devplug.kubeletmodel.checkpointfile import MAX_CHECKPOINT_BYTES, read_bytes, write_checkpoint
from pytest_devplug.kubeletmodel.gojson import MAX_DEPTH


def _doc(data: str, tail: str = ',"Checksum":1') -> bytes:
    return ('{"Data":' + data + tail + "}").encode()


@pytest.mark.parametrize(
    ("blob", "problem"),
    [
        (b"\xef\xbb\xbf" + _doc("{}"), "invalid character '\\\\ufeff'"),  # a BOM: invalid character 'ï'
        ('{"Data":{},"Checksum":1}'.encode("utf-16"), "invalid character"),
        ('{"Data":{},"Checksum":1}'.encode("utf-32"), "invalid character"),
        (_doc("{}", ',"Checksum":NaN'), "invalid character 'N'"),
        (_doc("{}", ',"Checksum":Infinity'), "invalid character 'I'"),
        (_doc("{}", ',"Checksum":1.0'), "cannot unmarshal number 1.0"),
        (_doc("{}", ',"Checksum":1e2'), "cannot unmarshal number 1e2"),
        (_doc("{}", ',"Checksum":18446744073709551616'), "cannot unmarshal number 18446744073709551616"),
        (_doc("{}", ',"Checksum":' + "9" * 30), "cannot unmarshal number 9999"),
        (_doc("{}", ',"Checksum":"1"'), "cannot unmarshal string"),
        (_doc("{}", ',"Checksum":01'), "after object key:value pair"),
        (_doc('{"PodDeviceEntries":[{"DeviceIDs":{" 1":[]}}]}'), "NUMA node ' 1'"),
        (_doc('{"PodDeviceEntries":[{"DeviceIDs":{"1_0":[]}}]}'), "NUMA node '1_0'"),
        (_doc('{"PodDeviceEntries":[{"DeviceIDs":{"9223372036854775808":[]}}]}'), "not an int64"),
        (_doc('{"PodDeviceEntries":[{"AllocResp":"AQ==="}]}'), "illegal base64"),
        (_doc('{"PodDeviceEntries":[{"AllocResp":[256]}]}'), "cannot unmarshal number 256 into uint8"),
        (_doc('{"RegisteredDevices":{"r":["\t"]}}'), "in string literal"),
        (_doc("{}", ',"Checksum":1,'), "looking for beginning of object key string"),
        (_doc("{}") + b" x", "after top-level value"),
        (b"", "unexpected end of JSON input"),
        (b'{"X":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}", "exceeded max depth"),
    ],
)
def test_refused_like_go(blob: bytes, problem: str) -> None:
    with pytest.raises(CheckpointFormatError, match=problem):
        decode(blob, source="F")


@pytest.mark.parametrize(
    ("blob", "stored", "expected"),
    [
        # Unpaired surrogate escapes and invalid UTF-8 become U+FFFD, one per byte.
        (_doc('{"RegisteredDevices":{"r":["\\ud800"]}}'), 1, CheckpointData(None, {"r": ["\ufffd"]})),
        (
            b'{"Data":{"RegisteredDevices":{"r":["\xe2\x82A\xed\xa0\x80"]}},"Checksum":1}',
            1,
            CheckpointData(None, {"r": ["\ufffd\ufffdA\ufffd\ufffd\ufffd"]}),
        ),
        # Keys match case-insensitively; the Kelvin sign and long s fold onto k and s.
        (b'{"data":{"registereddevices":{"a":null}},"CHECK\xc5\xbfUM":5}', 5, CheckpointData(None, {"a": None})),
        # null leaves a number or string as it was and makes a map or slice nil.
        (b"null", 0, CheckpointData()),
        (_doc("null", ',"Checksum":1,"Checksum":null'), 1, CheckpointData()),
        (_doc('{"RegisteredDevices":{"a":["x",null]}}'), 1, CheckpointData(None, {"a": ["x", ""]})),
        # A repeated key decodes again into the same value: maps merge, slice elements are reused.
        (
            b'{"Data":{"RegisteredDevices":{"a":["x"]}},"Data":{"RegisteredDevices":{"b":["y"]}},"Checksum":1}',
            1,
            CheckpointData(None, {"a": ["x"], "b": ["y"]}),
        ),
        (
            b'{"Data":{"PodDeviceEntries":[{"PodUID":"a","ContainerName":"c"}]},'
            b'"Data":{"PodDeviceEntries":[{"PodUID":"b"}]},"Checksum":1}',
            1,
            CheckpointData([PodDevicesEntry("b", "c", "", None, None)]),
        ),
        # strconv.ParseInt takes a sign and leading zeros; the later of two equal keys wins.
        (
            _doc('{"PodDeviceEntries":[{"DeviceIDs":{"+1":["a"],"01":["b"]}}]}'),
            1,
            CheckpointData([PodDevicesEntry("", "", "", {1: ["b"]}, None)]),
        ),
        # []byte from base64 (CR and LF skipped) or from an array of numbers.
        (
            _doc('{"PodDeviceEntries":[{"AllocResp":"AQ\\nI="}]}'),
            1,
            CheckpointData([PodDevicesEntry("", "", "", None, b"\x01\x02")]),
        ),
        (
            _doc('{"PodDeviceEntries":[{"AllocResp":[1,2,255]}]}'),
            1,
            CheckpointData([PodDevicesEntry("", "", "", None, b"\x01\x02\xff")]),
        ),
        # Unknown keys are skipped whatever they hold, up to Go's nesting limit.
        (
            _doc("{}", ',"Checksum":1,"X":1e99999,"Y":' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)),
            1,
            CheckpointData(),
        ),
        # The checksum field is a uint64: a value above 2^32 is a mismatch, not a format error.
        (_doc("{}", ',"Checksum":18446744073709551615'), 2**64 - 1, CheckpointData()),
    ],
)
def test_accepted_like_go(blob: bytes, stored: int, expected: CheckpointData) -> None:
    assert decode(blob) == (expected, stored)


def test_checksum_above_uint32_is_a_mismatch_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c"
    path.write_bytes(_doc("{}", ',"Checksum":4294967296'))
    assert devplug(["checkpoint", "verify", str(path)]) == 1
    assert "stored 4294967296" in capsys.readouterr().err


def test_issue_repro_unpaired_surrogate_is_a_mismatch_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "c"
    path.write_bytes(b'{"Data":{"RegisteredDevices":{"r":["\\ud800"]}},"Checksum":1}')
    assert devplug(["checkpoint", "verify", str(path)]) == 1
    assert devplug(["checkpoint", "show", str(path)]) == 0


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "too-big"])
def test_reader_refuses_what_is_not_a_bounded_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "c"
    if kind == "fifo":
        os.mkfifo(path)  # opening it blocking for reading would hang until a writer came
    elif kind == "dev-zero":
        path = Path("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        with path.open("wb") as f:
            f.truncate(MAX_CHECKPOINT_BYTES + 1)
    with pytest.raises(CheckpointFormatError, match="not a regular file|larger than"):
        read_bytes(path)
    assert devplug(["checkpoint", "verify", str(path)]) == 2


def test_show_escapes_control_characters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "evil\nchecksum 1 ok"
    data = CheckpointData(
        [PodDevicesEntry("uid\x1b]0;title\x07", "c\u202e", "r", {0: ["GPU\r\n  forged"]}, b"")], {"r\x1b[2J": ["a\\x"]}
    )
    write_checkpoint(path, data)
    assert devplug(["checkpoint", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\r\u202e")
    assert "evil\\x0achecksum 1 ok" in out and "GPU\\x0d\\x0a  forged" in out and "c\\u202e" in out
    assert "a\\\\x" in out  # a literal backslash is escaped too, so an escape cannot be faked
    assert len(out.splitlines()) == 8, out


def test_kubelet_starts_empty_on_a_checkpoint_it_cannot_use(tmp_path: Path) -> None:
    """Upstream ``Start`` logs "Continue after failing to read checkpoint file" and goes on."""
    from pytest_devplug.sim.devicemanager import DeviceManager

    (tmp_path / "kubelet_internal_checkpoint").write_bytes(
        b'{"Data":' * 2000 + b'{"RegisteredDevices":{"r":["\\ud800"]}}'
    )
    dm = DeviceManager(tmp_path)
    dm.start()
    try:
        assert dm.resources() == []
    finally:
        dm.stop()
    assert stat.S_ISREG((tmp_path / "kubelet_internal_checkpoint").stat().st_mode)


@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_show_into_a_closed_pipe_exits_quietly(tmp_path: Path, fmt: list[str]) -> None:
    path = tmp_path / "c"
    write_checkpoint(path, CheckpointData(None, {"r": [f"GPU-{i:06d}" for i in range(50_000)]}))
    code = "import sys; from pytest_devplug.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "checkpoint", "show", *fmt, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(1)
    proc.stdout.close()  # what `| head -c1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == 141, err
    assert err == ""
