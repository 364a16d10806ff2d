"""A node reboot is one to the node's processes: a new kernel boot ID and an uptime counted from the reboot, for that
node alone (drivers such as NVIDIA's DRA driver tell a reboot from a restart of their own by the boot ID)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from pytest_devplug.procs.process import namespace_problem
from pytest_devplug.sim.embeddedplane import EmbeddedPlane
from pytest_devplug.sim.kubelet import SimNode

from ..support import in_ci, wait_until

#: Prints the boot ID and the uptime it sees, once, then waits to be stopped.
REPORTER = [
    sys.executable,
    "-S",
    "-c",
    "import time; print(open('/proc/sys/kernel/random/boot_id').read().strip(), "
    "open('/proc/uptime').read().split()[0], flush=True); time.sleep(600)",
]


@pytest.fixture
def cluster() -> Iterator[EmbeddedPlane]:
    problem = namespace_problem()
    if problem is not None:
        reason = f"no private namespace here, so the node's processes see the host's boot: {problem}"
        if in_ci():
            pytest.fail(reason + " (CI=true: CI runs as root, where it must work)", pytrace=False)
        pytest.skip(reason)
    with EmbeddedPlane() as c:
        yield c


def _seen(node: SimNode, name: str, runs: int) -> tuple[str, float]:
    """The boot ID and uptime the ``runs``-th start of plugin ``name`` printed."""
    log = node.node_dir / f"{name}.log"

    def lines() -> list[str]:
        return [x for x in log.read_text().splitlines() if not x.startswith("---")] if log.exists() else []

    wait_until(f"{name} reporting its boot (start {runs})", lines, lambda x: len(x) >= runs, timeout=20)
    boot_id, uptime = lines()[runs - 1].split()
    return boot_id, float(uptime)


def test_a_reboot_renews_the_boot_id_and_uptime_of_that_node_only(cluster: EmbeddedPlane) -> None:
    node, other = cluster.add_node("node-1"), cluster.add_node("node-2")
    host_boot_id = open("/proc/sys/kernel/random/boot_id").read().strip()
    first = node.start_plugin(REPORTER, name="reporter")
    other.start_plugin(REPORTER, name="reporter")
    before, _ = _seen(node, "reporter", 1)
    beside, _ = _seen(other, "reporter", 1)
    assert before == node.boot.boot_id and before != host_boot_id and beside != before, (before, beside)

    how = node.reboot()
    assert how is None, how
    first.start()  # its DaemonSet's pod, back after the reboot
    after, uptime = _seen(node, "reporter", 2)
    assert after == node.boot.boot_id and after not in (before, host_boot_id), (before, after)
    assert uptime < 15, f"the node's uptime after its reboot reads {uptime} s"
    other.plugin("reporter").restart()
    still, _ = _seen(other, "reporter", 2)
    assert still == beside, f"node-2's boot ID changed from {beside} to {still} when node-1 rebooted"
