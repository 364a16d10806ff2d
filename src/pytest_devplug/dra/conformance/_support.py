"""Helpers shared by the DRA conformance modules (not collected: no ``test_`` prefix)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import pytest

from pytest_devplug import suite_support
from pytest_devplug.dra.counters import PoolCounters, together
from pytest_devplug.dra.handles import ClaimHandle, DriverHandle
from pytest_devplug.errors import UnsupportedOperationError, WaitTimeout
from pytest_devplug.waiting import wait_for

__all__ = [
    "CONSISTENTLY_S",
    "UNSCHEDULABLE_TEXT",
    "claim_ref",
    "consistently",
    "devices_together",
    "fault",
    "need_devices",
    "scheduled_condition",
    "short_dra_timings",
    "succeeded",
    "waited",
]

T = TypeVar("T")

#: How long a check watches that something does *not* happen (upstream's node e2e watch 5 s for slices).
CONSISTENTLY_S = 3.0
#: What kube-scheduler's DynamicResources plugin says of a node whose devices cannot satisfy a pod's claims.
UNSCHEDULABLE_TEXT = "cannot allocate all claims"


@contextmanager
def short_dra_timings(driver: DriverHandle, **seconds: float) -> Iterator[dict[str, float]]:
    """Set the kubelet's DRA periods (``wiping_delay``, ``retry_period``, ``reconcile_period``) for the block where the
    backend can; where it cannot (a real kubelet's are constants) the block runs with the kubelet's own. Yields the
    periods in force, for the block's waits to add."""
    dra = driver.dra
    try:
        old = dra.dra_timings()
    except UnsupportedOperationError as exc:
        pytest.skip(f"needs the kubelet's DRA periods ({sorted(seconds)}): {exc}")
    try:
        dra.set_dra_timings(**seconds)
    except UnsupportedOperationError:
        yield {k: old[k] for k in seconds}  # waited out as they are
        return
    try:
        yield dict(seconds)
    finally:
        dra.set_dra_timings(**{k: old[k] for k in seconds})


#: One call of the DRA fault injector; a fault it cannot make skips the check, saying which.
fault = partial(suite_support.fault, injector="DRA fault injector")


def claim_ref(claim: ClaimHandle) -> dict[str, str]:
    """The ``Claim`` a kubelet sends for ``claim`` (namespace, uid, name)."""
    return {"namespace": claim.namespace, "uid": claim.uid, "name": claim.name}


def succeeded(driver: DriverHandle, method: str, uid: str, since: int = 0) -> list[Any]:
    """The kubelet's calls of ``method`` to the driver carrying claim ``uid`` that succeeded, from its ``since``-th call
    on the node (``len(node.dra_calls())`` before the step being judged)."""
    return [
        c for c in driver.node.dra_calls(method, driver=driver.name, since=since) if uid in c.claim_uids and not c.error
    ]


def waited(
    probe: Callable[[], T], ok: Callable[[T], bool], what: str, *, driver: DriverHandle, timeout: float | None = None
) -> T:
    """A bounded wait that fails the check with what it saw (and stops at once when the driver process exited)."""
    __tracebackhide__ = True
    try:
        return wait_for(
            probe, ok, timeout=driver.node.timeout if timeout is None else timeout, what=what, give_up=driver.crashed
        )
    except WaitTimeout as exc:
        raise AssertionError(
            f"expected {what}; saw {exc.last!r}" + (f"; stopped early: {exc.reason}" if exc.reason else "")
        ) from None


def consistently(probe: Callable[[], T], ok: Callable[[T], bool], what: str, *, seconds: float = CONSISTENTLY_S) -> T:
    """``ok(probe())`` holds for ``seconds`` (checked every 0.2 s); fails at the first value that breaks it."""
    __tracebackhide__ = True
    end = time.monotonic() + seconds
    while True:
        value = probe()
        assert ok(value), f"expected {what} for {seconds:g} s; saw {value!r}"
        if time.monotonic() >= end:
            return value
        time.sleep(0.2)


def need_devices(driver: DriverHandle, n: int) -> list[tuple[str, str]]:
    """The driver's devices, or a skip saying the check needs ``n`` of them."""
    devices = driver.devices()
    if len(devices) < n:
        pytest.skip(f"needs {n} devices of {driver.name} on the node; it publishes {len(devices)}: {devices}")
    return devices


def devices_together(driver: DriverHandle) -> list[tuple[str, str]]:
    """As many of the driver's devices as one claim can hold at once: all of them, unless they share counters
    (partitions of one GPU and the GPU itself), then a largest set the counters allow
    (:mod:`~pytest_devplug.dra.counters`). A skip when the driver publishes none."""
    devices = need_devices(driver, 1)
    counters = PoolCounters.of(s.raw for s in driver.slices())
    return together(counters, devices) if counters.partitionable else devices


def scheduled_condition(pod: Any, driver: DriverHandle) -> dict[str, Any]:
    """The pod's PodScheduled condition once the scheduler has decided (True or False)."""
    __tracebackhide__ = True
    return waited(
        lambda: pod.scheduled_condition or {},
        lambda c: c.get("status") in ("True", "False"),
        "the scheduler's PodScheduled condition",
        driver=driver,
    )
