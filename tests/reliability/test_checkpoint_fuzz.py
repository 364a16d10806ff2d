"""Fuzzing the checkpoint reader and ``devplug checkpoint``: never a traceback, and the same
verdict as the kubelet's ``json.Unmarshal`` (checked against Go itself where Go is installed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .reliability_support import RELIABILITY, GoDecoder, examples, go_decoder  # noqa: F401 (fixture)
from .fuzz_inputs import checkpoint_files
from pytest_devplug.cli import main as devplug
from pytest_devplug.kubeletmodel.checkpoint import CheckpointData, PodDevicesEntry, checksum, decode, encode
from pytest_devplug.errors import CheckpointFormatError


def _python_verdict(blob: bytes) -> tuple[CheckpointData, int] | None:
    try:
        return decode(blob)
    except CheckpointFormatError:
        return None


@settings(RELIABILITY, max_examples=examples(400))
@given(checkpoint_files())
def test_reader_raises_only_its_own_error(blob: bytes) -> None:
    verdict = _python_verdict(blob)
    if verdict is not None:
        data, _ = verdict
        checksum(data)  # renders and hashes every string: no UnicodeEncodeError


@settings(RELIABILITY, max_examples=examples(400))
@given(checkpoint_files())
def test_reader_accepts_exactly_what_go_accepts(go_decoder: GoDecoder, blob: bytes) -> None:
    verdict = _python_verdict(blob)
    go = go_decoder.decode(blob)
    assert (verdict is not None) == go["ok"], f"Python {'accepted' if verdict else 'refused'}, Go said {go}"
    if verdict is not None:
        data, stored = verdict
        assert json.loads(encode(data, stored=stored)) == go["value"]


_ids = st.text(min_size=0, max_size=10)
_entries = st.builds(
    PodDevicesEntry,
    pod_uid=st.text(max_size=10),
    container_name=st.text(max_size=10),
    resource_name=st.text(max_size=10),
    device_ids=st.one_of(
        st.none(),
        st.dictionaries(st.integers(-(2**63), 2**63 - 1), st.one_of(st.none(), st.lists(_ids, max_size=3)), max_size=3),
    ),
    alloc_resp=st.one_of(st.none(), st.binary(max_size=16)),
)
checkpoints = st.builds(
    CheckpointData,
    pod_device_entries=st.one_of(st.none(), st.lists(_entries, max_size=3)),
    registered_devices=st.one_of(
        st.none(), st.dictionaries(_ids, st.one_of(st.none(), st.lists(_ids, max_size=3)), max_size=3)
    ),
)


@settings(RELIABILITY, max_examples=examples(200))
@given(checkpoints)
def test_written_checkpoints_read_back_and_verify(data: CheckpointData) -> None:
    assert decode(encode(data)) == (data, checksum(data))


@settings(RELIABILITY, max_examples=examples(200))
@given(checkpoints)
def test_written_checkpoints_are_byte_for_byte_what_go_writes(go_decoder: GoDecoder, data: CheckpointData) -> None:
    blob = encode(data)
    assert go_decoder.decode_raw(blob) == blob


@settings(RELIABILITY, max_examples=examples(150))
@given(blob=checkpoint_files(), action=st.sampled_from([["show"], ["show", "--json"], ["verify"]]))
def test_cli_exits_with_a_verdict_never_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], blob: bytes, action: list[str]
) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(blob)
    code = devplug(["checkpoint", *action, str(path)])
    out, err = capsys.readouterr()
    verdict = _python_verdict(blob)
    if verdict is None:
        assert code == 2 and out == "" and err.startswith(f"devplug checkpoint {action[0]}: ")
    elif action == ["verify"]:
        assert code == (0 if checksum(verdict[0]) == verdict[1] else 1)
    else:
        assert code == 0
    text = out + err
    assert not any(c < " " and c != "\n" or c in "\x7f\u202e\u2028" for c in text), "unescaped control character"
    if action == ["show", "--json"] and code == 0:
        json.loads(out)
