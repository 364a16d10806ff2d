"""The shipped conformance suite against real device plugins nobody here wrote, run as they ship.

Kubernetes' sample device plugin (``test/images/sample-device-plugin``: two devices, no topology,
hard-coded ``/var/lib/kubelet/device-plugins``, re-registers 10 s after a kubelet restart) and
upstream's device-plugin stub (``peers/stub-plugin``: four devices on two NUMA nodes,
PreStartContainer and GetPreferredAllocation) run ``devplug conformance`` on the embedded kubelet
with their plain command lines. A correct plugin must get 0 failed and 0 errors, and every skip must
name a reason that fits what the peer lacks; a test that fails here on a correct peer is a harness bug.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..support import parse_junit, run_conformance

#: Skip reasons a plugin may give: no fault injector (mock NVML), an opt-in convention it was not run
#: with, no pre_start_required, no topology; anything else skipped is a defect of the suite (or of the peer).
NO_MOCK = re.compile(r"mock-NVML|fault injector", re.I)
NO_PRE_START = re.compile(r"pre_start_required", re.I)
NO_TOPOLOGY = re.compile(r"topology|NUMA", re.I)
#: Opt-in checks of one plugin family's conventions, off for a plugin that does not declare them.
CONVENTION_OFF = re.compile(r"convention check '[a-z-]+' .* does not declare it")
#: The several-resources checks, for a plugin that advertises one resource.
ONE_RESOURCE = re.compile(r"the plugin under test serves one resource")
#: One suite run on the embedded kubelet takes ~30 s; two kubelet restarts wait ~10 s each for the peers.
SUITE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Peer:
    name: str
    resource: str
    #: Options of `devplug conformance` that describe the plugin (not its command line).
    options: tuple[str, ...]
    #: Skip reasons this peer may get.
    allowed_skips: tuple[re.Pattern[str], ...]
    #: Tests that must pass (not skip) for this peer: what it is here to exercise.
    must_pass: tuple[str, ...]


PEERS = [
    # The sample plugin serves on a socket named after its start time (dp.<unix seconds>), so a second instance
    # beside a running one never shares its socket: it is run with the rolling-update convention on.
    Peer(
        "sample-device-plugin", "example.com/resource", ("--conventions", "rolling-update"),
        (NO_MOCK, CONVENTION_OFF, NO_PRE_START, NO_TOPOLOGY, ONE_RESOURCE),
        ("test_reregisters_after_kubelet_restart", "test_checkpoint_survives_kubelet_restart",
         "test_convention_rolling_update_without_downtime"),
    ),
    # The stub's Allocate lists the IDs it hands in and its GetPreferredAllocation packs NUMA nodes, so
    # it is run with those two conventions on.
    Peer(
        "stub-plugin", "example.com/stub", ("--pre-start-required", "--conventions", "ids-visible,numa-packing"),
        (NO_MOCK, CONVENTION_OFF, ONE_RESOURCE),
        ("test_reregisters_after_kubelet_restart", "test_checkpoint_survives_kubelet_restart",
         "test_prestart_container_called_before_start", "test_single_numa_node_policy_rejects_cross_numa_request",
         "test_convention_ids_visible_in_injections", "test_convention_numa_packing_fills_one_node_first"),
    ),
]  # fmt: skip


@pytest.mark.parametrize("control_plane", ["embedded", "real"])
@pytest.mark.parametrize("peer", PEERS, ids=[p.name for p in PEERS])
def test_conformance_suite_passes_on_peer(
    peer: Peer, control_plane: str, peer_binary: Callable[[str], Path], same_verdicts: Callable[[str, str, dict[str, str]], None], tmp_path: Path
) -> None:
    binary = peer_binary(peer.name)
    options = ["--backend", "sim", "--control-plane", control_plane, "--plugin-cmd", str(binary), "--resource-name", peer.resource]
    result = run_conformance([*options, *peer.options], [], tmp_path, timeout=SUITE_TIMEOUT_S)
    assert not result.failed, f"{peer.name}: {len(result.failed)} failed/errors:\n" + "\n".join(result.failed) + result.output
    assert result.returncode == 0, f"devplug conformance exited {result.returncode}:\n{result.output}"
    unexplained = {t: r for t, r in result.skipped.items() if not any(p.search(r) for p in peer.allowed_skips)}
    assert not unexplained, f"{peer.name}: skips without a reason that fits the peer: {unexplained}"
    missing = [t for t in peer.must_pass if t not in result.passed]
    assert not missing, f"{peer.name}: expected to pass but did not run or skipped: {missing}; skips: {result.skipped}"
    same_verdicts(peer.name, control_plane, result.verdicts())


def test_junit_reading_counts_failures_errors_and_skip_reasons(tmp_path: Path) -> None:
    """The verdict above rests on this reading: a failure, an error and a skip's reason are all seen."""
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="a" name="test_ok"/>'
        '<testcase classname="a" name="test_bad"><failure message="boom">tb</failure></testcase>'
        '<testcase classname="a" name="test_err"><error message="fixture broke">tb</error></testcase>'
        '<testcase classname="a" name="test_skip"><skipped type="pytest.skip" message="needs the mock-NVML fault controls"/></testcase>'
        "</testsuite></testsuites>"
    )  # fmt: skip
    result = parse_junit(junit)
    assert result.passed == ["test_ok"]
    assert result.failed == ["test_bad: boom", "test_err: fixture broke"]
    assert result.skipped == {"test_skip": "needs the mock-NVML fault controls"}
    assert NO_MOCK.search(result.skipped["test_skip"]) and not NO_TOPOLOGY.search(result.skipped["test_skip"])
