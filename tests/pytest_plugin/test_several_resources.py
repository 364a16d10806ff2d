"""Several resources from one plugin process, through the user's entry point: ``devplug conformance --resource-name
a,b`` runs the included plugin with ``--second-resource`` and the several-resources checks judge both resources
(with one resource they skip at once, saying so). The other new checks of the plugin under test (PreStartContainer
failing, pod-resources ``Get``, health of a pod that never started, the rolling update) run in the same pass."""

from __future__ import annotations

from pathlib import Path

from ..support import run_conformance

CHECKS = (
    "test_every_resource_registers_and_allocates",
    "test_every_resource_reregisters_after_kubelet_restart",
    "test_failing_prestart_keeps_the_container_from_starting",
    "test_pod_resources_get_lists_one_pod",
    "test_device_health_reported_for_a_pod_that_never_started",
    "test_convention_rolling_update_without_downtime",
)


def test_two_resources_of_the_included_plugin_pass_the_new_checks(tmp_path: Path) -> None:
    result = run_conformance(
        ["--backend", "sim", "--resource-name", "nvidia.com/gpu,example.com/gpu-half"],
        ["-k", " or ".join(CHECKS), "--devplug-soak=0"],
        tmp_path,
        timeout=600,
    )
    assert result.verdicts() == dict.fromkeys(CHECKS, "passed"), (
        f"{result.verdicts()}\n{result.failed}\n{result.output}"
    )
    assert result.returncode == 0, result.output
