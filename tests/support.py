"""What every test folder shares: the resource the included plugin advertises and the one bounded wait.

Test folders are packages (``tests.sim``, ``tests.plugin``, ...), so any subset of them collects together;
helpers are imported relatively (``from ..support import wait_until``), never ``from conftest import``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pytest_devplug.waiting import WaitTimeout, wait_for

__all__ = ["RESOURCE", "WAIT", "control_plane_bin_dir", "wait_until"]

T = TypeVar("T")

#: The included GPU plugin's extended resource (its default ``--resource-name``).
RESOURCE = "nvidia.com/gpu"

#: Bound of an event-driven wait in the tests. Generous on purpose: a passing wait ends as soon as its event
#: comes, so the bound costs nothing then, and on 2 busy cores one Python process start took over 10 s.
WAIT = 60.0


def wait_until(
    what: str,
    probe: Callable[[], T],
    ok: Callable[[T], bool] = bool,
    *,
    timeout: float = WAIT,
    interval: float = 0.02,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``probe`` until ``ok(value)``; on timeout fail saying what was awaited and the last value (or error) seen."""
    __tracebackhide__ = True
    try:
        return wait_for(probe, ok, timeout=timeout, what=what, interval=interval, retry_on=retry_on)
    except WaitTimeout as exc:
        seen: Any = exc.last if exc.last_error is None else exc.last_error
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last seen: {seen!r}") from None


def control_plane_bin_dir() -> Path:
    """The directory of the real control plane's binaries (the cache; built there when missing, as nox -s tests does)."""
    from pytest_devplug.controlplane import BinariesNotFoundError, resolve
    from pytest_devplug.controlplane.binaries import build

    try:
        found = resolve(download=False)
    except BinariesNotFoundError:
        found = build()
    return found["kube-apiserver"].parent
