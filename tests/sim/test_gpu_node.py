"""A mock GPU node's device nodes and stub driver root, and a node's declared device nodes, in the plugin's
private mount namespace only (never the host's /dev)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug import ClusterHandle, NodeSpec, PluginSpec
from pytest_devplug.backends.base import BackendOptions
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.nvml import MOCK_DRIVER_VERSION
from pytest_devplug.backends.mockstate import initial_state
from pytest_devplug.nvml.driverroot import DRIVER_ROOT, gpu_device_nodes
from pytest_devplug.sim.gpunode import (
    PCI_DEVICES_DIR,
    gpu_pci_address,
    mig_cap_device_nodes,
    mig_minors,
    node_file_binds,
)
from pytest_devplug.waiting import wait_for

MOCK_C = Path(__file__).resolve().parents[2] / "src" / "pytest_devplug" / "nvml" / "mock_nvml.c"


def test_the_stub_driver_version_is_the_mocks() -> None:
    assert f'#define MOCK_DRIVER_VERSION "{MOCK_DRIVER_VERSION}"' in MOCK_C.read_text()


def test_node_file_binds_layout(tmp_path: Path) -> None:
    nodes = gpu_device_nodes([1, 0])
    assert nodes == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia0",
        "/dev/nvidia1",
    ]
    binds = node_file_binds(tmp_path, nodes, driver_version="1.2.3", nvml=Path("/opt/mock/libnvidia-ml.so.1"))
    assert binds[0] == (tmp_path / "driver", DRIVER_ROOT)  # the driver root first: its device nodes go over it
    assert (Path("/dev/null"), "/dev/nvidia0") in binds and (Path("/dev/null"), f"{DRIVER_ROOT}/dev/nvidia1") in binds
    lib = tmp_path / "driver/usr/lib/x86_64-linux-gnu"
    assert (lib / "libcuda.so.1").resolve() == (lib / "libcuda.so.1.2.3").resolve() and (
        lib / "libcuda.so.1.2.3"
    ).is_file()
    assert os.readlink(lib / "libnvidia-ml.so.1.2.3") == "/opt/mock/libnvidia-ml.so.1"
    assert node_file_binds(tmp_path, nodes, driver_version="1.2.3") == node_file_binds(
        tmp_path, nodes, driver_version="1.2.3"
    )
    with pytest.raises(ValueError, match="'/etc/passwd': want an absolute path under /dev"):
        node_file_binds(tmp_path, ["/etc/passwd"])


def test_node_file_binds_show_the_gpus_pci_functions_as_sysfs_does(tmp_path: Path) -> None:
    """Each mock GPU's ``/sys/bus/pci/devices/<bus ID>`` is a relative link into ``/sys/devices/pci<domain>:<bus>``, as
    NVIDIA's DRA driver resolves it to the GPU's PCIe root, with the files its plugins read."""
    gpus = initial_state(2, 2, model="h100-80gb")["gpus"]
    binds = {dst: src for src, dst in node_file_binds(tmp_path, gpu_device_nodes([0, 1]), pci_gpus=gpus)}
    devices, root = binds[PCI_DEVICES_DIR], binds["/sys/devices/pci10de:00"]
    assert sorted(os.listdir(devices)) == ["10de:00:00.0", "10de:00:01.0"]
    for minor in (0, 1):
        address = gpu_pci_address(minor)
        # the driver's reading: the link's target, relative to /sys/bus/pci/devices, names the root under /sys/devices
        target = os.path.normpath(os.path.join("bus/pci/devices", os.readlink(devices / address)))
        assert target == f"devices/pci10de:00/{address}"
        function = root / address
        files = {name: (function / name).read_text() for name in ("vendor", "device", "class", "numa_node")}
        assert files == {"vendor": "0x10de\n", "device": "0x2330\n", "class": "0x030200\n", "numa_node": f"{minor}\n"}
        assert (function / "driver").resolve() == binds["/sys/bus/pci/drivers/nvidia"].resolve()
    binds = {dst: src for src, dst in node_file_binds(tmp_path, gpu_device_nodes([0]), pci_gpus=gpus[:1])}
    assert os.listdir(binds[PCI_DEVICES_DIR]) == ["10de:00:00.0"], "a redeployed node keeps a GPU it no longer has"
    assert not [dst for _, dst in node_file_binds(tmp_path / "plain", gpu_device_nodes([0])) if dst.startswith("/sys")]


@pytest.fixture
def backend() -> Iterator[SimBackend]:
    b = SimBackend(BackendOptions(timeout=20.0))
    b.start()
    try:
        yield b
    finally:
        b.close()


def test_the_plugin_sees_a_gpu_node_and_the_declared_nodes_the_host_does_not(backend: SimBackend) -> None:
    cluster = ClusterHandle(backend, timeout=20.0)
    node = cluster.ensure_node(NodeSpec("gpu-node", numa_nodes=1, device_nodes=("/dev/ttyWIDGET0",)))
    paths = ["/dev/ttyWIDGET0", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", f"{DRIVER_ROOT}/dev/nvidia0"]
    lib = f"{DRIVER_ROOT}/usr/lib/x86_64-linux-gnu/libcuda.so.{MOCK_DRIVER_VERSION}"
    script = f"stat -c '%F %n' {' '.join(paths)}; test -f {lib} && echo has-libcuda; echo done; sleep 60"
    plugin = cluster.deploy(
        node, PluginSpec(argv=["sh", "-c", script], mock=True, gpus=1, numa_nodes=1, standard_paths=True)
    )
    log = wait_for(
        plugin.log,
        lambda text: "\ndone\n" in text,
        timeout=20.0,
        what="the stub plugin's listing",
        give_up=plugin.crashed,
    )
    for path in paths:
        assert f"character special file {path}" in log, log
    assert "has-libcuda" in log, log
    assert not os.path.lexists("/dev/ttyWIDGET0") and not os.path.lexists(DRIVER_ROOT)
    backend.remove_plugin(node.name)


def test_mig_capabilities_are_numbered_as_the_driver_numbers_them() -> None:
    lines = mig_minors([0, 1]).splitlines()
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu0/gi1/access 12" in lines and "gpu1/gi0/access 138" in lines and len(lines) == 2 + 2 * 15 * 9
    gpus = initial_state(2, 1, ["1g.5gb"])["gpus"]
    assert mig_cap_device_nodes(gpus) == [f"/dev/nvidia-caps/nvidia-cap{n}" for n in (12, 13, 147, 148)]


def test_a_mig_node_shows_the_plugin_its_mig_capabilities(backend: SimBackend) -> None:
    cluster = ClusterHandle(backend, timeout=20.0)
    node = cluster.ensure_node(NodeSpec("mig-node", numa_nodes=1))
    script = (
        "grep 'gpu0/gi1/' /proc/driver/nvidia-caps/mig-minors; stat -c '%F %n' /dev/nvidia-caps/nvidia-cap13; "
        "head -1 /proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access; grep ' nvidia-caps$' /proc/devices; "
        "echo done; sleep 60"
    )
    spec = PluginSpec(argv=["sh", "-c", script], mock=True, gpus=1, numa_nodes=1, mig=("1g.5gb",), standard_paths=True)
    plugin = cluster.deploy(node, spec)
    log = wait_for(
        plugin.log,
        lambda text: "\ndone\n" in text,
        timeout=20.0,
        what="the stub plugin's listing",
        give_up=plugin.crashed,
    )
    assert (
        "gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n" in log
        and "character special file /dev/nvidia-caps/nvidia-cap13" in log
    ), log
    # the same minor where NVIDIA's DRA driver reads it, and the major of nvidia-caps (the host's /proc/devices
    # lacks it)
    assert "DeviceFileMinor: 13\n" in log and "511 nvidia-caps\n" in log, log
    assert " nvidia-caps\n" not in Path("/proc/devices").read_text()


def test_the_plugin_sees_the_mock_gpus_pci_functions_not_the_hosts(backend: SimBackend) -> None:
    """In the plugin's namespace ``/sys/bus/pci/devices`` lists the mock GPUs only, each linked under its PCIe root with
    NVIDIA's IDs and its NUMA node; the host's sysfs gains nothing."""
    cluster = ClusterHandle(backend, timeout=20.0)
    node = cluster.ensure_node(NodeSpec("pci-gpu-node", numa_nodes=2))
    script = (
        "cd /sys/bus/pci/devices && for d in *; do "
        'echo "$d $(readlink "$d") $(cat "$d/vendor" "$d/device" "$d/class" '
        '"$d/numa_node" | tr "\\n" " ")"; done; echo done; sleep 60'
    )
    spec = PluginSpec(argv=["sh", "-c", script], mock=True, gpus=2, numa_nodes=2, standard_paths=True)
    plugin = cluster.deploy(node, spec)
    log = wait_for(plugin.log, lambda t: "\ndone\n" in t, timeout=20.0, what="its listing", give_up=plugin.crashed)
    listed = log[: log.index("\ndone\n")].splitlines()[-2:]
    assert listed == [
        f"10de:00:0{m}.0 ../../../devices/pci10de:00/10de:00:0{m}.0 0x10de 0x20b0 0x030200 {m} " for m in (0, 1)
    ], log
    assert log.count("../../../devices/") == 2, f"host PCI devices listed beside the mock GPUs: {log}"
    assert not os.path.lexists("/sys/devices/pci10de:00")
    backend.remove_plugin(node.name)
