"""``sigs.k8s.io/dra-example-driver`` v0.2.1's kubelet plugin, built from its Go module (``peers/build-dra.sh``), under
the DRA conformance suite with its plain command line, as its DaemonSet starts it: the kubelet's standard paths
(``/var/lib/kubelet/plugins_registry``, ``/var/lib/kubelet/plugins``, ``/etc/cdi``) in the node's private mount
namespace, ``NODE_NAME`` set, the API reached in-cluster (service-account token and CA, ``KUBERNETES_SERVICE_*``).

A correct driver gets 0 failed and 0 errors; every skip must name what the driver lacks: a fault injector (it
fails on no command) or a health service (v0.2.1 serves no ``v1alpha1.DRAResourceHealth``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ..support import run_conformance

DRIVER = "gpu.example.com"
#: What the example driver may be skipped for, and nothing else.
ALLOWED_SKIPS = (re.compile(r"needs a fault injector: .*DRAFaultInjector"), re.compile(r"serves no v1alpha1\.DRAResourceHealth"))
#: The checks it is here to exercise: everything that needs no fault.
MUST_PASS = (
    "test_driver_registers_with_the_kubelet", "test_reregisters_after_kubelet_restart", "test_reregisters_after_driver_restart",
    "test_abrupt_kill_then_start_registers_again", "test_recovers_after_refused_registration", "test_slices_published",
    "test_node_slices_removed_on_kubelet_start_then_published_again", "test_slices_removed_after_driver_stops",
    "test_slices_kept_when_driver_restarts_quickly", "test_claim_prepared_and_container_sees_it", "test_claim_for_two_devices",
    "test_claim_from_template", "test_prepare_is_idempotent", "test_unprepared_when_pod_deleted_and_unprepare_is_idempotent",
    "test_checkpoint_survives_kubelet_restart", "test_unprepare_for_pod_deleted_while_kubelet_down",
    "test_pod_created_while_kubelet_down_runs", "test_pod_deleted_while_kubelet_down_is_never_prepared",
    "test_unsatisfiable_claim_stays_unschedulable", "test_shared_claim", "test_checkpoint_contents",
)  # fmt: skip
SUITE_TIMEOUT_S = 600


def test_dra_suite_passes_on_the_example_driver(peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    binary = peer_binary("dra-example-kubeletplugin")
    result = run_conformance(["--dra", "--driver-cmd", str(binary), "--driver-name", DRIVER], [], tmp_path, timeout=SUITE_TIMEOUT_S)
    assert not result.failed, f"dra-example-driver: {len(result.failed)} failed/errors:\n" + "\n".join(result.failed) + result.output
    assert result.returncode == 0, f"devplug conformance --dra exited {result.returncode}:\n{result.output}"
    unexplained = {t: r for t, r in result.skipped.items() if not any(p.search(r) for p in ALLOWED_SKIPS)}
    assert not unexplained, f"dra-example-driver: skips without a reason that fits the driver: {unexplained}"
    missing = [t for t in MUST_PASS if t not in result.passed]
    assert not missing, f"dra-example-driver: expected to pass but did not run or skipped: {missing}; skips: {result.skipped}"
