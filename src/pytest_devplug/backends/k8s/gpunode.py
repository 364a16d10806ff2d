"""A mock GPU node on a node that is a container (kind): what the embedded kubelet binds into a plugin's namespace
(``sim/gpunode.py``), made as files on the node, so the node's container runtime sees them too.

A GPU node has ``/dev/nvidia<minor>`` per GPU and the control devices, the driver's libraries and tools under
its driver root (the GPU operator's ``/run/nvidia/driver``; NVIDIA's plugin with a CDI strategy locates
``libcuda.so.<driver version>`` there before it serves), and the container toolkit's hook binary that CDI specs
name (``/usr/bin/nvidia-ctk``: containerd runs the spec's hooks, so it must exist; the stub does nothing, the
mock has no libraries to link). Device nodes are character devices with ``/dev/null``'s numbers (NVIDIA's
locator skips anything else; a container given one reads nothing). They are made in the node container's own
``/dev`` (a tmpfs of that container) and under the driver root: the machine's ``/dev`` is never touched, which
is why only a provider whose nodes are containers gets a mock GPU node.

Everything is made only where absent, and what was made is removed again by :func:`remove_script`.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence

from ...nvml import MOCK_DRIVER_VERSION
from ...nvml.driverroot import DRIVER_BINS, DRIVER_LIBS, DRIVER_ROOT, LIB_DIR, gpu_device_nodes

__all__ = ["HOOK_PATH", "make_script", "remove_script"]

#: NVIDIA's CDI hook (``--nvidia-cdi-hook-path`` default): the container toolkit installs it on GPU nodes.
HOOK_PATH = "/usr/bin/nvidia-ctk"
#: /dev/null's numbers: a character device that reads as empty and swallows writes.
_NULL = "c 1 3"


def make_script(minors: Iterable[int], nvml_library: str) -> str:
    """A shell script (run as root on the node) that makes what is missing of a GPU node with GPUs of ``minors``
    and prints each path it made, one a line; the driver root's ``libnvidia-ml.so`` links to ``nvml_library``
    (the mock library already on the node)."""
    nodes = gpu_device_nodes(minors)
    lines = [
        "set -eu",
        f'node() {{ [ -e "$1" ] && return 0; mkdir -p "$(dirname "$1")"; mknod -m 0666 "$1" {_NULL}; echo "$1"; }}',
    ]
    lines += [f"node {shlex.quote(n)}" for n in nodes]
    # A driver root that exists (a real one, or another run's) is left as it is.
    root, libs = shlex.quote(DRIVER_ROOT), shlex.quote(f"{DRIVER_ROOT}/{LIB_DIR}")
    lines += [f"if [ ! -e {root} ]; then", f"mkdir -p {libs} {root}/usr/bin"]
    lines += [f"node {shlex.quote(DRIVER_ROOT + n)} >/dev/null" for n in nodes]
    for lib in DRIVER_LIBS:
        versioned = f"{lib}.{MOCK_DRIVER_VERSION}"
        if lib == "libnvidia-ml.so":
            lines.append(f"ln -s {shlex.quote(nvml_library)} {libs}/{versioned}")
        else:
            lines.append(f": > {libs}/{versioned}")
        lines.append(f"ln -s {versioned} {libs}/{lib}.1")
    for tool in DRIVER_BINS:
        lines.append(f": > {root}/usr/bin/{tool}; chmod 0755 {root}/usr/bin/{tool}")
    lines += [f"echo {root}", "fi"]
    hook = shlex.quote(HOOK_PATH)
    lines.append(f"[ -e {hook} ] || {{ printf '#!/bin/sh\\nexit 0\\n' > {hook}; chmod 0755 {hook}; echo {hook}; }}")
    return "\n".join(lines) + "\n"


def remove_script(made: Sequence[str]) -> str:
    """A shell script that removes what :func:`make_script` reported it made (the driver root as a whole)."""
    if not made:
        return "true"
    return "rm -rf -- " + " ".join(shlex.quote(p) for p in made)
