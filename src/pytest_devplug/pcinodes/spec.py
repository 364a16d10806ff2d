"""A mock PCI/NIC node for network device plugins (SR-IOV, RDMA): declared in a YAML file, shown to the plugin in
its own namespaces.

What these plugins read, the kernel's way, is generated under the node's directory and bind-mounted for the plugin
only: a sysfs tree (``/sys/devices/pci<domain>:<bus>/<address>`` with ``vendor``, ``device``, ``class``,
``modalias``, ``numa_node``, ``driver``/``iommu_group``/``physfn``/``virtfn<n>`` as the relative links the kernel
makes, ``sriov_totalvfs``/``sriov_numvfs``, ``net/<ifname>``, ``infiniband/<dev>``; ``/sys/bus/pci/devices``,
``/sys/bus/pci/drivers``, ``/sys/kernel/iommu_groups``, ``/sys/class/net``, ``/sys/class/infiniband*``), a
``pci.ids`` naming the declared devices, and the device nodes functions hand out (``/dev/vfio/<group>`` and
``/dev/vfio/vfio`` for ``vfio-pci``; ``/dev/infiniband/uverbs<n>``, ``umad<n>``, ``issm<n>``, ``rdma_cm`` for RDMA
devices). The plugin's network namespace gets a tap link per declared netdev with its MAC (a kernel without SR-IOV
or dummy links still has tap), so netlink answers for them as on a real node.

The file::

    functions:
      - address: "0000:3b:00.0"      # domain:bus:device.function
        vendor: "8086"               # 4 hex digits
        device: "1592"
        class: "020000"              # class, subclass, prog-if (Ethernet controller)
        driver: ice                  # optional: the bound driver
        numa_node: 0                 # optional (default -1: none)
        iommu_group: 30              # optional
        netdev: ens1f0               # optional, with mac
        mac: "3c:fd:fe:a0:00:00"
        rdma: mlx5_0                 # optional: an RDMA device of the function
        names: {vendor: Intel Corporation, device: Ethernet Controller E810-C}   # optional, for pci.ids
      - address: "0000:3b:01.0"
        physfn: "0000:3b:00.0"       # a VF of that PF (the PF's sriov_numvfs/totalvfs count its VFs)
        ...
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from ..errors import PciNodeError

__all__ = [
    "DEVICE_INFO_DIR",
    "PciFunction",
    "PciNode",
    "load_pci_node",
    "parse_pci_node",
    "PCI_IDS_PATH",
    "VFIO_DRIVER",
]

#: Where pcidb (ghw) and pciutils look first for the PCI ID database.
PCI_IDS_PATH = "/usr/share/hwdata/pci.ids"
#: Where network device plugins leave a device-info file per allocated device (the Network Plumbing WG's device
#: info spec), read by CNI plugins: the node's own directory, never the host's.
DEVICE_INFO_DIR = "/var/run/k8s.cni.cncf.io"
VFIO_DRIVER = "vfio-pci"
_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_HEX4 = re.compile(r"[0-9a-f]{4}")
_CLASS = re.compile(r"[0-9a-f]{6}")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
#: A Linux interface name: at most 15 bytes, no '/', ':' or whitespace.
_IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_KEYS = frozenset(
    {
        "address",
        "vendor",
        "device",
        "class",
        "driver",
        "numa_node",
        "iommu_group",
        "netdev",
        "mac",
        "rdma",
        "physfn",
        "names",
    }
)


@dataclass(frozen=True)
class PciFunction:
    """One PCI function of the node."""

    address: str
    vendor: str
    device: str
    pci_class: str
    driver: str | None = None
    numa_node: int = -1
    iommu_group: int | None = None
    netdev: str | None = None
    mac: str | None = None
    rdma: str | None = None
    physfn: str | None = None
    vendor_name: str = ""
    device_name: str = ""

    @property
    def root(self) -> str:
        """The host bridge directory under ``/sys/devices`` (``pci0000:3b``)."""
        return f"pci{self.address[:7]}"


@dataclass(frozen=True)
class PciNode:
    """The functions of a node, as declared, and where its file came from."""

    functions: tuple[PciFunction, ...]
    source: str = ""
    #: PF address -> its VFs' addresses, in declaration order.
    vfs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def netdevs(self) -> dict[str, str]:
        """Interface name -> MAC, for the plugin's network namespace."""
        return {f.netdev: f.mac or "" for f in self.functions if f.netdev}

    @property
    def rdma_devices(self) -> list[str]:
        return [f.rdma for f in self.functions if f.rdma]

    def device_nodes(self) -> list[str]:
        """The device nodes the node has for its functions: VFIO groups (and the container node) for functions
        bound to vfio-pci, the verbs/MAD/SM nodes of each RDMA device and ``rdma_cm``."""
        nodes: list[str] = []
        vfio = sorted({f.iommu_group for f in self.functions if f.driver == VFIO_DRIVER and f.iommu_group is not None})
        if vfio:
            nodes += ["/dev/vfio/vfio", *(f"/dev/vfio/{g}" for g in vfio)]
        for n, _ in enumerate(self.rdma_devices):
            nodes += [f"/dev/infiniband/uverbs{n}", f"/dev/infiniband/umad{n}", f"/dev/infiniband/issm{n}"]
        if self.rdma_devices:
            nodes.append("/dev/infiniband/rdma_cm")
        return nodes

    def write_tree(self, root: Path) -> tuple[Path, Path]:
        """Write the sysfs tree under ``root/sys`` and the PCI ID database at ``root/pci.ids``; returns both."""
        sys_dir = root / "sys"
        for f in self.functions:
            _write_function(sys_dir, f, self.vfs.get(f.address, ()))
        for n, name in enumerate(self.rdma_devices):
            owner = next(f for f in self.functions if f.rdma == name)
            base = f"../../devices/{owner.root}/{owner.address}"
            _link(sys_dir / "class" / "infiniband" / name, f"{base}/infiniband/{name}")
            for cls, dev in (
                ("infiniband_verbs", f"uverbs{n}"),
                ("infiniband_mad", f"umad{n}"),
                ("infiniband_mad", f"issm{n}"),
            ):
                device_dir = sys_dir / "devices" / owner.root / owner.address / cls / dev
                _file(device_dir / "ibdev", name)
                _file(device_dir / "dev", "231:0")
                _link(sys_dir / "class" / cls / dev, f"{base}/{cls}/{dev}")
        ids = root / "pci.ids"
        ids.write_text(_pci_ids(self.functions))
        return sys_dir, ids


def _file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def _write_function(sys_dir: Path, f: PciFunction, vfs: Sequence[str]) -> None:
    dev = sys_dir / "devices" / f.root / f.address
    cls, sub, prog = f.pci_class[:2], f.pci_class[2:4], f.pci_class[4:]
    modalias = (
        f"pci:v{int(f.vendor, 16):08X}d{int(f.device, 16):08X}sv{int(f.vendor, 16):08X}sd00000000"
        f"bc{cls.upper()}sc{sub.upper()}i{prog.upper()}"
    )  # the kernel's pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X
    for name, text in (
        ("vendor", f"0x{f.vendor}"),
        ("device", f"0x{f.device}"),
        ("class", f"0x{f.pci_class}"),
        ("subsystem_vendor", f"0x{f.vendor}"),
        ("subsystem_device", "0x0000"),
        ("revision", "0x02"),
        ("numa_node", str(f.numa_node)),
        ("modalias", modalias),
    ):
        _file(dev / name, text)
    _link(sys_dir / "bus" / "pci" / "devices" / f.address, f"../../../devices/{f.root}/{f.address}")
    if f.driver:
        _link(dev / "driver", f"../../../bus/pci/drivers/{f.driver}")
        _link(sys_dir / "bus" / "pci" / "drivers" / f.driver / f.address, f"../../../../devices/{f.root}/{f.address}")
    if f.iommu_group is not None:
        _link(dev / "iommu_group", f"../../../kernel/iommu_groups/{f.iommu_group}")
        _link(
            sys_dir / "kernel" / "iommu_groups" / str(f.iommu_group) / "devices" / f.address,
            f"../../../../devices/{f.root}/{f.address}",
        )
    if f.physfn:
        _link(dev / "physfn", f"../{f.physfn}")
    if vfs:
        _file(dev / "sriov_totalvfs", str(len(vfs)))
        _file(dev / "sriov_numvfs", str(len(vfs)))
        for n, vf in enumerate(vfs):
            _link(dev / f"virtfn{n}", f"../{vf}")
    if f.netdev:
        net = dev / "net" / f.netdev
        _file(net / "address", f.mac or "00:00:00:00:00:00")
        _file(net / "operstate", "up")
        _file(net / "mtu", "1500")
        _file(net / "type", "1")
        _link(sys_dir / "class" / "net" / f.netdev, f"../../devices/{f.root}/{f.address}/net/{f.netdev}")
    if f.rdma:
        (dev / "infiniband" / f.rdma).mkdir(parents=True, exist_ok=True)


def _pci_ids(functions: Sequence[PciFunction]) -> str:
    """The declared vendors and devices in pci.ids's format (a tab before a device line), and the classes."""
    vendors: dict[str, dict[str, str]] = {}
    names: dict[str, str] = {}
    for f in functions:
        names.setdefault(f.vendor, f.vendor_name or f"Vendor {f.vendor}")
        vendors.setdefault(f.vendor, {}).setdefault(f.device, f.device_name or f"Device {f.device}")
    lines = ["# pci.ids of a pytest-devplug mock PCI node: the declared devices only"]
    for vendor in sorted(vendors):
        lines.append(f"{vendor}  {names[vendor]}")
        lines += [f"\t{device}  {name}" for device, name in sorted(vendors[vendor].items())]
    lines += [
        "C 02  Network controller",
        "\t00  Ethernet controller",
        "\t07  Infiniband controller",
        "C 12  Processing accelerators",
        "\t00  Processing accelerators",
    ]
    return "\n".join(lines) + "\n"


def _text(
    raw: Mapping[str, Any], key: str, pattern: re.Pattern[str], where: str, what: str, *, required: bool = True
) -> str | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise PciNodeError(f"{where}: {key} is missing ({what})")
        return None
    text = str(value).strip().lower() if pattern in (_ADDRESS, _HEX4, _CLASS, _MAC) else str(value).strip()
    if not pattern.fullmatch(text):
        raise PciNodeError(f"{where}: {key} {value!r} is not {what}")
    return text


def _number(raw: Mapping[str, Any], key: str, where: str, default: int | None, low: int) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PciNodeError(f"{where}: {key} {value!r} is not a whole number >= {low}")
    return value


def _numa(raw: Mapping[str, Any], where: str) -> int:
    numa = _number(raw, "numa_node", where, -1, -1)
    return -1 if numa is None else numa


def parse_pci_node(data: Any, source: str) -> PciNode:
    """The node of a parsed file (``source`` names it in errors)."""
    if not isinstance(data, dict) or not isinstance(data.get("functions"), list) or not data["functions"]:
        raise PciNodeError(f"{source}: want a mapping with a non-empty list 'functions'")
    unknown = sorted(set(data) - {"functions"})
    if unknown:
        raise PciNodeError(f"{source}: unknown key(s) {', '.join(unknown)} (want only 'functions')")
    functions: list[PciFunction] = []
    for i, raw in enumerate(data["functions"]):
        where = f"{source}: functions[{i}]"
        if not isinstance(raw, dict):
            raise PciNodeError(f"{where}: want a mapping")
        extra = sorted(set(raw) - _KEYS)
        if extra:
            raise PciNodeError(f"{where}: unknown key(s) {', '.join(extra)} (known: {', '.join(sorted(_KEYS))})")
        address = _text(raw, "address", _ADDRESS, where, "a PCI address like 0000:3b:00.0")
        where = f"{source}: function {address}"
        names = raw.get("names") or {}
        if not isinstance(names, dict) or set(names) - {"vendor", "device"}:
            raise PciNodeError(f"{where}: names {names!r} is not a mapping of vendor and device")
        netdev = _text(raw, "netdev", _IFNAME, where, "an interface name (at most 15 characters)", required=False)
        mac = _text(raw, "mac", _MAC, where, "a MAC address like 3c:fd:fe:00:00:01", required=netdev is not None)
        functions.append(
            PciFunction(
                address=str(address),
                vendor=str(_text(raw, "vendor", _HEX4, where, "4 hex digits (a PCI vendor ID)")),
                device=str(_text(raw, "device", _HEX4, where, "4 hex digits (a PCI device ID)")),
                pci_class=str(_text(raw, "class", _CLASS, where, "6 hex digits (class, subclass, prog-if)")),
                driver=_text(raw, "driver", _NAME, where, "a driver name", required=False),
                numa_node=_numa(raw, where),
                iommu_group=_number(raw, "iommu_group", where, None, 0),
                netdev=netdev,
                mac=mac,
                rdma=_text(raw, "rdma", _NAME, where, "an RDMA device name like mlx5_0", required=False),
                physfn=_text(raw, "physfn", _ADDRESS, where, "the PCI address of its PF", required=False),
                vendor_name=str(names.get("vendor", "")),
                device_name=str(names.get("device", "")),
            )
        )
    return _checked(functions, source)


def _checked(functions: list[PciFunction], source: str) -> PciNode:
    by_address: dict[str, PciFunction] = {}
    for f in functions:
        if f.address in by_address:
            raise PciNodeError(f"{source}: function {f.address} is declared twice")
        by_address[f.address] = f
    for attr, what in (("netdev", "interface name"), ("mac", "MAC address"), ("rdma", "RDMA device")):
        seen: dict[str, str] = {}
        for f in functions:
            value = getattr(f, attr)
            if value and value in seen:
                raise PciNodeError(f"{source}: {what} {value} of function {f.address} is also function {seen[value]}'s")
            if value:
                seen[value] = f.address
    vfs: dict[str, list[str]] = {}
    for f in functions:
        if f.physfn is None:
            continue
        pf = by_address.get(f.physfn)
        if pf is None or pf.physfn is not None:
            raise PciNodeError(f"{source}: function {f.address}: physfn {f.physfn} is not a declared PF")
        vfs.setdefault(f.physfn, []).append(f.address)
    return PciNode(tuple(functions), source, {pf: tuple(v) for pf, v in vfs.items()})


def load_pci_node(path: str | Path) -> PciNode:
    """Read and check a PCI node file; :class:`PciNodeError` names the file and the problem."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise PciNodeError(f"PCI node file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise PciNodeError(f"PCI node file {path}: not YAML: {exc}") from None
    return parse_pci_node(data, str(path))
