"""Fixtures of the device-layer tests (all prefixed ``dm_``): short plugin dirs, the real GPU
plugin as a subprocess, an in-process fake plugin for faults the real one cannot make, and
device managers whose ``on_change`` drives bounded waits."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_devplug.nvml import mock_env
from pytest_devplug.sim.devicemanager import DeviceManager
from pytest_devplug.procs.process import PluginProcess

from ..support import short_dir
from ._helpers import plugin_argv
from .dm_helpers import GPU, DmMockState, DmWaiter, FakePlugin, dm_gpu


@pytest.fixture
def dm_dir() -> Iterator[Path]:
    with short_dir("dm") as d:
        (d / "dp").mkdir()
        yield d / "dp"


@pytest.fixture
def dm_make(dm_dir: Path) -> Iterator[Callable[..., tuple[DeviceManager, DmWaiter]]]:
    """Factory of started device managers on ``dm_dir``; all are stopped at teardown."""
    made: list[DeviceManager] = []

    def make(**kw: Any) -> tuple[DeviceManager, DmWaiter]:
        waiter = DmWaiter()
        kw.setdefault("grace_period", 300.0)
        dm = DeviceManager(dm_dir, on_change=waiter.notify, **kw)
        dm.start()
        made.append(dm)
        return dm, waiter

    yield make
    for dm in made:
        dm.stop()


@pytest.fixture
def dm_state(dm_dir: Path) -> DmMockState:
    s = DmMockState(dm_dir.parent / "state.json")
    s.write([dm_gpu(0, 0), dm_gpu(1, 1)])
    return s


@pytest.fixture
def dm_plugin(dm_dir: Path, dm_state: DmMockState) -> Iterator[Callable[..., PluginProcess]]:
    """Factory of the real GPU plugin as a subprocess on ``dm_dir``; stopped at teardown."""
    procs: list[PluginProcess] = []

    def start(*extra: str) -> PluginProcess:
        argv = plugin_argv(dm_dir, dm_state.path, *extra, resource=GPU)
        p = PluginProcess(argv, log_path=dm_dir.parent / f"plugin{len(procs)}.log", env=mock_env(str(dm_state.path)))
        p.start()
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


@pytest.fixture
def dm_fake(dm_dir: Path) -> Iterator[Callable[..., FakePlugin]]:
    """Factory of in-process fake plugins serving on ``dm_dir``; stopped at teardown."""
    made: list[FakePlugin] = []

    def make(name: str = "fake.sock", **kw: Any) -> FakePlugin:
        f = FakePlugin(dm_dir / name, **kw)
        f.serve()
        made.append(f)
        return f

    yield make
    for f in made:
        f.stop()
