"""The mock PCI/NIC node: the file's rules, the sysfs tree's layout and links, and what a plugin in the node's
namespaces sees of it (the host untouched)."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug import PluginSpec
from pytest_devplug.backends.base import NodeSpec
from pytest_devplug.handles import ClusterHandle
from pytest_devplug.pcinodes import EXAMPLES, example
from pytest_devplug.pcinodes.spec import load_pci_node, parse_pci_node
from pytest_devplug.errors import PciNodeError
from pytest_devplug.waiting import wait_for

from ..support import sim_cluster

PF = {
    "address": "0000:3b:00.0",
    "vendor": "8086",
    "device": "1592",
    "class": "020000",
    "driver": "ice",
    "numa_node": 1,
    "netdev": "ens1f0",
    "mac": "3c:fd:fe:a0:00:00",
}
VF = {
    "address": "0000:3b:01.0",
    "physfn": "0000:3b:00.0",
    "vendor": "8086",
    "device": "1889",
    "class": "020000",
    "driver": "vfio-pci",
    "iommu_group": 41,
}


@pytest.mark.parametrize(
    ("functions", "message"),
    [
        ([{**PF, "address": "3b:00.0"}], "functions[0]: address '3b:00.0' is not a PCI address like 0000:3b:00.0"),
        ([{k: v for k, v in PF.items() if k != "vendor"}], "function 0000:3b:00.0: vendor is missing"),
        ([{**PF, "colour": "red"}], "functions[0]: unknown key(s) colour"),
        ([{**PF, "netdev": "ens1f0", "mac": "3c:fd:fe"}], "function 0000:3b:00.0: mac '3c:fd:fe' is not a MAC address"),
        ([{k: v for k, v in PF.items() if k != "mac"}], "function 0000:3b:00.0: mac is missing"),
        ([PF, {**VF, "physfn": "0000:3b:00.1"}], "function 0000:3b:01.0: physfn 0000:3b:00.1 is not a declared PF"),
        ([PF, PF], "function 0000:3b:00.0 is declared twice"),
        (
            [PF, {**VF, "netdev": "ens1f0", "mac": "3c:fd:fe:a0:00:01"}],
            "interface name ens1f0 of function 0000:3b:01.0 is also function 0000:3b:00.0's",
        ),
        ([{**PF, "numa_node": "one"}], "numa_node 'one' is not a whole number >= -1"),
    ],
)
def test_a_bad_node_file_names_the_function_and_the_problem(functions: list[dict[str, object]], message: str) -> None:
    with pytest.raises(PciNodeError) as info:
        parse_pci_node({"functions": functions}, "node.yaml")
    assert str(info.value).startswith("node.yaml: ") and message in str(info.value), str(info.value)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PciNodeError, match=r"PCI node file .*missing.yaml: No such file"):
        load_pci_node(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("functions: [unclosed")
    with pytest.raises(PciNodeError, match="bad.yaml: not YAML"):
        load_pci_node(tmp_path / "bad.yaml")


def test_the_examples_load(tmp_path: Path) -> None:
    assert set(EXAMPLES) == {"sriov-iavf", "sriov-vfio", "sriov-mlx5-rdma", "rdma-connectx"}
    for name in EXAMPLES:
        node = load_pci_node(example(name))
        sys_dir, _ = node.write_tree(tmp_path / name)
        for f in node.functions:
            assert (sys_dir / "bus/pci/devices" / f.address / "vendor").read_text() == f"0x{f.vendor}\n"
    rdma = load_pci_node(example("rdma-connectx"))
    sys_dir = tmp_path / "rdma-connectx" / "sys"
    assert (sys_dir / "class/infiniband_verbs/uverbs0/ibdev").read_text() == "mlx5_0\n"
    assert (sys_dir / "class/infiniband/mlx5_0").resolve() == (
        sys_dir / "bus/pci/devices/0000:af:00.0/infiniband/mlx5_0"
    ).resolve()
    assert rdma.device_nodes() == [
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/umad0",
        "/dev/infiniband/issm0",
        "/dev/infiniband/rdma_cm",
    ]
    with pytest.raises(KeyError, match="sriov-iavf"):
        example("nope")


def test_the_tree_has_the_kernels_layout_and_relative_links(tmp_path: Path) -> None:
    node = parse_pci_node({"functions": [PF, VF]}, "node.yaml")
    sys_dir, ids = node.write_tree(tmp_path)
    pf, vf = sys_dir / "bus/pci/devices/0000:3b:00.0", sys_dir / "bus/pci/devices/0000:3b:01.0"
    assert os.readlink(pf) == "../../../devices/pci0000:3b/0000:3b:00.0"  # relative, as plugins slice them
    assert (pf / "vendor").read_text() == "0x8086\n" and (pf / "class").read_text() == "0x020000\n"
    assert (pf / "numa_node").read_text() == "1\n" and (vf / "numa_node").read_text() == "-1\n"
    assert (vf / "modalias").read_text() == "pci:v00008086d00001889sv00008086sd00000000bc02sc00i00\n"
    assert (
        os.path.basename(os.readlink(pf / "driver")) == "ice"
        and (pf / "driver").resolve() == (sys_dir / "bus/pci/drivers/ice").resolve()
    )
    assert (pf / "sriov_numvfs").read_text() == (pf / "sriov_totalvfs").read_text() == "1\n"
    assert os.readlink(pf / "virtfn0") == "../0000:3b:01.0" and os.readlink(vf / "physfn") == "../0000:3b:00.0"
    assert (
        vf / "physfn" / "net" / "ens1f0" / "address"
    ).read_text() == "3c:fd:fe:a0:00:00\n"  # the PF's name via its VF
    assert os.path.basename(os.readlink(vf / "iommu_group")) == "41"
    assert (sys_dir / "kernel/iommu_groups/41/devices/0000:3b:01.0").resolve() == vf.resolve()
    assert (sys_dir / "class/net/ens1f0").resolve() == (pf / "net/ens1f0").resolve()
    assert (sys_dir / "bus/pci/drivers/vfio-pci/0000:3b:01.0").resolve() == vf.resolve()
    text = ids.read_text()
    assert "\n8086  Vendor 8086\n\t1592  Device 1592\n\t1889  Device 1889\n" in text
    assert node.device_nodes() == ["/dev/vfio/vfio", "/dev/vfio/41"]


@pytest.fixture
def cluster() -> Iterator[ClusterHandle]:
    with sim_cluster(20.0) as cluster:
        yield cluster


PROBE = textwrap.dedent(
    """
    import fcntl, os, socket, struct, sys, time
    print("pci", sorted(os.listdir("/sys/bus/pci/devices")))
    print("vendor", open("/sys/bus/pci/devices/0000:3b:01.0/vendor").read().strip())
    print("ids", "1889  Ethernet Adaptive Virtual Function" in open("/usr/share/hwdata/pci.ids").read())
    print("vfio", sorted(os.listdir("/dev/vfio")))
    links = sorted(name for _, name in socket.if_nameindex())
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    mac = fcntl.ioctl(s, 0x8927, struct.pack("256s", b"ens1f0"))[18:24].hex(":")
    print("links", links, "mac", mac, flush=True)
    time.sleep(600)
    """
)


def test_a_plugin_in_the_node_sees_the_nics_and_the_host_does_not(cluster: ClusterHandle) -> None:
    if os.geteuid() != 0:
        pytest.skip("the mock NIC node's network namespace needs root (CAP_NET_ADMIN and /dev/net/tun)")
    host_links = sorted(name for _, name in socket.if_nameindex())
    node = cluster.ensure_node(NodeSpec("nic", pci_node=str(example("sriov-vfio"))))
    plugin = cluster.deploy(node, PluginSpec(resource_name="example.com/nic", argv=[sys.executable, "-c", PROBE]))
    log = wait_for(
        plugin.log, lambda text: "\nlinks [" in text or "Traceback" in text, timeout=20, what="the probe's report"
    )
    assert "pci ['0000:3b:00.0', '0000:3b:01.0', '0000:3b:01.1', '0000:3b:01.2', '0000:3b:01.3']" in log, log
    assert "vendor 0x8086" in log and "ids True" in log, log
    assert "vfio ['41', '42', '43', '44', 'vfio']" in log, log
    assert "links ['ens1f0', 'lo'] mac 3c:fd:fe:a0:00:00" in log, log
    assert sorted(name for _, name in socket.if_nameindex()) == host_links  # the host has no such link
    assert not os.path.exists("/var/run/k8s.cni.cncf.io") or os.path.exists("/run/k8s.cni.cncf.io")
    plugin.stop()
