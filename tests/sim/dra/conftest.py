"""Fixtures of the DRA-layer tests: a short root dir, a plugin manager + watcher on it, fake drivers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from .dra_fakes import FakeClaims, FakeDriver, FakeWiper, remove_root, short_root

from pytest_devplug.kubeletmodel.releases import KubeVersion
from pytest_devplug.sim.dra.health import HealthInfoCache
from pytest_devplug.sim.dra.manager import DRAManager
from pytest_devplug.sim.dra.plugins import DRAPluginManager
from pytest_devplug.sim.pluginwatcher import DRA_PLUGIN_TYPE, PluginWatcher


class Kubelet:
    """The DRA side of one kubelet, built from the modules under test; ``restart()`` makes a new one on
    the same root, as a kubelet restart does."""

    def __init__(
        self,
        root: Path,
        wiper: FakeWiper,
        claims: FakeClaims,
        *,
        wiping_delay: float = 30.0,
        health_retry_period: float = 0.1,
        clock: Callable[[], float] | None = None,
        kube: KubeVersion | None = None,
    ) -> None:
        self.root, self.wiper, self.claims = root, wiper, claims
        self.kube = kube or KubeVersion.of()
        self._kw: dict[str, Any] = {
            "wiping_delay": wiping_delay,
            "health_retry_period": health_retry_period,
            "kube": self.kube,
        }
        self._clock = clock
        self._start()

    def _start(self) -> None:
        self.health = HealthInfoCache(self._clock) if self._clock else HealthInfoCache()
        self.plugins = DRAPluginManager("node-1", wiper=self.wiper, health_cache=self.health, **self._kw)
        self.manager = DRAManager(self.root / "state", self.plugins, self.claims, health_cache=self.health)
        self.watcher = PluginWatcher(
            self.root / "plugins_registry", {DRA_PLUGIN_TYPE: self.plugins}, poll_interval=0.02, kube=self.kube
        )
        self.watcher.start()

    def stop(self) -> None:
        self.watcher.stop()
        self.plugins.stop()

    def restart(self) -> None:
        self.stop()
        self._start()


@pytest.fixture
def dra_root() -> Iterator[Path]:
    root = short_root()
    yield root
    remove_root(root)


@pytest.fixture
def dra_claims() -> FakeClaims:
    return FakeClaims()


@pytest.fixture
def dra_wiper() -> FakeWiper:
    return FakeWiper()


@pytest.fixture
def dra_drivers(dra_root: Path) -> Iterator[Callable[..., FakeDriver]]:
    """Makes started fake drivers under the root; all stopped at the end."""
    made: list[FakeDriver] = []

    def make(name: str = "gpu.example.com", **kw: Any) -> FakeDriver:
        d = FakeDriver(dra_root, name, **kw).start()
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


@pytest.fixture
def dra_kubelet_factory(
    dra_root: Path, dra_wiper: FakeWiper, dra_claims: FakeClaims
) -> Iterator[Callable[..., Kubelet]]:
    made: list[Kubelet] = []

    def make(**kw: Any) -> Kubelet:
        k = Kubelet(dra_root, dra_wiper, dra_claims, **kw)
        made.append(k)
        return k

    yield make
    for k in made:
        k.stop()


@pytest.fixture
def dra_kubelet(dra_kubelet_factory: Callable[..., Kubelet]) -> Kubelet:
    return dra_kubelet_factory()
