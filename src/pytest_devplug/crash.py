"""Why a plugin died or a workload cannot start, read from its log or its pod: the cause, wherever it is.

A Go plugin that panics prints ``panic: ...`` first and then a goroutine dump of a hundred lines; klog's
``Fatal`` writes an ``F`` line and a stack; a Python plugin ends with a traceback whose last line is the
exception; the dynamic loader ends a program that calls a function no loaded library has (``symbol lookup
error: ... undefined symbol: X``, exit 127) or that lacks a library (``error while loading shared libraries``),
with one line among the program's own. The last lines of such a log hide the cause, so messages quote the fatal
lines found here before the tail. A workload pod whose image cannot be pulled never starts, however long a wait.
"""

from __future__ import annotations

import re

__all__ = ["fatal_lines", "last_error_line", "start_failure"]

_GO_FATAL = re.compile(r"^(panic: |fatal error: )")
_KLOG_FATAL = re.compile(r"^F\d{4} \d{2}:\d{2}:\d{2}\.\d+ ")
_STRUCTURED_FATAL = re.compile(r'level=(fatal|panic)\b|"level":\s*"(fatal|panic)"', re.I)
#: glibc's ld.so: ``<program>: symbol lookup error: <object>: undefined symbol: <name>`` (a lazily bound call into
#: a library that lacks it, e.g. a mock NVML without a function the plugin calls) and a library not found at start.
_LOADER_FATAL = re.compile(r": (symbol lookup error|error while loading shared libraries): ")
_TRACEBACK = "Traceback (most recent call last):"
#: How many fatal lines a message quotes (a crash loop repeats the same one).
MAX_FATAL = 3


def fatal_lines(log: str) -> list[str]:
    """The lines of ``log`` that say why the process died, first seen first, repeats dropped: Go's ``panic:``
    and ``fatal error:``, klog ``F`` lines, ``level=fatal`` (logrus, zap), a Python traceback's exception, the
    dynamic loader's ``symbol lookup error`` (naming the missing symbol) and
    ``error while loading shared libraries``."""
    found: list[str] = []
    lines = log.splitlines()
    in_traceback = False
    for line in lines:
        text = line.rstrip()
        if text.startswith(_TRACEBACK):
            in_traceback = True
            continue
        if in_traceback:
            if text and not text[0].isspace():
                in_traceback = False
                if not text.startswith("During handling") and not text.startswith("The above exception"):
                    found.append(text)
            continue
        if (
            _GO_FATAL.match(text)
            or _KLOG_FATAL.match(text)
            or _STRUCTURED_FATAL.search(text)
            or _LOADER_FATAL.search(text)
        ):
            found.append(text)
    unique = list(dict.fromkeys(found))
    return unique[-MAX_FATAL:]


_ERROR = re.compile(r'^E\d{4} \d{2}:\d{2}:\d{2}\.\d+ |level=error\b|"level":\s*"error"|^ERROR[: ]', re.I)


def last_error_line(log: str) -> str | None:
    """The last error-level line (klog ``E``, ``level=error``, ``ERROR``): the cause of a process that logged
    an error and exited (``klog.Errorf``; ``os.Exit(1)``) without a fatal line."""
    errors = [ln.rstrip() for ln in log.splitlines() if _ERROR.search(ln)]
    return errors[-1] if errors else None


#: The kubelet's waiting reasons for a container whose image cannot be pulled.
_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


def start_failure(pod: dict[str, object]) -> str | None:
    """Why ``pod`` (a Pod object) cannot start, or ``None``: an image it cannot pull (the container, the image,
    the node, the kubelet's reason and message: on a registry-less cluster waiting never helps), or a
    container the runtime refused to create (``CreateContainerError``: e.g. an unresolvable CDI device)."""
    status = pod.get("status")
    spec = pod.get("spec")
    if not isinstance(status, dict) or not isinstance(spec, dict):
        return None
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in _PULL_REASONS:
            node = spec.get("nodeName") or "?"
            return (
                f"container {cs.get('name')!r} cannot pull its image {cs.get('image')!r} on node {node}: {reason}: "
                f"{waiting.get('message') or 'no message'} (pick an image the node has or can pull: "
                "--devplug-workload-image)"
            )
        if reason == "CreateContainerError":
            return f"the runtime refused to create container {cs.get('name')!r}: {waiting.get('message') or reason}"
    return None
