"""``sigs.k8s.io/dra-example-driver``'s kubelet plugin, built from its Go module (``peers/build-dra.sh``), under the DRA
conformance suite as its Helm chart runs it: the kubelet's standard paths (``/var/lib/kubelet/plugins_registry``,
``/var/lib/kubelet/plugins``) in the node's private mount namespace, its CDI specs in ``/var/run/cdi`` (``CDI_ROOT``;
the binary's own default ``/etc/cdi`` survives a reboot), ``NODE_NAME`` set, the API reached in-cluster (service-account
token and CA, ``KUBERNETES_SERVICE_*``).

A correct driver gets 0 failed and 0 errors; every skip must name what the driver lacks: a fault injector (it
fails on no command) or a health service (v0.2.1 serves no ``v1alpha1.DRAResourceHealth``). Every release up to
v0.4.0 fails the node-reboot check for the upstream defect it has (kubernetes/kubernetes#141433: a prepare answered
from its checkpoint does not write the claim's CDI spec again, so after a reboot emptied ``/var/run/cdi`` the
container is refused for good); that stays visible as a strict xfail, and v0.2.1 patched the way its PR #259 fixes
it passes. Both releases also lose their slices when the kubelet starts right after they updated them
(kubernetes/kubernetes#140011, inherited from the kubeletplugin library): the whole-suite runs deselect that check
(``-m "not upstream_library_bug"``, as a driver's CI may) and a strict xfail judges it. On kind (``nox -s e2e``) it
runs as its chart deploys it (``peers/dra-example/``: its image built here from the same binary), under a real
kubelet: the same, and one more skip, for what a real kubelet cannot be made to do.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from ..support import (
    LIBRARY_BUG_CHECK,
    LIBRARY_BUG_SYMPTOM,
    NOT_LIBRARY_BUGS,
    WRITES_NO_DEVICE_STATUS,
    KnownUpstreamDefect,
    SuiteResult,
    assert_suite_passed,
    dra_check_selection,
    run_conformance,
    selection_mismatch,
    upstream_defect_verdict,
)

DRIVER = "gpu.example.com"
#: What the example driver may be skipped for, and nothing else.
ALLOWED_SKIPS = (
    re.compile(r"needs a fault injector: .*DRAFaultInjector"),
    re.compile(r"serves neither v1\.DRAResourceHealth nor v1alpha1\.DRAResourceHealth"),
    WRITES_NO_DEVICE_STATUS,  # without --gpu-device-status (v0.4.0; v0.2.1 has no such flag)
)
#: The checks it is here to exercise: everything that needs no fault.
MUST_PASS = (
    "test_driver_registers_with_the_kubelet",
    "test_reregisters_after_kubelet_restart",
    "test_reregisters_after_driver_restart",
    "test_abrupt_kill_then_start_registers_again",
    "test_recovers_after_refused_registration",
    "test_slices_published",
    "test_node_slices_removed_on_kubelet_start_then_published_again",
    "test_slices_removed_after_driver_stops",
    "test_slices_kept_when_driver_restarts_quickly",
    "test_claim_prepared_and_container_sees_it",
    "test_claim_for_two_devices",
    "test_claim_from_template",
    "test_prepare_is_idempotent",
    "test_unprepared_when_pod_deleted_and_unprepare_is_idempotent",
    "test_checkpoint_survives_kubelet_restart",
    "test_unprepare_for_pod_deleted_while_kubelet_down",
    "test_pod_created_while_kubelet_down_runs",
    "test_pod_deleted_while_kubelet_down_is_never_prepared",
    "test_unsatisfiable_claim_stays_unschedulable",
    "test_shared_claim",
    "test_checkpoint_contents",
    "test_device_taint_keeps_claims_off_tainted_devices",
    "test_claim_with_several_requests",
    "test_unprepare_after_a_restart_removes_the_claims_cdi_specs",
    "test_devices_prepared_again_for_a_new_claim_after_cleanup",
)
SUITE_TIMEOUT_S = 600
#: Where its chart has it write CDI specs (``CDI_ROOT``): on the node's ``/run`` tmpfs.
CHART_CDI_ROOT = "/var/run/cdi"
#: The check the releases up to v0.4.0 fail, and what its failure must say.
REBOOT_CHECK = "test_pods_come_back_with_their_devices_after_a_node_reboot"
REBOOT_BUG = "CDI device injection failed: unresolvable CDI devices"
UPSTREAM_BUG = (
    "kubernetes/kubernetes#141433: dra-example-driver up to v0.4.0 answers a prepare from its checkpoint without "
    "writing the claim's CDI spec again (fixed on its main branch by PR #259)"
)


def _command(binary: Path) -> list[str]:
    return ["--dra", "--driver-cmd", f"{binary} --cdi-root {CHART_CDI_ROOT}", "--driver-name", DRIVER]


def test_dra_suite_passes_on_the_example_driver(peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    """v0.2.1 as its chart runs it, every check but the reboot check (the strict xfail below judges that one)."""
    binary = peer_binary("dra-example-kubeletplugin")
    result = run_conformance(
        _command(binary), ["-k", f"not {REBOOT_CHECK}", *NOT_LIBRARY_BUGS], tmp_path, timeout=SUITE_TIMEOUT_S
    )
    assert_suite_passed(result, "dra-example-driver", ALLOWED_SKIPS, MUST_PASS)


def test_dra_suite_passes_on_the_example_drivers_partitions(peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    """v0.4.0 with ``--gpu-partitions 2`` (KEP-4815): every GPU published whole and as two partitions, all three
    consuming the GPU's shared counters, so no claim holds a GPU with its own partitions. Every check but the reboot
    check (v0.4.0 has kubernetes/kubernetes#141433, judged below) passes: the checks that claim "every device" claim
    as many as the counters allow together, which the scheduler can allocate."""
    binary = peer_binary("dra-example-kubeletplugin-v040")
    options = ["--dra", "--driver-cmd", f"{binary} --cdi-root {CHART_CDI_ROOT} --gpu-partitions 2"]
    result = run_conformance(
        [*options, "--driver-name", DRIVER],
        ["-k", f"not {REBOOT_CHECK}", *NOT_LIBRARY_BUGS],
        tmp_path,
        timeout=SUITE_TIMEOUT_S,
    )
    assert_suite_passed(result, "dra-example-driver v0.4.0 --gpu-partitions 2", ALLOWED_SKIPS, MUST_PASS)


@pytest.mark.xfail(strict=True, raises=KnownUpstreamDefect, reason=UPSTREAM_BUG)
@pytest.mark.parametrize("peer", ["dra-example-kubeletplugin", "dra-example-kubeletplugin-v040"])
def test_example_driver_releases_fail_the_reboot_check(
    peer: str, peer_binary: Callable[[str], Path], tmp_path: Path
) -> None:
    """v0.2.1 and v0.4.0 as released: the reboot check fails them with the runtime's CDI refusal. Passing it (the
    release fixed) turns this strict xfail into a failure, so its row in docs/guides/dra-drivers.md gets updated;
    failing it for another reason is a plain failure."""
    result = run_conformance(_command(peer_binary(peer)), ["-k", REBOOT_CHECK], tmp_path, timeout=SUITE_TIMEOUT_S)
    _reboot_verdict(result, peer)


#: Why the releases fail the library-bug check: their ResourceSlice controller.
LIBRARY_UPSTREAM = (
    "kubernetes/kubernetes#140011: v0.2.1 and v0.4.0 publish their slices with k8s.io/dynamic-resource-allocation "
    "v0.34.0 and v0.36.2, whose mutation cache hides a deletion of a slice updated less than a minute before (fixed "
    "by kubernetes/kubernetes#140063 in v0.38)"
)


@pytest.mark.xfail(strict=True, raises=KnownUpstreamDefect, reason=LIBRARY_UPSTREAM)
@pytest.mark.parametrize("peer", ["dra-example-kubeletplugin", "dra-example-kubeletplugin-v040"])
def test_example_driver_releases_lose_slices_updated_before_a_kubelet_start(
    peer: str, peer_binary: Callable[[str], Path], tmp_path: Path
) -> None:
    """v0.2.1 and v0.4.0 as released: restarted with a device missing from their slice they update it in place, and
    the kubelet's start right after deletes it for good (v0.4.0 on the fixed library passes: below)."""
    result = run_conformance(_command(peer_binary(peer)), ["-k", LIBRARY_BUG_CHECK], tmp_path, timeout=SUITE_TIMEOUT_S)
    upstream_defect_verdict(result, peer, LIBRARY_BUG_CHECK, LIBRARY_BUG_SYMPTOM, LIBRARY_UPSTREAM)


def test_example_driver_on_the_fixed_library_keeps_slices_updated_before_a_kubelet_start(
    peer_binary: Callable[[str], Path], tmp_path: Path
) -> None:
    """The positive control of the strict xfail above: v0.4.0 built on k8s.io/dynamic-resource-allocation
    v0.38.0-beta.0 (kubernetes/kubernetes#140063's fix; ``peers/dra-example/kubeletplugin-library-v0.38.patch``
    only makes it compile there) publishes its slices again after the same update and kubelet start. So the
    released drivers fail the check for their library, not for anything the harness does."""
    binary = peer_binary("dra-example-kubeletplugin-v040-lib038")
    result = run_conformance(_command(binary), ["-k", LIBRARY_BUG_CHECK], tmp_path, timeout=SUITE_TIMEOUT_S)
    assert result.passed == [LIBRARY_BUG_CHECK], (
        f"expected {LIBRARY_BUG_CHECK} to pass: failed {result.failed}, skipped {result.skipped}\n{result.output}"
    )


def _reboot_verdict(result: SuiteResult, what: str) -> None:
    """:class:`KnownUpstreamDefect` when the reboot check failed for the CDI refusal and nothing else failed."""
    __tracebackhide__ = True
    upstream_defect_verdict(result, what, REBOOT_CHECK, REBOOT_BUG, UPSTREAM_BUG)


#: The device-status check, and what v0.4.0 with ``--gpu-device-status`` fails it for.
DEVICE_STATUS_CHECK = "test_device_status_keeps_what_others_wrote"
DEVICE_STATUS_BUG = "dropped what another writer had put there"
DEVICE_STATUS_UPSTREAM = (
    "dra-example-driver v0.4.0 with --gpu-device-status sets a prepared claim's status.devices to its own entries "
    "(cmd/dra-example-kubeletplugin/state.go, updateDeviceStatus: claim.Status.Devices = devices), dropping the "
    "entries and conditions others wrote there (binding conditions among them); not yet reported upstream"
)


@pytest.mark.xfail(strict=True, raises=KnownUpstreamDefect, reason=DEVICE_STATUS_UPSTREAM)
def test_example_driver_with_device_status_drops_what_others_wrote(
    peer_binary: Callable[[str], Path], tmp_path: Path
) -> None:
    """v0.4.0 with ``--gpu-device-status`` (its devices' uuid, model and driverVersion in the claim's status): the
    device-status check fails it for the condition written before its prepare, gone after it."""
    binary = peer_binary("dra-example-kubeletplugin-v040")
    options = ["--dra", "--driver-cmd", f"{binary} --cdi-root {CHART_CDI_ROOT} --gpu-device-status"]
    result = run_conformance(
        [*options, "--driver-name", DRIVER], ["-k", DEVICE_STATUS_CHECK], tmp_path, timeout=SUITE_TIMEOUT_S
    )
    upstream_defect_verdict(
        result,
        "dra-example-driver v0.4.0 --gpu-device-status",
        DEVICE_STATUS_CHECK,
        DEVICE_STATUS_BUG,
        DEVICE_STATUS_UPSTREAM,
    )


def test_patched_example_driver_passes_the_reboot_check(peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    """v0.2.1 with peers/dra-example/recreate-cdi-spec-on-restored-claim.patch (a prepare answered from the checkpoint
    writes the spec again, as PR #259 does): the reboot check passes, and so do the prepare and restart checks."""
    binary = peer_binary("dra-example-kubeletplugin-patched")
    result = run_conformance(
        _command(binary),
        ["-k", f"{REBOOT_CHECK} or prepared_and_container or restarts"],
        tmp_path,
        timeout=SUITE_TIMEOUT_S,
    )
    assert not result.failed, "patched dra-example-driver:\n" + "\n".join(result.failed) + result.output
    assert REBOOT_CHECK in result.passed, (
        f"patched dra-example-driver: {REBOOT_CHECK} did not pass; skips: {result.skipped}"
    )


EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "peers" / "dra-example"
#: What a real kubelet cannot be made to do (the check skips saying so): refuse a registration on purpose; reboot the
#: node of a single-node cluster (the control plane goes with it: the e2e lanes run on workers).
KIND_LIMITS = re.compile(
    r"a real kubelet refuses a registration only for a reason of the driver's|"
    r"runs the cluster's control plane .*run the reboot checks on a worker node"
)
#: Its own cluster when run alone; `nox -s e2e` points it at the shared one (DEVPLUG_KIND_CLUSTER) and a node of its
#: own (--devplug-node through PYTEST_ADDOPTS, tools/e2e-lanes.sh).
KIND_CLUSTER = "devplug-dra-example"
#: The suite on a real kubelet waits out its periods (wiping 30 s, reconcile 60 s): about 8 min at a load of ~10.
KIND_SUITE_TIMEOUT_S = 1800


def _kind_options(peer_binary: Callable[[str], Path]) -> list[str]:
    """The chart's kubelet plugin (``peers/dra-example/kubeletplugin.yaml``: CDI_ROOT=/var/run/cdi), its image built by
    ``peers/dra-example/build-image.sh`` from the cached binary."""
    __tracebackhide__ = True
    peer_binary(
        "dra-example-kubeletplugin"
    )  # a missing Go toolchain skips here (fails under CI), not in the image build
    built = subprocess.run(
        ["bash", str(EXAMPLE_DIR / "build-image.sh")], capture_output=True, text=True, timeout=1800, check=False
    )
    image = built.stdout.strip().splitlines()[-1] if built.returncode == 0 and built.stdout.strip() else ""
    assert image, f"build-image.sh exited {built.returncode} without an image tag:\n{built.stderr[-4000:]}"
    return [
        "--dra",
        "--backend",
        "kind",
        "--timeout",
        "60",
        "--driver-name",
        DRIVER,
        "--driver-image",
        image,
        "--driver-manifest",
        str(EXAMPLE_DIR / "kubeletplugin.yaml"),
    ]


@pytest.mark.kind
@pytest.mark.usefixtures("docker_available")
def test_dra_suite_passes_on_the_example_driver_on_kind(peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    """The same on a kind cluster: the kubelet plugin as its chart deploys it (ServiceAccount, ClusterRole, DaemonSet),
    every check but the reboot check (judged below)."""
    options = _kind_options(peer_binary)
    select, selected = dra_check_selection()  # DEVPLUG_DRA_CHECKS: the checks this run covers (nox -s e2e)
    assert selected is None or REBOOT_CHECK not in selected, f"{REBOOT_CHECK} is judged by the strict xfail below"
    select = select or ["-k", f"not {REBOOT_CHECK}", *NOT_LIBRARY_BUGS]
    result = run_conformance(
        options, [f"--cluster-name={KIND_CLUSTER}", "-rs", *select], tmp_path, timeout=KIND_SUITE_TIMEOUT_S
    )
    assert not selection_mismatch(result, selected), (
        f"not the selected checks: {selection_mismatch(result, selected)}\n{result.output}"
    )
    assert not result.failed, (
        f"dra-example-driver on kind: {len(result.failed)} failed/errors:\n" + "\n".join(result.failed) + result.output
    )
    assert result.returncode == 0, (
        f"devplug conformance --dra --backend kind exited {result.returncode}:\n{result.output}"
    )
    allowed = (*ALLOWED_SKIPS, KIND_LIMITS)
    unexplained = {t: r for t, r in result.skipped.items() if not any(p.search(r) for p in allowed)}
    assert not unexplained, (
        f"dra-example-driver on kind: skips without a reason that fits the driver or kind: {unexplained}"
    )
    expected = [
        t for t in MUST_PASS if t != "test_recovers_after_refused_registration" and (selected is None or t in selected)
    ]
    missing = [t for t in expected if t not in result.passed]
    assert not missing, (
        f"dra-example-driver on kind: expected to pass but did not run or skipped: {missing}; skips: {result.skipped}"
    )
    print(f"verdict: {len(result.passed)} passed, {len(result.skipped)} skipped, 0 failed: {sorted(result.skipped)}")


@pytest.mark.kind
@pytest.mark.usefixtures("docker_available")
@pytest.mark.xfail(strict=True, raises=KnownUpstreamDefect, reason=UPSTREAM_BUG)
def test_example_driver_fails_the_reboot_check_on_kind(peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    """v0.2.1 as its chart deploys it, on a real kubelet and containerd: the staged reboot (sandboxes removed,
    /var/run/cdi emptied) leaves its pod refused by containerd for the CDI devices, as on the embedded kubelet."""
    result = run_conformance(
        _kind_options(peer_binary),
        [f"--cluster-name={KIND_CLUSTER}", "-rs", "-k", REBOOT_CHECK],
        tmp_path,
        timeout=KIND_SUITE_TIMEOUT_S,
    )
    _reboot_verdict(result, "dra-example-driver v0.2.1 on kind")
