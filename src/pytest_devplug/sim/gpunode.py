"""What makes an embedded node look like a GPU node to a plugin in its private mount namespace.

A GPU node has ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``, ``/dev/nvidia-modeset`` and a
``/dev/nvidia<minor>`` per GPU, and the driver's files: NVIDIA's plugin with a CDI strategy locates
``libcuda.so.<driver version>`` and the driver's tools under its driver root before it serves, and with
``--pass-device-specs`` injects only the device nodes it finds. Stub files suffice (nothing opens them on
the mock), except that device nodes must be character devices (NVIDIA's locator skips anything else): each
is ``/dev/null`` bind-mounted at the device's path. Everything is bind-mounted into the plugin's namespace
only — the host's ``/dev`` is never touched: the device nodes at ``/dev`` and, with the libraries, under the
driver root :data:`DRIVER_ROOT` (the GPU operator's; a plugin's ``--driver-root``) and again at
:data:`CONTAINER_DRIVER_ROOT`, where NVIDIA's Helm charts mount the host's driver root into a driver's container.
NVIDIA's DRA driver also copies ``nvidia-cdi-hook`` out of its image (:data:`CDI_HOOK`) and names it in its CDI
specs' hooks: a stub that accepts the hooks' subcommands stands in (the embedded runtime records hooks; a
container here has no root filesystem for them to change). The driver root's ``nvidia-smi`` runs
:mod:`pytest_devplug.nvml.smi`, so a time-slice a driver sets lands in the mock state.

The GPUs' PCI functions are shown too, as sysfs shows them (``pcinodes/spec.py``'s tree): NVIDIA's plugins read
``/sys/bus/pci/devices/<bus ID>`` for the bus IDs NVML gives (its ``numa_node``; the link's target, whose
``/sys/devices/pci<domain>:<bus>`` names the GPU's PCIe root). The mock's bus IDs lie on a PCI domain of their own
(:data:`MOCK_PCI_DOMAIN`), so they name none of the host's devices, and the plugin's ``/sys/bus/pci/devices`` holds
the mock GPUs only.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..nvml import smi
from ..nvml.driverroot import CONTAINER_DRIVER_ROOT, DRIVER_BINS, DRIVER_LIBS, DRIVER_ROOT, LIB_DIR
from ..pcinodes.spec import PciFunction, PciNode

__all__ = [
    "CDI_HOOK",
    "CDI_HOOK_STUB",
    "GPU_PCI_CLASS",
    "GPU_PCI_DEVICE_IDS",
    "MOCK_PCI_DOMAIN",
    "NVCAPS_DIR",
    "NVCAPS_PROC_DIR",
    "NVIDIA_PCI_VENDOR",
    "PCI_DEVICES_DIR",
    "PROC_DEVICES",
    "gpu_pci_address",
    "gpu_pci_functions",
    "mig_cap_device_nodes",
    "mig_minors",
    "node_file_binds",
]

#: Where NVIDIA's images keep the container toolkit's hook program.
CDI_HOOK = "/usr/bin/nvidia-cdi-hook"
#: The stub at :data:`CDI_HOOK` (also in the kind image of NVIDIA's DRA driver, ``peers/nvidia-dra``).
CDI_HOOK_STUB = Path(__file__).with_name("nvidia-cdi-hook.sh")
#: The driver's ``nvidia-smi``: :mod:`pytest_devplug.nvml.smi` (settings a driver makes land in the mock state).
_SMI_STUB = """#!/bin/sh
exec '{python}' -S '{smi}' "$@"
"""
#: What every stub device node is: a character device that reads as empty and swallows writes.
_CHAR_DEVICE = Path("/dev/null")


#: Where the driver says which ``/dev/nvidia-caps/nvidia-cap<N>`` grants access to a MIG device's GPU and compute
#: instance (its ``mig-minors``): NVIDIA's plugin reads it to inject a MIG device's nodes, and fails without it.
NVCAPS_DIR = "/proc/driver/nvidia-caps"
#: The same minors as NVIDIA's DRA driver reads them: a file per GPU and compute instance
#: (``gpu<minor>/mig/gi<G>/access``, ``.../ci<C>/access``: ``DeviceFileMinor: <n>``), and the device number's major
#: from ``/proc/devices`` (``nvidia-caps``), which a node without NVIDIA's kernel modules lacks.
NVCAPS_PROC_DIR = "/proc/driver/nvidia/capabilities"
PROC_DEVICES = "/proc/devices"
#: The major the driver registers for ``nvidia-caps`` on a node (dynamic; this one is free on common kernels).
NVCAPS_MAJOR = 511
_GIS, _CIS = 15, 8  # GPU instance IDs 0..14 per GPU, compute instance IDs 0..7 per GPU instance


#: The PCI domain of the mock GPUs' bus IDs (``mock_nvml.c``'s ``MOCK_PCI_DOMAIN``): not the host's, whose devices
#: sit on domain 0 (a few more on large servers), so a mock GPU's sysfs entry never stands in for a host device's.
MOCK_PCI_DOMAIN = 0x10DE
NVIDIA_PCI_VENDOR = "10de"
#: The PCI device ID NVML gives each mock GPU model (``mock_nvml.c``'s ``gpu_models``; a test holds them equal).
GPU_PCI_DEVICE_IDS = {
    "a100-40gb": "20b0",
    "a100-80gb": "20b2",
    "h100-80gb": "2330",
    "h200-141gb": "2335",
    "b200": "2901",
}
_DEFAULT_GPU_MODEL = "a100-40gb"  # the mock's, for a state GPU without "model"
#: A data-center GPU's PCI class: display controller, 3D controller.
GPU_PCI_CLASS = "030200"
#: The bus's device links: the plugin's are the mock GPUs' only.
PCI_DEVICES_DIR = "/sys/bus/pci/devices"
_NVIDIA_DRIVER_DIR = "/sys/bus/pci/drivers/nvidia"


def gpu_pci_address(minor: int) -> str:
    """The PCI address of the mock GPU of ``minor`` as sysfs names it: the mock NVML's ``busId``
    (``0000<domain>:<bus>:<device>.0``) lower-cased, less its leading ``0000``, as NVIDIA's plugins turn it into a
    sysfs name."""
    return f"{MOCK_PCI_DOMAIN + (minor >> 13):04x}:{(minor >> 5) & 0xFF:02x}:{minor & 0x1F:02x}.0"


def gpu_pci_functions(gpus: Iterable[Mapping[str, Any]]) -> list[PciFunction]:
    """The PCI functions of these mock-state GPUs: NVIDIA 3D controllers of their model's device ID at their minor's
    address, on their NUMA node (-1 without one, as sysfs says), bound to the ``nvidia`` driver."""
    return [_gpu_pci_function(g) for g in gpus]


def _gpu_pci_function(gpu: Mapping[str, Any]) -> PciFunction:
    return PciFunction(
        address=gpu_pci_address(int(gpu["minor"])),
        vendor=NVIDIA_PCI_VENDOR,
        pci_class=GPU_PCI_CLASS,
        driver="nvidia",
        device=GPU_PCI_DEVICE_IDS[str(gpu.get("model") or _DEFAULT_GPU_MODEL)],
        numa_node=-1 if gpu.get("numa_node") is None else int(gpu["numa_node"]),
        vendor_name="NVIDIA Corporation",
        device_name=str(gpu.get("name") or ""),
    )


def _pci_binds(root: Path, gpus: Sequence[Mapping[str, Any]]) -> list[tuple[Path, str]]:
    """The GPUs' sysfs tree, written under ``root``, and its binds: the bus's device links and the ``nvidia`` driver's
    directory in place of the host's, and each PCIe root's directory beside the host's (on a domain of its own).
    A tree per set of functions: a node redeployed with other GPUs shows no stale one, and a plugin still running
    on the node (a device plugin beside a DRA driver) keeps its own."""
    functions = tuple(gpu_pci_functions(gpus))
    sys_dir, _ = PciNode(functions).write_tree(root / hashlib.sha256(repr(functions).encode()).hexdigest()[:16])
    binds = [(sys_dir / "bus/pci/devices", PCI_DEVICES_DIR), (sys_dir / "bus/pci/drivers/nvidia", _NVIDIA_DRIVER_DIR)]
    return binds + [(d, f"/sys/devices/{d.name}") for d in sorted((sys_dir / "devices").iterdir())]


def _cap_minor(gpu: int, gi: int, ci: int | None = None) -> int:
    """The driver's numbering: config 1, monitor 2, then per GPU and GPU instance its access, then its 8 CIs'."""
    return 3 + (gpu * _GIS + gi) * (1 + _CIS) + (0 if ci is None else 1 + ci)


def mig_minors(gpu_minors: Iterable[int]) -> str:
    """``mig-minors`` as the driver writes it for GPUs of these minors."""
    lines = ["config 1", "monitor 2"]
    for g in sorted(set(gpu_minors)):
        for gi in range(_GIS):
            lines.append(f"gpu{g}/gi{gi}/access {_cap_minor(g, gi)}")
            lines += [f"gpu{g}/gi{gi}/ci{ci}/access {_cap_minor(g, gi, ci)}" for ci in range(_CIS)]
    return "\n".join(lines) + "\n"


def mig_cap_device_nodes(gpus: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ``/dev/nvidia-caps`` nodes of the MIG devices of these mock-state GPUs (GPU instance, compute instance 0)."""
    out = []
    for g in gpus:
        for m in g.get("mig_devices") or []:
            gi = int(m.get("gi", 0))
            out += [f"/dev/nvidia-caps/nvidia-cap{_cap_minor(int(g['minor']), gi, c)}" for c in (None, 0)]
    return out


def _cap_file(minor: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


def _write_mig_capabilities(root: Path, gpu_minors: Iterable[int]) -> None:
    """The ``capabilities`` tree of :data:`NVCAPS_PROC_DIR` under ``root``, for every GPU and compute instance."""
    for g in sorted(set(gpu_minors)):
        for gi in range(_GIS):
            base = root / f"gpu{g}" / "mig" / f"gi{gi}"
            base.mkdir(parents=True, exist_ok=True)
            (base / "access").write_text(_cap_file(_cap_minor(g, gi)))
            for ci in range(_CIS):
                (base / f"ci{ci}").mkdir(exist_ok=True)
                (base / f"ci{ci}" / "access").write_text(_cap_file(_cap_minor(g, gi, ci)))


def _proc_devices_with_nvidia_caps(host: str) -> str:
    """``host`` (a ``/proc/devices`` text) with ``nvidia-caps`` among its character devices, if it lacks one."""
    if " nvidia-caps\n" in host:
        return host
    head, sep, tail = host.partition("\nBlock devices:")
    return f"{head.rstrip()}\n{NVCAPS_MAJOR} nvidia-caps\n{sep}{tail}" if sep else host


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def node_file_binds(
    root: Path,
    device_nodes: Sequence[str],
    *,
    driver_version: str | None = None,
    nvml: Path | None = None,
    mig_gpus: Sequence[int] | None = None,
    pci_gpus: Sequence[Mapping[str, Any]] = (),
) -> list[tuple[Path, str]]:
    """Make stub files under ``root`` (the node's own directory) and return the ``(host file or directory,
    path in the namespace)`` binds that show them: each of ``device_nodes`` (absolute paths under ``/dev``)
    at its path and, with ``driver_version``, a stub driver root at :data:`DRIVER_ROOT` and
    :data:`CONTAINER_DRIVER_ROOT` holding the driver's libraries and tools and the same device nodes, and the
    :data:`CDI_HOOK` stub; its ``libnvidia-ml.so`` is ``nvml`` (the mock library),
    for a plugin that loads NVML from its driver root. ``mig_gpus``: the minors of MIG-enabled GPUs, whose
    capability minors are shown at :data:`NVCAPS_DIR` (``mig-minors``) and :data:`NVCAPS_PROC_DIR`, with
    ``nvidia-caps`` in :data:`PROC_DEVICES`. ``pci_gpus``: mock-state GPUs whose PCI functions are shown in sysfs
    (:func:`gpu_pci_functions`), the only devices at :data:`PCI_DEVICES_DIR`."""
    for node in device_nodes:
        if not node.startswith("/dev/") or ".." in node.split("/"):
            raise ValueError(f"device node {node!r}: want an absolute path under /dev")
    binds: list[tuple[Path, str]] = []
    if driver_version is not None:
        driver = root / "driver"
        libs = driver / LIB_DIR
        for lib in DRIVER_LIBS:
            versioned = libs / f"{lib}.{driver_version}"
            if lib == "libnvidia-ml.so" and nvml is not None:
                versioned.parent.mkdir(parents=True, exist_ok=True)
                if not versioned.is_symlink():
                    versioned.symlink_to(nvml)
            elif not versioned.is_symlink():
                _touch(versioned)
            link = libs / f"{lib}.1"
            if not link.is_symlink():
                link.symlink_to(f"{lib}.{driver_version}")
        for tool in DRIVER_BINS:
            _touch(driver / "usr" / "bin" / tool).chmod(0o755)
        (driver / "usr" / "bin" / "nvidia-smi").write_text(_SMI_STUB.format(python=sys.executable, smi=smi.__file__))
        for node in device_nodes:
            _touch(driver / node.lstrip("/"))  # mount points, under the driver root bound first
        for where in (DRIVER_ROOT, CONTAINER_DRIVER_ROOT):
            binds.append((driver, where))
            binds += [(_CHAR_DEVICE, where + node) for node in device_nodes]
        hook = root / "nvidia-cdi-hook"
        hook.write_bytes(CDI_HOOK_STUB.read_bytes())
        hook.chmod(0o755)
        binds.append((hook, CDI_HOOK))
    binds += [(_CHAR_DEVICE, node) for node in device_nodes]
    if mig_gpus is not None:
        caps = root / "nvidia-caps"
        caps.mkdir(parents=True, exist_ok=True)
        (caps / "mig-minors").write_text(mig_minors(mig_gpus))
        binds.append((caps, NVCAPS_DIR))
        _write_mig_capabilities(root / "capabilities", mig_gpus)
        binds.append((root / "capabilities", NVCAPS_PROC_DIR))
        devices = root / "proc-devices"
        devices.write_text(_proc_devices_with_nvidia_caps(Path(PROC_DEVICES).read_text()))
        binds.append((devices, PROC_DEVICES))
    if pci_gpus:
        binds += _pci_binds(root / "pci", pci_gpus)
    return binds
