"""The mock GPU node's nvidia-smi: the settings NVIDIA's DRA driver makes reach the mock state, others are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_devplug.backends.mockstate import initial_state
from pytest_devplug.nvml import smi


def _run(state: Path, *args: str, env: bool = True) -> subprocess.CompletedProcess[str]:
    environ = {"DEVPLUG_NVML_STATE": str(state)} if env else {}
    return subprocess.run(
        [sys.executable, "-S", smi.__file__, *args], env=environ, capture_output=True, text=True, check=False
    )


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(initial_state(2, 0)))
    return path


def _gpus(state: Path) -> list[dict[str, object]]:
    return list(json.loads(state.read_text())["gpus"])


def test_time_slice_and_compute_mode_land_on_that_gpu(state: Path) -> None:
    uuid = str(_gpus(state)[1]["uuid"])
    done = _run(state, "-i", uuid, "-c", "DEFAULT")
    assert done.returncode == 0, done.stderr
    done = _run(state, "compute-policy", "-i", uuid, "--set-timeslice", "3")
    assert done.returncode == 0, done.stderr
    assert "Long" in done.stdout
    first, second = _gpus(state)
    assert (second[smi.TIMESLICE_FIELD], second[smi.COMPUTE_MODE_FIELD]) == (3, "DEFAULT")
    assert smi.TIMESLICE_FIELD not in first and smi.COMPUTE_MODE_FIELD not in first


def test_index_and_numeric_mode_as_nvidia_smi_takes_them(state: Path) -> None:
    assert _run(state, "--id=0", "--compute-mode=3").returncode == 0
    assert _gpus(state)[0][smi.COMPUTE_MODE_FIELD] == "EXCLUSIVE_PROCESS"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["compute-policy", "-i", "GPU-nope", "--set-timeslice", "1"], "no GPU 'GPU-nope'"),
        (["compute-policy", "-i", "0", "--set-timeslice", "4"], "invalid time-slice '4'"),
        (["-i", "0", "-c", "SHARED"], "invalid compute mode 'SHARED'"),
        (["-q"], "unsupported option '-q'"),
        (["compute-policy", "--set-timeslice", "1"], "-i is required"),
        (["-i", "0", "-c", "DEFAULT", "--set-timeslice", "1"], "unsupported command"),
    ],
)
def test_what_it_cannot_do_is_refused_and_the_state_kept(state: Path, args: list[str], says: str) -> None:
    before = state.read_text()
    done = _run(state, *args)
    assert done.returncode == 2 and says in done.stderr and "mock GPU node's nvidia-smi" in done.stderr, done.stderr
    assert state.read_text() == before


def test_off_the_mock_node_it_says_so(state: Path) -> None:
    done = _run(state, "-i", "0", "-c", "DEFAULT", env=False)
    assert done.returncode == 2 and "DEVPLUG_NVML_STATE is not set" in done.stderr
