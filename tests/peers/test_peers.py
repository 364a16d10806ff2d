"""The shipped conformance suite against real device plugins nobody here wrote, run as they ship.

Kubernetes' sample device plugin (``test/images/sample-device-plugin``: two devices, no topology,
hard-coded ``/var/lib/kubelet/device-plugins``, re-registers 10 s after a kubelet restart) and
upstream's device-plugin stub (``peers/stub-plugin``: four devices on two NUMA nodes,
PreStartContainer and GetPreferredAllocation) run ``devplug conformance`` on the embedded kubelet
with their plain command lines. A correct plugin must get 0 failed and 0 errors, and every skip must
name a reason that fits what the peer lacks; a test that fails here on a correct peer is a harness bug.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
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
        "sample-device-plugin",
        "example.com/resource",
        ("--conventions", "rolling-update"),
        (NO_MOCK, CONVENTION_OFF, NO_PRE_START, NO_TOPOLOGY, ONE_RESOURCE),
        (
            "test_reregisters_after_kubelet_restart",
            "test_checkpoint_survives_kubelet_restart",
            "test_convention_rolling_update_without_downtime",
        ),
    ),
    # The stub's Allocate lists the IDs it hands in and its GetPreferredAllocation packs NUMA nodes, so
    # it is run with those two conventions on.
    Peer(
        "stub-plugin",
        "example.com/stub",
        ("--pre-start-required", "--conventions", "ids-visible,numa-packing"),
        (NO_MOCK, CONVENTION_OFF, ONE_RESOURCE),
        (
            "test_reregisters_after_kubelet_restart",
            "test_checkpoint_survives_kubelet_restart",
            "test_prestart_container_called_before_start",
            "test_single_numa_node_policy_rejects_cross_numa_request",
            "test_convention_ids_visible_in_injections",
            "test_convention_numa_packing_fills_one_node_first",
        ),
    ),
]


@pytest.mark.parametrize("control_plane", ["embedded", "real"])
@pytest.mark.parametrize("peer", PEERS, ids=[p.name for p in PEERS])
def test_conformance_suite_passes_on_peer(
    peer: Peer,
    control_plane: str,
    peer_binary: Callable[[str], Path],
    same_verdicts: Callable[[str, str, dict[str, str]], None],
    tmp_path: Path,
) -> None:
    binary = peer_binary(peer.name)
    options = [
        "--backend",
        "sim",
        "--control-plane",
        control_plane,
        "--plugin-cmd",
        str(binary),
        "--resource-name",
        peer.resource,
    ]
    result = run_conformance([*options, *peer.options], [], tmp_path, timeout=SUITE_TIMEOUT_S)
    assert not result.failed, (
        f"{peer.name}: {len(result.failed)} failed/errors:\n" + "\n".join(result.failed) + result.output
    )
    assert result.returncode == 0, f"devplug conformance exited {result.returncode}:\n{result.output}"
    unexplained = {t: r for t, r in result.skipped.items() if not any(p.search(r) for p in peer.allowed_skips)}
    assert not unexplained, f"{peer.name}: skips without a reason that fits the peer: {unexplained}"
    missing = [t for t in peer.must_pass if t not in result.passed]
    assert not missing, f"{peer.name}: expected to pass but did not run or skipped: {missing}; skips: {result.skipped}"
    same_verdicts(peer.name, control_plane, result.verdicts())


#: squat's generic-device-plugin on every release whose kubelet model differs in what it meets (1.37's endpoint per
#: socket; 1.34-1.36's one client per resource).
GENERIC_RELEASES = ("1.34", "1.35", "1.36", "1.37")
#: What the generic plugin may skip: it reads no mock NVML, reports no topology, asks for no PreStart, serves one
#: resource and declares no convention but the rolling update it is run with.
GENERIC_SKIPS = (NO_MOCK, CONVENTION_OFF, NO_PRE_START, NO_TOPOLOGY, ONE_RESOURCE)
GENERIC_MUST_PASS = (
    "test_abrupt_kill_then_restart_serves_again",
    "test_device_ids_stable_across_restarts",
    "test_reregisters_after_kubelet_restart",
    "test_checkpoint_survives_kubelet_restart",
)
#: A second plugin for a resource joins the first only from 1.37 (one endpoint per socket); before, the rolling
#: update check skips naming the release.
ROLLING_UPDATE = "test_convention_rolling_update_without_downtime"
BEFORE_PER_SOCKET = re.compile(r"holds for Kubernetes 1\.37 and later .* runs kubernetes 1\.3[4-6]\.")


@pytest.mark.parametrize("release", GENERIC_RELEASES)
def test_generic_device_plugin_passes(release: str, peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    """squat's generic-device-plugin (Go, widely deployed) with its README's kind of command line: four files as
    ``example.com/widget``. Its socket is ``gdp-<resource>-<unix seconds>.sock``, named when it starts and never
    cleaned up, so a second instance beside the first never shares it (the rolling-update convention holds) and a
    process started again within the second of its predecessor's start could never serve (issue 45: the harness did
    that; no node does)."""
    binary = peer_binary("generic-device-plugin")
    widgets = tmp_path / "widgets"
    widgets.mkdir()
    for i in range(4):
        (widgets / f"widget{i}").touch()
    device = json.dumps({"name": "widget", "groups": [{"paths": [{"path": f"{widgets}/widget*"}]}]})
    cmd = shlex.join([str(binary), "--plugin-directory", "{plugin_dir}", "--domain", "example.com"])
    cmd += " --listen 127.0.0.1:0 --device " + shlex.quote(device)  # no port of its own: runs beside others
    options = ["--kubernetes-version", release, "--plugin-cmd", cmd, "--resource-name", "example.com/widget"]
    report = tmp_path / "report.md"
    options += ["--conventions", "rolling-update", "--report", str(report)]
    result = run_conformance(options, [], tmp_path, timeout=SUITE_TIMEOUT_S)
    assert not result.failed, f"generic-device-plugin at {release}:\n" + "\n".join(result.failed) + result.output
    assert result.returncode == 0, f"devplug conformance exited {result.returncode}:\n{result.output}"
    header = report.read_text().split("\n\n")[1]
    assert f"| Kubernetes | kubernetes {release}." in header, f"the run did not follow {release}:\n{header}"
    per_socket = release >= "1.37"
    skips = GENERIC_SKIPS if per_socket else (*GENERIC_SKIPS, BEFORE_PER_SOCKET)
    unexplained = {t: r for t, r in result.skipped.items() if not any(p.search(r) for p in skips)}
    assert not unexplained, f"generic-device-plugin: skips without a reason that fits it: {unexplained}"
    missing = [t for t in (*GENERIC_MUST_PASS, *([ROLLING_UPDATE] if per_socket else [])) if t not in result.passed]
    assert not missing, f"generic-device-plugin: expected to pass, did not: {missing}; skips: {result.skipped}"


STUB_DIR = Path(__file__).resolve().parents[2] / "peers" / "stub-plugin"
#: Its own cluster when run alone; `nox -s e2e` points it at the shared one (DEVPLUG_KIND_CLUSTER) and a node of its
#: own (--devplug-node through PYTEST_ADDOPTS, tools/e2e-lanes.sh).
KIND_CLUSTER = "devplug-one-device"
#: A whole suite on kind (cluster creation and image loads included): ~5 min on 2 cores alone, more beside the lanes.
KIND_SUITE_TIMEOUT_S = 1800
#: What may skip on one device: what needs a fault injector, a second device, several resources or a topology, and
#: the conventions it does not declare.
ONE_DEVICE_SKIPS = (
    NO_MOCK,
    CONVENTION_OFF,
    NO_TOPOLOGY,
    ONE_RESOURCE,
    NO_PRE_START,
    re.compile(r"needs 2 devices|plugin lists 1"),
)
#: The checks that hand a device out again after a restart: on one device they must free it first, and pass.
ONE_DEVICE_MUST_PASS = (
    "test_abrupt_kill_then_restart_serves_again",
    "test_kubelet_restart_then_plugin_restart",
    "test_plugin_restart_keeps_assignments",
    "test_checkpoint_survives_kubelet_restart",
    "test_pods_deleted_while_kubelet_down_free_their_devices",
    "test_node_reboot_then_plugin_comes_back",
)


@pytest.mark.kind
@pytest.mark.usefixtures("docker_available")
def test_one_device_stub_on_kind(peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    """Upstream's stub advertising one device (``peers/stub-plugin/daemonset-one-device.yaml``, as
    smarter-device-manager advertises each host device) under the suite on a real kubelet: 0 failed. The 5-minute
    grace-period test and the soak (a second node) are deselected, as for NVIDIA's plugin. Alone it makes a cluster of
    ``multi-node.yaml`` (the node under test a worker: the reboot check must not take the API server down with it).
    It runs without ``--pre-start-required``: a real kubelet logs its PreStartContainer calls only at -v>=4 and the
    stub logs them in words of its own (its PreStart is judged on the embedded kubelet, ``PEERS``)."""
    peer_binary("stub-plugin")  # a missing Go toolchain skips here (fails under CI), not in the image build
    script = STUB_DIR / "build-image.sh"
    built = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1800, check=False)
    image = built.stdout.strip().splitlines()[-1] if built.returncode == 0 and built.stdout.strip() else ""
    assert image, f"{script} exited {built.returncode} without an image tag:\n{built.stderr[-4000:]}"
    options = [
        "--backend",
        "kind",
        "--plugin-image",
        image,
        "--plugin-manifest",
        str(STUB_DIR / "daemonset-one-device.yaml"),
        "--resource-name",
        "example.com/stub",
        "--timeout",
        "60",
    ]
    pytest_args = [
        "-m",
        "not devplug_grace_period and not devplug_soak",
        f"--cluster-name={KIND_CLUSTER}",
        "--devplug-kind-config=multi-node.yaml",
    ]
    result = run_conformance(options, pytest_args, tmp_path, timeout=KIND_SUITE_TIMEOUT_S)
    assert not result.failed, "one-device stub on kind:\n" + "\n".join(result.failed) + "\n" + result.output
    assert result.returncode == 0, f"devplug conformance exited {result.returncode}:\n{result.output}"
    unexplained = {t: r for t, r in result.skipped.items() if not any(p.search(r) for p in ONE_DEVICE_SKIPS)}
    assert not unexplained, f"one-device stub: skips without a reason that fits it: {unexplained}"
    missing = [t for t in ONE_DEVICE_MUST_PASS if t not in result.passed]
    assert not missing, f"one-device stub: expected to pass on kind, did not: {missing}; skips: {result.skipped}"


def test_junit_reading_counts_failures_errors_and_skip_reasons(tmp_path: Path) -> None:
    """The verdict above rests on this reading: a failure, an error and a skip's reason are all seen."""
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="a" name="test_ok"/>'
        '<testcase classname="a" name="test_bad"><failure message="boom">tb</failure></testcase>'
        '<testcase classname="a" name="test_err"><error message="fixture broke">tb</error></testcase>'
        '<testcase classname="a" name="test_skip">'
        '<skipped type="pytest.skip" message="needs the mock-NVML fault controls"/></testcase>'
        "</testsuite></testsuites>"
    )
    result = parse_junit(junit)
    assert result.passed == ["test_ok"]
    assert result.failed == ["test_bad: boom\ntb", "test_err: fixture broke\ntb"]  # the message, then the text
    assert result.skipped == {"test_skip": "needs the mock-NVML fault controls"}
    assert NO_MOCK.search(result.skipped["test_skip"]) and not NO_TOPOLOGY.search(result.skipped["test_skip"])
