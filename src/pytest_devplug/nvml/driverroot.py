"""What an NVIDIA GPU node holds for its plugins: the driver root's layout and the GPUs' device nodes.

Facts of NVIDIA's driver and of how its plugins look for it, shared by the two mock GPU nodes: the embedded
kubelet's (``sim/gpunode.py``: bind mounts in the plugin's namespace) and the kind/cluster node's
(``backends/k8s/gpunode.py``: a script run on the node).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["CONTAINER_DRIVER_ROOT", "DRIVER_BINS", "DRIVER_LIBS", "DRIVER_ROOT", "LIB_DIR", "gpu_device_nodes"]

#: Where the stub driver root is on a mock GPU node (the GPU operator's driver root; a plugin's ``--driver-root``).
DRIVER_ROOT = "/run/nvidia/driver"
#: Where NVIDIA's charts mount the host's driver root in a driver's container (``DRIVER_ROOT_CTR_PATH``'s default).
CONTAINER_DRIVER_ROOT = "/driver-root"
#: Driver libraries NVIDIA's CDI generation looks for (``<name>.<driver version>``, and ``.1`` links).
DRIVER_LIBS = (
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libcudadebugger.so",
)
#: Driver tools it mounts into containers when present.
DRIVER_BINS = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
#: The libraries' directory under the driver root.
LIB_DIR = "usr/lib/x86_64-linux-gnu"
_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def gpu_device_nodes(minors: Iterable[int]) -> list[str]:
    """The device nodes of a GPU node with GPUs of these minors."""
    return [f"/dev/{n}" for n in _CONTROL_NODES] + [f"/dev/nvidia{m}" for m in sorted(set(minors))]
