"""Example mock PCI/NIC node files (``--devplug-pci-node NAME`` takes their names): ``sriov-iavf`` (an E810 PF with 4
VFs on iavf, netdevice mode), ``sriov-vfio`` (the same VFs on vfio-pci), ``sriov-mlx5-rdma`` (a ConnectX-6 Dx PF with
4 VFs on mlx5_core, each with its RDMA device), ``rdma-connectx`` (a ConnectX-6 Dx PF with its RDMA device).
The format: :mod:`pytest_devplug.pcinodes.spec`."""

from __future__ import annotations

from pathlib import Path

__all__ = ["EXAMPLES", "example"]

_DIR = Path(__file__).resolve().parent
EXAMPLES = tuple(sorted(p.stem for p in _DIR.glob("*.yaml")))


def example(name: str) -> Path:
    """The shipped node file ``name`` (``KeyError`` naming the examples when there is none)."""
    path = _DIR / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(f"no example PCI node {name!r}; the examples: {', '.join(EXAMPLES)}")
    return path
