"""Evidence for failure reports: plugin log, kubelet log, node status, pod events, checkpoint.

Collected at the moment of failure (before teardown changes the cluster) and attached by
``plugin.py`` as report sections, so a red test explains itself without re-running it. The cluster
lives for the session, so its kubelet log holds every earlier test too: evidence quotes only the lines
of the current test's window (see :func:`set_test_window`), told apart by their timestamps.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from datetime import datetime

from .backends.base import Backend, parse_checkpoint
from .errors import Evidence

__all__ = [
    "Evidence",
    "collect_evidence",
    "tail",
    "set_test_window",
    "current_test_lines",
    "pod_events",
    "pod_statuses",
    "safe_evidence",
    "window_kubelet_log",
]

#: Lines of a log kept in a report section: enough to see the story, short enough to read.
LOG_TAIL_LINES = 80


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    parts = text.splitlines()
    if len(parts) <= lines:
        return text
    return f"[... {len(parts) - lines} earlier lines omitted ...]\n" + "\n".join(parts[-lines:])


#: Wall-clock start of the current test's window; ``None`` outside a test (then logs are quoted whole).
_window_start: float | None = None

#: journalctl ``-o short-iso`` (kind) and klog (the embedded kubelet, local time) line headers.
_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[+-]\d{2}:?\d{2}|Z))")
_KLOG = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) ")


def set_test_window(start: float | None) -> None:
    """Quote kubelet lines logged from ``start`` (epoch seconds) on; ``plugin.py`` sets it per test to the
    start of the previous test's teardown, which redeploys the plugin this test uses."""
    global _window_start
    _window_start = start


def _stamp(line: str) -> float | None:
    if m := _ISO.match(line):
        text = m.group(1).replace("Z", "+00:00")
        try:
            return datetime.fromisoformat(text if ":" in text[-6:] else f"{text[:-2]}:{text[-2:]}").timestamp()
        except ValueError:
            return None
    if m := _KLOG.match(line):
        month, day, hh, mm, ss, us = (int(g) for g in m.groups())
        year = time.localtime().tm_year
        try:
            return datetime(year, month, day, hh, mm, ss, us).timestamp()
        except ValueError:
            return None
    return None


def current_test_lines(log: str) -> list[str]:
    """The lines of ``log`` from the current test's window (a line without a timestamp goes with the one
    before it). The whole log when no window is set or no line carries a timestamp we read."""
    lines = log.splitlines()
    if _window_start is None:
        return lines
    since = int(_window_start)  # journal stamps have whole seconds
    keep, out, stamped = False, [], False
    for ln in lines:
        ts = _stamp(ln)
        if ts is not None:
            stamped = True
            keep = ts >= since
        if keep:
            out.append(ln)
    return out if stamped else lines


def window_kubelet_log(backend: Backend, node: str) -> str:
    """The node's kubelet log cut to the current test's window (the session's log holds every earlier test)."""
    lines = current_test_lines(backend.kubelet_log(node))
    note = "" if _window_start is None else "[kubelet lines of this test only]\n"
    return note + tail("\n".join(lines))


def safe_evidence(title: str, fn: Callable[[], str]) -> Evidence:
    """``Evidence(title, fn())``, or why ``fn`` broke: evidence must never hide the real failure."""
    try:
        return Evidence(title, fn())
    except Exception as exc:  # noqa: BLE001 - deliberately broad, see above
        return Evidence(title, f"<could not collect: {type(exc).__name__}: {exc}>")


def _node_status(backend: Backend, node: str) -> str:
    obj = backend.get_node(node)
    status = obj.get("status", {})
    view = {k: status.get(k) for k in ("capacity", "allocatable", "conditions")}
    return json.dumps(view, indent=2, sort_keys=True)


def _checkpoint(backend: Backend, node: str) -> str:
    raw = backend.read_checkpoint(node)
    if raw is None:
        return "<no checkpoint file>"
    try:
        cp = parse_checkpoint(raw)
    except ValueError as exc:
        return f"<undecodable: {exc}>\n{raw[:4000]!r}"
    lines = [f"RegisteredDevices: {json.dumps({k: list(v) for k, v in cp.registered_devices.items()})}"]
    for e in cp.entries:
        ids = {k: list(v) for k, v in e.device_ids.items()}
        lines.append(f"pod {e.pod_uid} container {e.container_name} {e.resource_name}: {json.dumps(ids)}")
    if not cp.entries:
        lines.append("PodDeviceEntries: none")
    return "\n".join(lines)


def _restarts(backend: Backend, node: str) -> str:
    r = backend.plugin_restarts(node)
    times = "time" if r.count == 1 else "times"
    text = f"restarted {r.count} {times} by the kubelet since the harness started it (its container's restartCount)"
    return text + (f"\ncrash-looping: {r.crash_loop}" if r.crash_loop else "")


def pod_events(backend: Backend, pods: Iterable[tuple[str, str]]) -> str:
    """The events of each ``(name, namespace)`` pod, one a line: why the kubelet or scheduler did what it did."""
    out = []
    for name, namespace in pods:
        for ev in backend.events(namespace=namespace, involved_name=name):
            out.append(f"{namespace}/{name}: {ev.get('type')} {ev.get('reason')}: {ev.get('message')}")
    return "\n".join(out) or "<no events>"


def pod_statuses(backend: Backend, pods: Iterable[tuple[str, str]]) -> str:
    """The status of each ``(name, namespace)`` pod as JSON, one a line; a pod already gone says so."""
    out = []
    for name, namespace in pods:
        try:
            obj = backend.get_pod(name, namespace)
        except Exception as exc:  # noqa: BLE001 - a deleted pod is evidence too
            out.append(f"{namespace}/{name}: <{type(exc).__name__}: {exc}>")
            continue
        out.append(f"{namespace}/{name}: {json.dumps(obj.get('status', {}), sort_keys=True, default=str)}")
    return "\n".join(out)


def collect_evidence(backend: Backend, node: str | None, pods: Iterable[tuple[str, str]] = ()) -> list[Evidence]:
    """Everything worth reading when a device-plugin test fails on ``node`` with ``pods``."""
    pods = list(pods)
    ev: list[Evidence] = []
    if node is not None:
        ev.append(safe_evidence("node status", lambda: _node_status(backend, node)))
        ev.append(safe_evidence("plugin restarts", lambda: _restarts(backend, node)))
        ev.append(safe_evidence("plugin log", lambda: tail(backend.plugin_log(node))))
        ev.append(safe_evidence("kubelet log", lambda: window_kubelet_log(backend, node)))
        ev.append(safe_evidence("checkpoint", lambda: _checkpoint(backend, node)))
    if pods:
        ev.append(safe_evidence("pods", lambda: pod_statuses(backend, pods)))
        ev.append(safe_evidence("pod events", lambda: pod_events(backend, pods)))
    return ev
