"""The DRA suite against the included GPU plugin's DRA driver (``devplug-gpu-plugin --dra``), as
``devplug conformance --dra`` runs it with no driver given: on the mock NVML, with its fault injector, every
check runs; only the unprepare faults skip, since a failing NodeUnprepareResources has no meaning in the
mock-NVML state the injector writes.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..support import run_conformance

#: The only skips the included driver may get, each naming why.
ALLOWED_SKIPS = re.compile(r"cannot fail NodeUnprepareResources: .*no meaning in the mock-NVML state")
#: A control plane start plus ~27 checks (about 80 s at load 6); the kubelet-start republish check alone
#: waits out the driver's resync.
SUITE_TIMEOUT_S = 600


def test_dra_suite_passes_on_the_included_driver(tmp_path: Path) -> None:
    result = run_conformance(["--dra"], [], tmp_path, timeout=SUITE_TIMEOUT_S)
    assert not result.failed, "the included driver: failed/errors:\n" + "\n".join(result.failed) + result.output
    assert result.returncode == 0, f"devplug conformance --dra exited {result.returncode}:\n{result.output}"
    unexplained = {t: r for t, r in result.skipped.items() if not ALLOWED_SKIPS.search(r)}
    assert not unexplained, f"skips the included driver has no reason for: {unexplained}"
    fault_checks = {
        "test_device_health_reaches_pod_status", "test_device_health_unknown_after_driver_stops",
        "test_failed_prepare_keeps_pod_pending_then_runs", "test_prepare_retried_after_kubelet_restart",
    }  # fmt: skip
    assert fault_checks <= set(result.passed), f"fault checks that did not pass on the included driver: {result.verdicts()}"
