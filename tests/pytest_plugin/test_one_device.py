"""The whole device-plugin suite on a resource with one device (as smarter-device-manager advertises each host
device): every check that needs a free device frees the one it used first, or skips saying it needs two."""

from __future__ import annotations

import sys
from pathlib import Path

from ..support import run_conformance

WIDGET = Path(__file__).resolve().parents[1] / "fixture_plugins" / "widget.py"
#: The checks that once asked for a second device while the only one was held; they must run, not skip.
MUST_PASS = (
    "test_abrupt_kill_then_restart_serves_again",
    "test_kubelet_restart_then_plugin_restart",
    "test_plugin_restart_keeps_assignments",
    "test_checkpoint_survives_kubelet_restart",
)
#: Skips a one-device widget may get: no fault injector, conventions it does not declare, what needs two devices
#: or several resources or a topology, PreStart it does not ask for.
ALLOWED_SKIP_WORDS = (
    "fault injector",
    "convention check",
    "needs 2 devices",
    "plugin lists 1",
    "serves one resource",
    "topology",
    "pre_start_required=false",
    "rolling-update",
)
SUITE_TIMEOUT_S = 600


def test_suite_passes_a_one_device_plugin(tmp_path: Path) -> None:
    cmd = f"{sys.executable} {WIDGET} --count 1 --retry --plugin-dir {{plugin_dir}}"
    result = run_conformance(
        ["--plugin-cmd", cmd, "--resource-name", "example.com/widget"], [], tmp_path, timeout=SUITE_TIMEOUT_S
    )
    assert not result.failed, "one-device widget:\n" + "\n".join(result.failed) + "\n" + result.output
    assert result.returncode == 0, f"devplug conformance exited {result.returncode}:\n{result.output}"
    missing = [t for t in MUST_PASS if t not in result.passed]
    assert not missing, f"expected to pass on one device, did not: {missing}; skips: {result.skipped}"
    odd = {t: why for t, why in result.skipped.items() if not any(w in why for w in ALLOWED_SKIP_WORDS)}
    assert not odd, f"skipped for a reason a one-device plugin does not explain: {odd}"
