"""Fixtures for the mock libnvidia-ml: the built library, loaded through ctypes, on a state file of the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.backends import mockstate
from pytest_devplug.nvml import STATE_ENV, mock_library
from pytest_devplug.nvml.probe import Nvml

from .nvml_helpers import StateFile


@pytest.fixture(scope="session")
def mock_lib_path() -> Path:
    return mock_library()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StateFile:
    """Four healthy GPUs on two NUMA nodes; the library reads this file at its next first nvmlInit."""
    f = StateFile(tmp_path / "mock-state.json")
    f.write(mockstate.initial_state(4, 2))
    monkeypatch.setenv(STATE_ENV, str(f.path))
    return f


@pytest.fixture
def nvml(mock_lib_path: Path, state: StateFile) -> Iterator[Nvml]:
    """The mock loaded in this process, initialised once; shut down fully afterwards."""
    lib = Nvml(str(mock_lib_path))
    lib.init()
    yield lib
    while int(lib.lib.nvmlShutdown()) == 0:  # down to refcount 0, whatever the test left
        pass
