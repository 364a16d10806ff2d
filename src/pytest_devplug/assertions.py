"""Assertion helpers that check what matters about a device plugin, with bounded waits and evidence.

Each helper waits (tenacity, bounded by the handle's timeout unless given) for the cluster to settle,
and on failure raises :class:`~pytest_devplug.errors.DevplugAssertionError` whose message says what
was expected and what was seen, carrying the plugin log, kubelet log, node status, pod events and
checkpoint; the pytest plugin attaches those to the test report.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Union

from google.protobuf.message import DecodeError

from .backends.base import ContainerView
from .checkpoint_view import decode_alloc_resp
from .errors import DevplugAssertionError, PodRejectedError, WaitTimeout
from .evidence import collect_evidence, current_test_lines
from .handles import NodeHandle, PluginHandle, PodFactory, PodHandle
from .waiting import wait_for

__all__ = [
    "registration_path",
    "watcher_refusals",
    "UNLOGGED_PATH",
    "INFERRED_WATCHER_PATH",
    "assert_registered",
    "assert_allocatable",
    "assert_devices_unhealthy",
    "assert_limit_rules",
    "assert_allocate_injections",
    "assert_checkpoint_survives_kubelet_restart",
    "assert_reregisters_after_kubelet_restart",
    "describe_view",
    "ValueMatcher",
]

#: An expected env/annotation value: exact text, a regex (searched), or a predicate.
ValueMatcher = Union[str, "re.Pattern[str]", Callable[[str], bool]]


def _fail(message: str, node: NodeHandle | None, pods: Iterable[PodHandle] = ()) -> DevplugAssertionError:
    backend = node.backend if node is not None else next(iter(pods)).backend
    return DevplugAssertionError(
        message, collect_evidence(backend, node.name if node else None, [(p.name, p.namespace) for p in pods])
    )


def _kubelet_log(node: NodeHandle) -> str | Exception:
    """The node's kubelet log, or why it could not be read. What is drawn from it only explains a failure (or
    lets a wait give up early), so reading it must never raise in the failure's place."""
    try:
        return node.kubelet_log()
    except Exception as exc:  # noqa: BLE001 - any backend's error: the caller goes on without the hint
        return exc


def _kubelet_lines(node: NodeHandle, *needles: str, limit: int = 6) -> str:
    """The kubelet log lines that mention any of ``needles``: usually the reason a registration failed."""
    log = _kubelet_log(node)
    if isinstance(log, Exception):
        return f" (kubelet log unreadable: {log})"
    lines = [ln for ln in current_test_lines(log) if any(n and n in ln for n in needles)]
    if not lines:
        return " (the kubelet log says nothing about it)"
    return "; kubelet log: " + " | ".join(ln.strip() for ln in lines[-limit:])


#: Upstream kubelet log texts -> what they mean for the plugin author.
_REGISTRATION_FAULTS = (
    (
        "Error connecting to device plugin client",
        "the kubelet could not reach the plugin's gRPC server when it registered: "
        "a plugin must be serving on its socket BEFORE it calls Register",
    ),
    (
        "is not supported by kubelet",
        "the plugin registered with an API version the kubelet does not support (want v1beta1)",
    ),
    ("is invalid", "the plugin registered an invalid extended-resource name"),
)


def _registration_hint(node: NodeHandle, resource: str) -> str:
    log = _kubelet_log(node)
    if isinstance(log, Exception):
        return ""
    lines = current_test_lines(log)
    hints = [hint for needle, hint in _REGISTRATION_FAULTS if any(needle in ln and resource in ln for ln in lines)]
    asked = any("Got registration request" in ln and resource in ln for ln in lines)
    connected = any("Device plugin connected" in ln and resource in ln for ln in lines)
    if asked and not connected and not hints:
        hints.append(
            "the plugin called Register but the kubelet has not connected to its socket: "
            "a plugin must be serving on its socket BEFORE it calls Register"
        )
    return "".join(f"; FAULT: {h}" for h in hints)


_REFUSALS = ("Bad registration request", "Error connecting to device plugin client")
#: How long the kubelet's latest word on a resource stays a refusal (retries refused too) before a wait
#: gives up on it (a plugin may retry and succeed), and how often the kubelet log is read for it (on
#: kind that is a ``docker exec``).
_REFUSAL_SETTLE_S = 2.0
_REFUSAL_POLL_S = 0.5


def _refusal_watch(node: NodeHandle, resource: str) -> Callable[[], str | None]:
    """A ``give_up`` predicate: the kubelet's latest word on ``resource`` has been a refusal for a while."""
    since: list[float] = []  # when this streak of refusals was first seen
    checked = [0.0]
    verdict: list[str | None] = [None]

    def refused() -> str | None:
        now = time.monotonic()
        if now - checked[0] < _REFUSAL_POLL_S:
            return verdict[0]
        checked[0] = now
        log = _kubelet_log(node)
        if isinstance(log, Exception):
            return None  # then the wait simply runs to its timeout
        lines = [ln for ln in log.splitlines() if resource in ln]
        relevant = [
            ln
            for ln in lines
            if "Got registration request" in ln or "Device plugin connected" in ln or any(r in ln for r in _REFUSALS)
        ]
        if not relevant or not any(r in relevant[-1] for r in _REFUSALS):
            since.clear()
            return None
        if not since:
            since.append(now)
        if now - since[0] >= _REFUSAL_SETTLE_S:
            verdict[0] = "the kubelet refused the registration: " + relevant[-1].strip()
        return verdict[0]

    return refused


_KUBELET_SOCKET = re.compile(r'kubeletSocket="([^"]+)"')
#: The kubelet's words for the two ways a device plugin registers (``Register`` on kubelet.sock; a socket its plugin
#: watcher found in ``plugins_registry/``, logged at -v=2), and for what its plugin watcher could not register.
REGISTER_CALL = "Got registration request"
WATCHER_REGISTRATION = "Registering plugin at endpoint"
WATCHER_ERROR = "RegisterPlugin error"
_ENDPOINT = re.compile(r'endpoint="?([^" ]+)')


#: How a registration is noted that the kubelet's log shows no ``Register`` call for and no watcher line (below -v=2).
INFERRED_WATCHER_PATH = (
    "plugins_registry (no Register call in the kubelet's log; it logs the watcher's registrations at -v=2)"
)
#: What the registration checks note when the kubelet's log cannot tell how the plugin registered.
UNLOGGED_PATH = "unknown (the kubelet's log could not be read)"


def registration_path(node: NodeHandle, resource: str) -> str | None:
    """How the plugin of ``resource``, registered now, last registered, in the kubelet's words: ``"kubelet.sock"`` (it
    called ``Register``), ``"plugins_registry"`` (the kubelet's plugin watcher found its socket). A kubelet below -v=2
    does not log the watcher's registrations but logs every ``Register`` call at any verbosity: a registered resource
    without one in this run's log came through the watcher, said as :data:`INFERRED_WATCHER_PATH` (a plugin that
    registered before the run's log began, one adopted on a cluster, would be taken for one too). ``None`` when the log
    cannot be read or is empty."""
    log = _kubelet_log(node)
    if isinstance(log, Exception) or not log.strip():
        return None
    for ln in reversed(log.splitlines()):
        if resource in ln and REGISTER_CALL in ln:
            return "kubelet.sock"
        if resource in ln and WATCHER_REGISTRATION in ln:
            return "plugins_registry"
    return INFERRED_WATCHER_PATH


def watcher_refusals(lines: Iterable[str], resource: str) -> list[str]:
    """What the plugin watcher logged against the socket of ``resource`` before it registered (the watcher's
    errors name the socket, not the resource: the socket is the endpoint of the registration that followed)."""
    lines = list(lines)
    endpoints = {
        m.group(1) for ln in lines if WATCHER_REGISTRATION in ln and resource in ln and (m := _ENDPOINT.search(ln))
    }
    names = {"/" + e.rsplit("/", 1)[-1] for e in endpoints}  # the socket's name: the log may show its host path
    return [ln for ln in lines if WATCHER_ERROR in ln and any(n in ln for n in names)]


def _unreached_hint(node: NodeHandle) -> str:
    """When no plugin ever called Register: what the plugin watcher saw instead, or where the kubelet listens and how
    a hard-coded path is run."""
    log = _kubelet_log(node)
    if isinstance(log, Exception):
        return ""
    lines = log.splitlines()
    if any(REGISTER_CALL in ln for ln in lines):
        return ""
    watched = [ln.strip() for ln in lines if WATCHER_ERROR in ln or WATCHER_REGISTRATION in ln]
    if watched:
        return (
            "; FAULT: the plugin never called Register on kubelet.sock, and the kubelet's plugin watcher did not "
            "register it from plugins_registry/ (a socket there must answer GetInfo with type DevicePlugin, the "
            "resource name and a version the kubelet speaks, v1beta1); the watcher logged: " + " | ".join(watched[-3:])
        )
    found = [m.group(1) for ln in lines if (m := _KUBELET_SOCKET.search(ln))]
    where = found[-1] if found else "/var/lib/kubelet/device-plugins/kubelet.sock"
    if "namespace" in where:
        fix = "a plugin that takes its directory as a flag needs {plugin_dir} in its command"
    else:
        fix = (
            "a plugin that hard-codes /var/lib/kubelet/device-plugins needs a command without {plugin_dir}, "
            "which runs it with the node's directories at the kubelet's standard paths"
        )
    return (
        "; FAULT: the plugin never reached kubelet.sock (no Register call arrived) and put no socket the kubelet's "
        f"plugin watcher registered in plugins_registry/; the kubelet listens on {where}; {fix}"
    )


def assert_registered(
    plugin: PluginHandle, *, count: int | None = None, timeout: float | None = None, resource: str | None = None
) -> tuple[int, int]:
    """The plugin registered its resource (``resource``: another one it advertises): the node lists it with
    capacity ``count`` (or > 0).

    Returns ``(capacity, allocatable)``. On failure the message quotes the kubelet's own words about
    the resource (a rejected version or name, a plugin that registered before serving, ...).
    """
    __tracebackhide__ = True
    node, res = plugin.node, resource or plugin.resource_name

    def ok(c: tuple[int | None, int | None]) -> bool:
        return c[0] is not None and (c[0] == count if count is not None else c[0] > 0)

    refused = _refusal_watch(node, res)
    try:
        cap, alloc = wait_for(
            lambda: node.counts(res),
            ok,
            timeout=node.timeout if timeout is None else timeout,
            what=f"{res} registered",
            give_up=lambda: plugin.crashed() or refused(),
        )
    except WaitTimeout as exc:
        exited = plugin.exited()
        running = f"; {exited}" if exited and exited != exc.reason else ""
        stopped = f"; stopped early: {exc.reason}" if exc.reason else ""
        raise _fail(
            f"expected resource {res} registered on node {node.name} with capacity "
            f"{count if count is not None else '> 0'}; saw (capacity, allocatable) = {exc.last}{stopped}{running}"
            + _registration_hint(node, res)
            + ("" if plugin.exit_cause() else _unreached_hint(node))  # it said why: no guessing
            + _kubelet_lines(node, res, "egist"),
            node,
        ) from None
    return (cap or 0, alloc or 0)


def assert_allocatable(
    plugin: PluginHandle, allocatable: int, *, capacity: int | None = None, timeout: float | None = None
) -> None:
    """The node's allocatable (and, if given, capacity) of the plugin's resource settle at these values.

    Capacity counts every device the plugin lists; allocatable only the healthy ones. Stops at once when
    the plugin process exited without the test stopping it.
    """
    node, res = plugin.node, plugin.resource_name
    try:
        node.wait_counts(res, capacity=capacity, allocatable=allocatable, timeout=timeout, give_up=plugin.crashed)
    except WaitTimeout as exc:
        raise _fail(
            f"expected {res} on node {node.name}: allocatable {allocatable}"
            + (f", capacity {capacity}" if capacity is not None else "")
            + f"; saw (capacity, allocatable) = {exc.last}"
            + (f"; stopped early: {exc.reason}" if exc.reason else ""),
            node,
        ) from None


def assert_devices_unhealthy(
    plugin: PluginHandle,
    gone: Iterable[str],
    *,
    capacity: int,
    cause: str,
    kept: Iterable[str] = (),
    timeout: float | None = None,
) -> None:
    """Every device in ``gone`` leaves the allocatable devices (and the count drops by exactly that many,
    capacity staying ``capacity``), every device in ``kept`` stays; ``cause`` says what happened to them.

    A fault of a GPU must reach every device the plugin backs with it (replicas, MIG devices, MPS shares):
    on failure the message names each one still Healthy. Stops at once when the plugin process exited.
    """
    node, res = plugin.node, plugin.resource_name
    gone, kept = sorted(set(gone)), sorted(set(kept))
    want = capacity - len(gone)

    def probe() -> tuple[tuple[int | None, int | None], list[str]]:
        return node.counts(res), node.device_ids(res)

    def ok(seen: tuple[tuple[int | None, int | None], list[str]]) -> bool:
        (cap, alloc), ids = seen
        return cap == capacity and alloc == want and not set(gone) & set(ids) and set(kept) <= set(ids)

    try:
        wait_for(
            probe,
            ok,
            timeout=node.timeout if timeout is None else timeout,
            what=f"{gone} Unhealthy",
            give_up=plugin.crashed,
        )
    except WaitTimeout as exc:
        counts, ids = exc.last if exc.last is not None else ((None, None), [])
        healthy = [d for d in gone if d in ids]
        lost = [d for d in kept if d not in ids]
        problems = []
        if healthy:
            problems.append(f"still Healthy (allocatable): {healthy}")
        if lost:
            problems.append(f"Unhealthy though it should not be: {lost}")
        raise _fail(
            f"{cause}: expected every device it backs Unhealthy ({gone}), so {res} on node {node.name} at "
            f"allocatable {want}, capacity {capacity}; saw (capacity, allocatable) = {counts}"
            + (f"; {'; '.join(problems)}" if problems else "")
            + (f"; stopped early: {exc.reason}" if exc.reason else ""),
            node,
        ) from None


@dataclass
class _Row:
    case: str
    expected: str
    seen: str = ""
    ok: bool = False


def assert_limit_rules(pods: PodFactory, *, timeout: float | None = None) -> None:
    """The API server's and scheduler's rules for an extended resource, row by row.

    limits only -> accepted (requests defaulted to the limit) and runs; requests == limits -> runs;
    requests only -> rejected ("Limit must be set"); requests != limits -> rejected ("must be equal");
    a non-integer quantity -> rejected ("must be an integer"); more than allocatable -> Pending with a
    FailedScheduling "Insufficient <resource>" event. Every row is checked; all failures are reported.
    """
    res = pods.resource_name
    node = NodeHandle(pods.backend, pods.node, timeout=pods.timeout if timeout is None else timeout)
    rows: list[_Row] = []
    made: list[PodHandle] = []

    def accepted(case: str, runs: bool, **kw: object) -> None:
        row = _Row(case, "accepted, requests == limits, Running" if runs else "accepted")
        rows.append(row)
        try:
            pod = pods(**kw)  # type: ignore[arg-type]
        except PodRejectedError as exc:
            row.seen = f"rejected: {exc.message}"
            return
        made.append(pod)
        c = pod.obj["spec"]["containers"][0].get("resources", {})
        req, lim = (c.get("requests") or {}).get(res), (c.get("limits") or {}).get(res)
        if req != lim:
            row.seen = f"accepted but requests={req!r} limits={lim!r} (defaulting must copy the limit)"
            return
        try:
            pod.wait_running(timeout=node.timeout)
        except AssertionError:
            row.seen = f"phase {pod.phase} reason={pod.reason!r} message={pod.message!r}"
            return
        row.ok, row.seen = True, "Running"
        pod.delete()

    def rejected(case: str, needle: str, **kw: object) -> None:
        row = _Row(case, f"rejected with a message containing {needle!r}")
        rows.append(row)
        try:
            pod = pods(**kw)  # type: ignore[arg-type]
        except PodRejectedError as exc:
            row.ok = needle in exc.message
            row.seen = f"rejected {exc.status}: {exc.message}"
            return
        made.append(pod)
        row.seen = f"accepted (phase {pod.phase})"

    accepted("limits only", True, limits=1)
    accepted("requests == limits", True, limits=1, requests=1)
    rejected("requests only", "Limit must be set for non overcommitable resources", requests=1)
    rejected("requests != limits", f"must be equal to {res} limit", limits=2, requests=1)
    rejected("non-integer quantity", "must be an integer", limits="500m", requests="500m")

    too_many = node.allocatable(res) + 1
    row = _Row(f"more than allocatable ({too_many})", f"Pending with FailedScheduling 'Insufficient {res}'")
    rows.append(row)
    try:
        pod = pods(limits=too_many)
    except PodRejectedError as exc:
        row.seen = f"rejected: {exc.message}"
    else:
        made.append(pod)
        try:
            msg = pod.wait_event(rf"FailedScheduling: .*Insufficient {re.escape(res)}", timeout=node.timeout)
            phase = pod.phase
            row.ok = phase == "Pending" and not pod.node_name
            row.seen = f"phase {phase}, nodeName={pod.node_name!r}, event {msg!r}"
        except AssertionError:
            row.seen = f"phase {pod.phase}, events {pod.event_messages}"

    bad = [r for r in rows if not r.ok]
    if bad:
        table = "\n".join(f"  {r.case}: expected {r.expected}; saw {r.seen}" for r in bad)
        raise _fail(
            f"extended-resource rules for {res} broken in {len(bad)} of {len(rows)} cases:\n{table}", node, made
        )


def _match(value: str | None, want: ValueMatcher) -> bool:
    if value is None:
        return False
    if isinstance(want, str):
        return value == want
    if isinstance(want, re.Pattern):
        return want.search(value) is not None
    return bool(want(value))


def describe_view(view: ContainerView, indent: str = "  ") -> str:
    """What the runtime applied to a container, one injection a line (for failure messages)."""
    lines = [f"env {k}={v}" for k, v in sorted(view.envs.items())]
    lines += [f"device {d.host_path} -> {d.container_path} ({d.permissions})" for d in view.devices]
    lines += [f"mount {m.host_path} -> {m.container_path} ({'ro' if m.read_only else 'rw'})" for m in view.mounts]
    lines += [f"annotation {k}={v}" for k, v in sorted(view.annotations.items())]
    lines += [f"cdi {c}" for c in view.cdi_devices]
    return "\n".join(indent + ln for ln in lines) or f"{indent}(nothing)"


def assert_allocate_injections(
    pod: PodHandle,
    *,
    env: Mapping[str, ValueMatcher] | None = None,
    device_nodes: Iterable[str] | None = None,
    mounts: Iterable[str] | None = None,
    annotations: Mapping[str, ValueMatcher] | None = None,
    cdi_devices: Iterable[str] | None = None,
    ids_visible: bool = False,
    timeout: float | None = None,
) -> None:
    """What the plugin's Allocate put into the container, as the container sees it.

    Always: the pod runs, it was assigned devices, something was injected, device-node permissions
    use only ``r``/``w``/``m``, CDI names are fully qualified (``vendor/class=name``) and the view's device
    nodes and mounts (its CDI devices' edits included) are in the container (``exec ls -d``). With
    ``ids_visible`` every assigned device ID must also appear in some injection (env value, annotation,
    mount or device path, CDI name): a convention of plugins whose IDs name the device (GPU UUIDs),
    not a kubelet rule, hence off by default (IDs may be opaque: a hash, ``card0-0``). ``env`` is
    read with ``exec env`` in the container; the rest from the runtime's view of the container.
    A failure lists what was injected.
    """
    pod.wait_running(timeout=timeout)
    node = NodeHandle(pod.backend, pod.node_name or "", timeout=pod.timeout)
    problems: list[str] = []
    ids = pod.allocated_devices
    if not ids:
        problems.append(f"no {pod.resource_name} devices assigned to container {pod.container} (pod-resources)")
    view = pod.view()
    if view.empty:
        problems.append(
            f"Allocate injected nothing into container {pod.container} for devices {ids}: "
            "no env, mounts, device nodes, annotations or CDI devices"
        )
    for d in view.devices:
        if not d.permissions or set(d.permissions) - set("rwm"):
            problems.append(f"device node {d.container_path} has permissions {d.permissions!r} (letters from r, w, m)")
    for name in view.cdi_devices:
        if not re.fullmatch(r"[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+=[a-zA-Z0-9._:-]+", name):
            problems.append(f"CDI device {name!r} is not a fully qualified name vendor/class=name")
    if view.devices or view.mounts:
        wanted = sorted({d.container_path for d in view.devices} | {m.container_path for m in view.mounts})
        listed = set(pod.exec("ls", "-d", *wanted).stdout.split())
        if absent := [p for p in wanted if p not in listed]:
            problems.append(
                f"{absent} were injected (device nodes and mounts, its CDI devices' edits included) but the container "
                "has nothing there: the runtime did not apply them (does it resolve CDI names?)"
            )
    if env:
        out = pod.exec("env")
        seen_env = dict(ln.split("=", 1) for ln in out.stdout.splitlines() if "=" in ln)
        for k, want in env.items():
            if not _match(seen_env.get(k), want):
                problems.append(f"env {k}: expected {want!r}, container has {seen_env.get(k)!r}")
    for path in device_nodes or ():
        if path not in {d.container_path for d in view.devices}:
            problems.append(f"device node {path} missing; container has {[d.container_path for d in view.devices]}")
    for path in mounts or ():
        if path not in {m.container_path for m in view.mounts}:
            problems.append(f"mount {path} missing; container has {[m.container_path for m in view.mounts]}")
    for k, want in (annotations or {}).items():
        if not _match(view.annotations.get(k), want):
            problems.append(f"annotation {k}: expected {want!r}, container has {view.annotations.get(k)!r}")
    for name in cdi_devices or ():
        if name not in view.cdi_devices:
            problems.append(f"CDI device {name} missing; container has {list(view.cdi_devices)}")
    if ids_visible and ids and not view.empty:
        texts = [
            *view.envs.values(),
            *view.annotations.values(),
            *view.cdi_devices,
            *(m.container_path for m in view.mounts),
            *(m.host_path for m in view.mounts),
            *(d.container_path for d in view.devices),
            *(d.host_path for d in view.devices),
        ]
        hidden = [i for i in ids if not any(i in t for t in texts)]
        if hidden:
            problems.append(
                f"assigned devices {hidden} appear in no injection (env, annotation, mount, device, CDI name)"
            )
    if problems:
        raise _fail(
            f"Allocate injections of {pod.namespace}/{pod.name} (devices {ids}) wrong:\n  "
            + "\n  ".join(problems)
            + "\ninjected into container "
            + pod.container
            + ":\n"
            + describe_view(view),
            node,
            [pod],
        )


def _entries(node: NodeHandle, pod: PodHandle) -> dict[tuple[str, str], tuple[list[str], bytes]]:
    cp = node.checkpoint()
    if cp is None:
        return {}
    uid = pod.uid
    return {(e.container_name, e.resource_name): (e.all_device_ids, e.alloc_resp) for e in cp.entries_for(uid)}


def _same_response(a: bytes, b: bytes) -> bool:
    """The same Allocate response, as the kubelet sees it: a real kubelet re-marshals the responses it restored from
    its checkpoint when it writes the checkpoint again, and Go marshals a map (``envs``, ``annotations``) in random
    order, so equal responses need not be equal bytes."""
    if a == b:
        return True
    try:
        return decode_alloc_resp(a) == decode_alloc_resp(b)
    except DecodeError:
        return False


def assert_checkpoint_survives_kubelet_restart(
    plugin: PluginHandle, pod: PodHandle, *, timeout: float | None = None
) -> None:
    """A running pod's checkpointed assignment is the same after a kubelet restart, and still used.

    Before: the checkpoint holds the pod's devices (matching pod-resources). Restart the kubelet.
    After: the same entries (device IDs and an equal Allocate response), the pod still Running with the same
    restart count, pod-resources still listing the same devices, and the plugin registered again
    (within ``--devplug-reregistration-timeout``).
    """
    node = plugin.node
    pod.wait_running(timeout=timeout)
    before = _entries(node, pod)
    assigned = pod.allocated_devices
    key = (pod.container, plugin.resource_name)
    if key not in before or before[key][0] != assigned:
        raise _fail(
            f"before the restart the checkpoint should hold pod {pod.name}'s {plugin.resource_name} "
            f"devices {assigned}; "
            f"it holds { ({k: v[0] for k, v in before.items()}) }",
            node,
            [pod],
        )
    restarts = pod.restart_count
    capacity = node.capacity(plugin.resource_name)
    node.restart_kubelet()
    t = node.reregistration_timeout if timeout is None else timeout
    try:
        wait_for(
            lambda: node.counts(plugin.resource_name)[1] or 0,
            lambda a: a > 0,
            timeout=t,
            what="re-registration",
            give_up=plugin.crashed,
        )
    except WaitTimeout:
        pass  # reported below together with the checkpoint comparison
    after = _entries(node, pod)
    problems = []
    now = after.get(key, (None, b""))
    if now[0] != before[key][0] or not _same_response(now[1], before[key][1]):
        what = "device IDs" if now[0] != before[key][0] else "Allocate response (the kubelet allocated again)"
        problems.append(
            f"checkpoint entry {key}: its {what} changed: before {before[key][0]} {before[key][1]!r}, "
            f"after {now[0]} {now[1]!r}"
        )
    if pod.phase != "Running":
        problems.append(f"pod phase {pod.phase} ({pod.reason}: {pod.message}) after the restart")
    elif pod.restart_count != restarts:
        problems.append(f"container restarted ({restarts} -> {pod.restart_count}) across the kubelet restart")
    if pod.allocated_devices != assigned:
        problems.append(f"pod-resources: before {assigned}, after {pod.allocated_devices}")
    cap_after, _ = node.counts(plugin.resource_name)
    if cap_after != capacity:
        problems.append(f"capacity {capacity} before, {cap_after} after: the plugin did not register again")
    if problems:
        raise _fail("assignment did not survive the kubelet restart:\n  " + "\n  ".join(problems), node, [pod])


def _reregistration_fix(path: str | None) -> str:
    if path == "plugins_registry":
        return (
            ". The plugin registered through the kubelet's plugin watcher, which registers it again when it starts: "
            "its socket in plugins_registry/ must stay and answer GetInfo and the DevicePlugin service"
        )
    return (
        ". A plugin must watch its socket (deleted by the kubelet on start) or kubelet.sock (re-created) and register "
        "again"
    )


def assert_reregisters_after_kubelet_restart(
    plugin: PluginHandle, *, count: int | None = None, timeout: float | None = None
) -> None:
    """After a kubelet restart the plugin, without being restarted, registers again by itself.

    The kubelet deletes every socket in the plugin directory and comes back with the resource at
    0/0 until the plugin registers again; a plugin must notice and re-register. Waits up to
    ``--devplug-reregistration-timeout`` (not ``--devplug-timeout``): the kubelet's own dial of the
    plugin's socket may take 10 s, and upstream-style plugins wait 10 s before registering again.
    """
    node, res = plugin.node, plugin.resource_name
    want = node.allocatable(res) if count is None else count
    if not plugin.running:
        raise _fail(f"the plugin for {res} is not running before the kubelet restart", node)
    node.restart_kubelet()
    try:
        node.wait_counts(
            res,
            capacity=want,
            allocatable=want,
            timeout=node.reregistration_timeout if timeout is None else timeout,
            give_up=plugin.crashed,
        )
    except WaitTimeout as exc:
        raise _fail(
            f"expected {res} to come back to {want}/{want} (capacity/allocatable) after the kubelet restarted; "
            f"saw {exc.last}"
            + (f"; {exc.reason}" if exc.reason else "")
            + _reregistration_fix(registration_path(node, res))
            + _kubelet_lines(node, res, "egist"),
            node,
        ) from None
    if not plugin.running:
        raise _fail(f"the plugin for {res} exited around the kubelet restart", node)
