"""Fixtures for the GPU plugin tests (helpers live in gpu_plugin_helpers.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_devplug.nvml import mock_env

from ..support import short_dir
from .gpu_plugin_helpers import RESOURCE, FakeKubelet, MockStateFile, PluginProcess


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    with short_dir("dp") as d:
        yield d


@pytest.fixture
def mock_state(tmp_path: Path) -> MockStateFile:
    return MockStateFile(tmp_path / "mock-state.json")


@pytest.fixture
def kubelet_factory(plugin_dir: Path, tmp_path: Path) -> Iterator[Callable[..., FakeKubelet]]:
    started: list[FakeKubelet] = []

    def make(refuse: str | None = None) -> FakeKubelet:
        k = FakeKubelet(plugin_dir, refuse, log_dir=tmp_path).start()
        started.append(k)
        return k

    try:
        yield make
    finally:
        for k in started:
            k.stop()


@pytest.fixture
def kubelet(kubelet_factory: Callable[..., FakeKubelet]) -> FakeKubelet:
    return kubelet_factory()


@pytest.fixture
def start_plugin(tmp_path: Path, plugin_dir: Path, mock_state: MockStateFile) -> Iterator[Callable[..., PluginProcess]]:
    """Start the plugin in mock mode; extra args and env vars are appended."""
    procs: list[PluginProcess] = []

    def start(*extra: str, env: dict[str, str] | None = None, base: bool = True) -> PluginProcess:
        args = (
            [
                "--plugin-dir",
                str(plugin_dir),
                "--resource-name",
                RESOURCE,
                "--nvml",
                "mock",
                "--mock-state",
                str(mock_state.path),
                "--log-level",
                "debug",
            ]
            if base
            else []
        )
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DP_")}
        full_env.update(mock_env(str(mock_state.path)))  # the mock libnvidia-ml on the loader's path
        full_env.update(env or {})
        p = PluginProcess(args + list(extra), tmp_path / f"plugin-{len(procs)}.log", full_env)
        procs.append(p)
        return p

    try:
        yield start
    finally:
        for p in procs:
            p.cleanup()
