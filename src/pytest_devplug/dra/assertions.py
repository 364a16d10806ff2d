"""Assertion helpers for DRA drivers: bounded waits, failures that say what was expected and what was seen, and the
evidence (driver log, kubelet log, registrations, the kubelet's calls, slices, ``dra_manager_state``, pods) attached.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence

from ..evidence import Evidence, pod_events, pod_statuses, safe_evidence, tail, window_kubelet_log
from ..errors import DevplugAssertionError, WaitTimeout
from ..waiting import wait_for
from .handles import ClaimHandle, ClaimPodHandle, DriverHandle, nested_spec_hint
from .objects import DRACheckpoint, PreparedClaim

__all__ = [
    "assert_driver_registered",
    "assert_slices_published",
    "assert_claim_prepared",
    "assert_dra_checkpoint_survives_kubelet_restart",
    "assert_driver_reregisters_after_kubelet_restart",
    "dra_evidence",
]

#: How long the watcher's latest word on the driver's socket must stay a failure before a wait gives up on it.
_REFUSAL_SETTLE_S = 3.0


def _checkpoint_text(driver: DriverHandle) -> str:
    cp = driver.node.dra_checkpoint()
    if cp is None:
        return "<no dra_manager_state>"
    lines = [f"checksum stored {cp.stored}, computed {cp.computed}" + ("" if cp.checksum_ok else " (MISMATCH)")]
    for c in cp.claims:
        lines.append(f"claim {c.namespace}/{c.claim_name} uid {c.claim_uid} pods {sorted(c.pod_uids)}")
        for drv, devs in c.devices.items():
            for d in devs:
                lines.append(
                    f"  {drv}: pool {d.pool} device {d.device} requests {list(d.requests)} cdi {list(d.cdi_device_ids)}"
                )
    return "\n".join(lines)


def dra_evidence(driver: DriverHandle, pods: Iterable[tuple[str, str]] = ()) -> list[Evidence]:
    """Everything worth reading when a DRA check fails."""
    pods = list(pods)
    node, backend = driver.node, driver.node.backend
    ev = [
        safe_evidence("driver log", lambda: tail(driver.log())),
        safe_evidence("kubelet log", lambda: window_kubelet_log(backend, node.name)),
        safe_evidence(
            "registrations",
            lambda: (
                "\n".join(f"{e.kind} {e.name} {e.socket} {e.detail}".rstrip() for e in node.registration_events()[-20:])
                or "<none>"
            ),
        ),
        safe_evidence(
            "kubelet DRA calls",
            lambda: (
                "\n".join(
                    f"{time.strftime('%H:%M:%S', time.localtime(c.at))} {c.method} {c.driver} "
                    f"{list(c.claim_uids)} {c.error or 'ok'}"
                    for c in node.dra_calls()[-30:]
                )
                or "<none>"
            ),
        ),
        safe_evidence(
            "resource slices", lambda: "\n".join(s.describe() for s in node.slices()) or "<none on this node>"
        ),
        safe_evidence("dra_manager_state", lambda: _checkpoint_text(driver)),
    ]
    if pods:
        ev.append(safe_evidence("pods", lambda: pod_statuses(backend, pods)))
        ev.append(safe_evidence("pod events", lambda: pod_events(backend, pods)))
    return ev


def _fail(message: str, driver: DriverHandle, pods: Iterable[tuple[str, str]] = ()) -> DevplugAssertionError:
    return DevplugAssertionError(message, dra_evidence(driver, pods))


def _refused(driver: DriverHandle) -> str | None:
    """The watcher's latest outcome for the driver is a failure that has stood for a while: why (a ``give_up``)."""
    events = [
        e
        for e in driver.node.registration_events()
        if e.name == driver.name or (e.kind == "failed" and driver.name in e.socket)
    ]
    if not events or events[-1].kind != "failed":
        return None
    failures = [e for e in events if e.kind == "failed"]
    return (
        f"the kubelet refused the registration {len(failures)} times, last: {events[-1].detail}"
        if len(failures) >= 3
        else None
    )


def _registration_seen(driver: DriverHandle) -> str:
    events = driver.node.registration_events()[-5:]
    seen = "; ".join(f"{e.kind} {e.name or '?'} at {e.socket}" + (f": {e.detail}" if e.detail else "") for e in events)
    return (
        f"registered drivers {driver.node.registered_drivers()}; "
        f"watcher outcomes: {seen or 'none (no socket in plugins_registry)'}"
    )


def assert_driver_registered(driver: DriverHandle, timeout: float | None = None) -> None:
    """The kubelet registered ``driver`` (its name, through the plugin watcher) and is connected to its DRA socket."""
    __tracebackhide__ = True

    def give_up() -> str | None:
        return driver.crashed() or _refused(driver)

    try:
        wait_for(
            lambda: driver.usable,
            bool,
            timeout=driver.node.timeout if timeout is None else timeout,
            what=f"DRA driver {driver.name} registered and connected",
            give_up=give_up,
        )
    except WaitTimeout as exc:
        why = f"; stopped early: {exc.reason}" if exc.reason else ""
        others = [n for n in driver.node.registered_drivers() if n != driver.name]
        hint = f" (the kubelet registered {others}: is --devplug-driver-name right?)" if others else ""
        raise _fail(
            f"expected DRA driver {driver.name} registered with the kubelet on {driver.node.name} and its DRA socket "
            f"connected{why}; saw {_registration_seen(driver)}{hint}",
            driver,
        ) from None


def _pool_problems(driver: DriverHandle) -> list[str]:
    """Pools whose slices are not complete: a pool's ``resourceSliceCount`` slices of its newest generation."""
    problems = []
    slices = driver.slices()
    for pool in sorted({s.pool for s in slices}):
        mine = [s for s in slices if s.pool == pool]
        newest = max(s.generation for s in mine)
        current = [s for s in mine if s.generation == newest]
        if len(current) != current[0].slice_count:
            problems.append(
                f"pool {pool} generation {newest}: {len(current)} slices, resourceSliceCount {current[0].slice_count}"
            )
    return problems


def assert_slices_published(driver: DriverHandle, min_devices: int = 1, timeout: float | None = None) -> list[str]:
    """ResourceSlices of ``driver`` for its node hold at least ``min_devices`` devices, each pool complete (as many
    slices of its newest generation as ``resourceSliceCount`` says). Returns the devices (``pool/device``)."""
    __tracebackhide__ = True

    def ok(devices: list[tuple[str, str]]) -> bool:
        return len(devices) >= min_devices and not _pool_problems(driver)

    try:
        devices = wait_for(
            driver.devices,
            ok,
            timeout=driver.node.timeout if timeout is None else timeout,
            what=f"ResourceSlices of {driver.name} on {driver.node.name}",
            give_up=driver.crashed,
        )
    except WaitTimeout as exc:
        why = f"; stopped early: {exc.reason}" if exc.reason else ""
        everything = [s.describe() for s in driver.node.slices()]
        raise _fail(
            f"expected ResourceSlices with spec.driver={driver.name} and spec.nodeName={driver.node.name} "
            f"holding at least {min_devices} devices in complete pools{why}; "
            f"saw {len(exc.last or [])} devices {exc.last}, "
            f"pool problems {_pool_problems(driver)}; all slices of the node: {everything or 'none'}",
            driver,
        ) from None
    return [f"{p}/{d}" for p, d in devices]


def _prepared_problems(claim: ClaimHandle, prepared: PreparedClaim | None, pod_uid: str, driver: str) -> list[str]:
    """What is wrong with the kubelet's record of ``claim`` for the pod: missing, pod not listed, devices other than
    the ones allocated to ``driver``."""
    if prepared is None:
        return [f"claim {claim.namespace}/{claim.name} is not in dra_manager_state"]
    problems = []
    if pod_uid not in prepared.pod_uids:
        problems.append(f"pod {pod_uid} is not among the claim's pods {sorted(prepared.pod_uids)}")
    allocated = {(a.pool, a.device): a.request for a in claim.allocated if a.driver == driver}
    devices = prepared.devices.get(driver)
    if devices is None:
        return [*problems, f"no DriverState for {driver} (drivers: {sorted(prepared.devices)})"]
    got = {(d.pool, d.device) for d in devices}
    if got != set(allocated):
        problems.append(f"{driver} prepared {sorted(got)}; the scheduler allocated {sorted(allocated)}")
    for d in devices:
        request = allocated.get((d.pool, d.device))
        if request is not None and d.requests and request.split("/")[0] not in d.requests:
            problems.append(
                f"device {d.pool}/{d.device} answered for requests {list(d.requests)}, allocated for {request!r}"
            )
    return problems


def assert_claim_prepared(
    pod: ClaimPodHandle, driver: DriverHandle, timeout: float | None = None
) -> list[PreparedClaim]:
    """``pod`` runs with its claims prepared by ``driver``: each claim is in the kubelet's ``dra_manager_state`` with
    the pod's UID and exactly the devices the scheduler allocated to the driver, and the default container got the CDI
    device IDs the driver returned (resolved from the spec files it wrote; unresolvable ones fail the container).
    Returns what the kubelet checkpointed for each claim."""
    __tracebackhide__ = True
    pods = [(pod.name, pod.namespace)]
    try:
        pod.wait_running(timeout)
    except AssertionError as exc:
        pending = driver.node.pending_prepares()
        raise _fail(
            f"expected pod {pod.namespace}/{pod.name} to run with its claims prepared: {exc}; "
            f"prepares the kubelet retries: {pending or 'none'}{nested_spec_hint(pod, driver)}",
            driver,
            pods,
        ) from None
    uid = pod.uid
    claims = pod.claims
    if not claims:
        raise _fail(
            f"pod {pod.namespace}/{pod.name} uses no ResourceClaim (its claims: {pod.claim_names()})", driver, pods
        )
    found, problems = [], []
    for claim in claims:
        prepared = claim.prepared()
        problems += [f"{claim.name}: {p}" for p in _prepared_problems(claim, prepared, uid, driver.name)]
        if prepared is not None:
            found.append(prepared)
    want = [i for p in found for i in p.cdi_device_ids(driver.name)]
    given = pod.cdi_devices
    missing = [i for i in want if i not in given]
    if missing:
        problems.append(f"the container did not get the CDI devices {missing} (it got {given})")
    if problems:
        raise _fail(
            f"claims of pod {pod.namespace}/{pod.name} not prepared as allocated: " + "; ".join(problems), driver, pods
        )
    return found


def _entries(cp: DRACheckpoint | None) -> dict[str, tuple[str, str, frozenset[str], str]]:
    if cp is None:
        return {}
    return {
        c.claim_uid: (
            c.namespace,
            c.claim_name,
            c.pod_uids,
            json.dumps({k: [vars(d) for d in v] for k, v in sorted(c.devices.items())}, default=list),
        )
        for c in cp.claims
    }


def assert_driver_reregisters_after_kubelet_restart(driver: DriverHandle, timeout: float | None = None) -> None:
    """Restart the kubelet: the new kubelet's plugin watcher registers the driver again from its socket and connects
    to it. (The kubelet also deletes the node's ResourceSlices on start; drivers on upstream's ``kubeletplugin``
    helper publish them again after its 30 s sync delay: ``assert_slices_published`` with a timeout above that
    judges it.)"""
    __tracebackhide__ = True
    node = driver.node
    node.restart_kubelet()
    assert_driver_registered(driver, node.reregistration_timeout if timeout is None else timeout)


def assert_dra_checkpoint_survives_kubelet_restart(
    driver: DriverHandle, pods: Sequence[ClaimPodHandle]
) -> DRACheckpoint:
    """Restart the kubelet with ``pods`` running: ``dra_manager_state`` is read back (checksum right), every claim keeps
    its pods and prepared devices, the driver registers again, and the pods keep running. The kubelet (every release
    from 1.34 on) prepares claims only on the way to creating a pod's sandbox, so it asks the driver nothing here: a
    repeated prepare is judged where it is driven, by a direct second call and by a node reboot. Returns the
    checkpoint after."""
    __tracebackhide__ = True
    node = driver.node
    names = [(p.name, p.namespace) for p in pods]
    before = node.dra_checkpoint()
    if before is None or not before.claims:
        raise _fail(
            "expected dra_manager_state to hold the running pods' claims before the restart; it holds none",
            driver,
            names,
        )
    assert_driver_reregisters_after_kubelet_restart(driver)
    after = node.dra_checkpoint()
    problems = []
    if after is None:
        problems.append("dra_manager_state is gone")
    elif not after.checksum_ok:
        problems.append(f"checksum stored {after.stored}, computed {after.computed}")
    elif _entries(after) != _entries(before):
        problems.append(f"entries before {_entries(before)}, after {_entries(after)}")
    for p in pods:
        if p.phase != "Running":
            problems.append(f"pod {p.name} is {p.phase}")
    if problems or after is None:
        raise _fail(
            "after a kubelet restart the DRA checkpoint must read back as it was written: " + "; ".join(problems),
            driver,
            names,
        )
    return after
