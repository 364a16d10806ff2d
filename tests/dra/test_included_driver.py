"""The DRA suite against the included GPU plugin's DRA driver (``devplug-gpu-plugin --dra``), as
``devplug conformance --dra`` runs it with no driver given: on the mock NVML, with its fault injector, every
check runs; only the unprepare faults skip, since a failing NodeUnprepareResources has no meaning in the
mock-NVML state the injector writes. On kind (``nox -s e2e``) it runs from its own manifest
(``plugin_under_test/deploy/dra-driver.yaml``, the plugin's image built here) under a real kubelet 1.34: the same
verdicts, and one more skip, for what a real kubelet cannot be made to do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ..support import DRA_CHECKS_ENV, SuiteResult, dra_check_selection, run_conformance, selection_mismatch

#: The only skips the included driver may get, each naming why.
ALLOWED_SKIPS = re.compile(
    r"cannot fail NodeUnprepareResources: .*no meaning in the mock-NVML state|"
    r"reports device health through its health stream"
)  # not as device taints
#: A control plane start plus ~27 checks (about 80 s at load 6); the kubelet-start republish check alone
#: waits out the driver's resync.
SUITE_TIMEOUT_S = 600


#: The checks that need the driver's faults: they run and pass on the included driver.
FAULT_CHECKS = {
    "test_device_health_reaches_pod_status",
    "test_device_health_unknown_after_driver_stops",
    "test_failed_prepare_keeps_pod_pending_then_runs",
    "test_prepare_retried_after_kubelet_restart",
}
#: What a real kubelet cannot be made to do (the check skips saying so): refuse a registration on purpose; reboot the
#: node of a single-node cluster (the control plane goes with it: the e2e lanes run on workers).
KIND_LIMITS = re.compile(
    r"a real kubelet refuses a registration only for a reason of the driver's|"
    r"runs the cluster's control plane .*run the reboot checks on a worker node"
)
#: Its own cluster when run alone; `nox -s e2e` points it at the shared one (DEVPLUG_KIND_CLUSTER) and a node of its
#: own (--devplug-node through PYTEST_ADDOPTS, tools/e2e-lanes.sh).
KIND_CLUSTER = "devplug-dra"
#: The suite on a real kubelet waits out its periods (wiping 30 s, reconcile 60 s): about 8 min at a load of ~10.
KIND_SUITE_TIMEOUT_S = 1800


def _assert_verdicts(
    options: list[str],
    pytest_args: list[str],
    tmp_path: Path,
    timeout: float,
    *,
    skips: list[re.Pattern[str]],
    selected: frozenset[str] | None = None,
) -> None:
    """The suite passed (every fault check too), every skip explained by ``skips``, and the report judged the driver;
    ``selected``: only those checks ran (``pytest_args`` selects them), each with a verdict."""
    __tracebackhide__ = True
    result = run_conformance(
        [*options, "--report", str(tmp_path / "report.md")], pytest_args, tmp_path, timeout=timeout
    )
    assert not selection_mismatch(result, selected), (
        f"not the selected checks: {selection_mismatch(result, selected)}\n{result.output}"
    )
    assert not result.failed, "the included driver: failed/errors:\n" + "\n".join(result.failed) + result.output
    assert result.returncode == 0, (
        f"devplug conformance {' '.join(options)} exited {result.returncode}:\n{result.output}"
    )
    unexplained = {t: r for t, r in result.skipped.items() if not any(p.search(r) for p in skips)}
    assert not unexplained, f"skips the included driver has no reason for: {unexplained}"
    faults = FAULT_CHECKS if selected is None else FAULT_CHECKS & selected
    assert faults <= set(result.passed), f"fault checks that did not pass on the included driver: {result.verdicts()}"
    report = json.loads((tmp_path / "report.json").read_text())["run"]  # what was judged: the driver, as deployed
    assert report["subject"] == "dra-driver" and report["driver_name"] == "gpu.devplug.io", report
    assert report["plugin"] == "", report
    assert (tmp_path / "report.md").read_text().startswith("# DRA driver conformance report\n")
    print(f"verdict: {len(result.passed)} passed, {len(result.skipped)} skipped, 0 failed: {sorted(result.skipped)}")


def test_dra_suite_passes_on_the_included_driver(tmp_path: Path) -> None:
    _assert_verdicts(["--dra"], [], tmp_path, SUITE_TIMEOUT_S, skips=[ALLOWED_SKIPS])
    assert "-m devplug_gpu_plugin --dra" in json.loads((tmp_path / "report.json").read_text())["run"]["driver"]


@pytest.mark.kind
def test_dra_suite_passes_on_the_included_driver_on_kind(tmp_path: Path) -> None:
    """The same on a kind cluster: the driver from ``plugin_under_test/deploy/dra-driver.yaml`` on the mock NVML
    (the checks named by ``DEVPLUG_DRA_CHECKS`` where it is set)."""
    select, selected = dra_check_selection()
    _assert_verdicts(
        ["--dra", "--backend", "kind", "--timeout", "60"],
        [f"--cluster-name={KIND_CLUSTER}", "-rs", *select],
        tmp_path,
        KIND_SUITE_TIMEOUT_S,
        skips=[ALLOWED_SKIPS, KIND_LIMITS],
        selected=selected,
    )


def test_a_check_selection_is_exact_and_a_check_without_verdict_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """``DEVPLUG_DRA_CHECKS`` (how `nox -s e2e` splits the kind runs): a ``-k`` of those names, and after the run any
    of them without a verdict, or any check that ran unselected, is reported: a misspelt name cannot shrink the run
    unseen, nor a substring match widen it."""
    monkeypatch.delenv(DRA_CHECKS_ENV, raising=False)
    assert dra_check_selection() == ([], None)
    monkeypatch.setenv(DRA_CHECKS_ENV, " test_shared_claim\ttest_checkpoint_contents  ")
    args, names = dra_check_selection()
    assert args == ["-k", "test_checkpoint_contents or test_shared_claim"]
    assert names == {"test_shared_claim", "test_checkpoint_contents"}
    result = SuiteResult(passed=["test_shared_claim"], skipped={"test_shared_claim_twice": "why"})
    assert selection_mismatch(result, names) == [
        "no verdict: test_checkpoint_contents",
        "not selected: test_shared_claim_twice",
    ]
    assert selection_mismatch(SuiteResult(passed=sorted(names)), names) == []
    assert selection_mismatch(result, None) == []


def test_the_e2e_lanes_run_every_dra_check_on_kind() -> None:
    """tools/e2e-lanes.sh's split covers the whole DRA suite: a check added to the suite and to neither driver's list
    would never meet a real kubelet, and a name in a list that matches no check fails the lane only once it runs."""
    import ast

    from pytest_devplug.dra import conformance

    lanes = (Path(__file__).parents[2] / "tools" / "e2e-lanes.sh").read_text()
    lists = {
        var: set(re.search(rf'^{var}="([^"]*)"', lanes, re.M).group(1).split())  # type: ignore[union-attr]
        for var in ("dra_shared", "dra_included", "dra_example")
    }
    suite = {
        node.name
        for module in Path(conformance.__file__).parent.glob("test_*.py")
        for node in ast.walk(ast.parse(module.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    on_kind = lists["dra_shared"] | lists["dra_included"] | lists["dra_example"]
    assert on_kind == suite, f"never on kind: {sorted(suite - on_kind)}; no such check: {sorted(on_kind - suite)}"
    assert not lists["dra_shared"] & (lists["dra_included"] | lists["dra_example"]), lists
