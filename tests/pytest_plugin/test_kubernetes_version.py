"""The Kubernetes release a run reproduces: its pins, its feature gates as that release's components take them, and
where the run says which one it is."""

from __future__ import annotations

import typing

from pathlib import Path

import pytest

from pytest_devplug.kubeletmodel.featuregates_generated import GATES
from pytest_devplug.kubeletmodel.releases import DEFAULT_VERSION, RULES, KubeVersion, RuleName, release, releases
from pytest_devplug.errors import VersionError

pytest_plugins = ["pytester"]


def test_supported_releases_and_the_default() -> None:
    assert list(releases()) == ["1.34", "1.35", "1.36", "1.37", "1.38"]
    assert DEFAULT_VERSION == "1.37" and release().kubernetes == "v1.37.2"
    assert release("v1.36").minor == release("1.36.3").minor == "1.36"
    assert release("1.38").go == "go1.27.3" and release("1.37").go == "local"
    assert release("1.35").staging == "v0.35.4"


def test_any_patch_release_is_modelled_on_its_minors_pinned_one() -> None:
    """1.36.1 runs as 1.36's pinned release, and the header says which patch the model follows."""
    assert release("1.36.1") == release("1.36") == release("v1.36.0")
    assert release("1.38.0") == release("1.38")
    kube = KubeVersion.of("1.36.1")
    assert kube.release.kubernetes == "v1.36.3" and kube.patch == "1.36.1"
    assert kube.name == "kubernetes 1.36.1 (modelled on 1.36.3, the pinned patch release, with 1.36.1's rules)"
    assert KubeVersion.of("1.36.3").patch is None and KubeVersion.of("1.36.3").name == "kubernetes 1.36.3"
    assert KubeVersion.of("1.36.1").has("endpoint-per-socket") is KubeVersion.of("1.36").has("endpoint-per-socket")


@pytest.mark.parametrize(
    ("version", "has"),
    [("1.34", False), ("1.34.6", False), ("1.34.7", True), ("1.35.0", False), ("1.35.3", False), ("1.35", True)],
)
def test_a_rule_backported_in_a_patch_holds_from_that_patch(version: str, has: bool) -> None:
    """Terminated pods answered "not found" came with v1.35.4 and v1.34.7 (cherry-picks #138042, #138027 of
    #135485): an earlier patch of either minor, or the pinned 1.34.4, has not got it."""
    assert KubeVersion.of(version).has("podresources-get-terminal-not-found") is has


def test_a_rules_releases_are_said_as_its_tags_have_it() -> None:
    assert RULES["endpoint-per-socket"].releases == "1.37 and later"
    assert RULES["podresources-get-terminal-not-found"].releases == (
        "1.35.4 and later, and 1.34.7 and later 1.34 patches"
    )


def test_a_node_is_judged_at_its_patch() -> None:
    run = KubeVersion.of("1.37")
    assert run.on_node("v1.35.2").patch == "1.35.2" and not run.on_node("v1.35.2").has(
        "podresources-get-terminal-not-found"
    )
    assert run.on_node("v1.35.4").patch is None and run.on_node("v1.35.4").has("podresources-get-terminal-not-found")
    assert run.on_node("v1.36.3-gke.1").release.minor == "1.36" and run.on_node("v1.36.3-gke.1").patch is None


@pytest.mark.parametrize("bad", ["1.33", "1.39", "2.0", "1.37.x", "1.37.0.1", "latest", ""])
def test_an_unsupported_version_names_the_supported_ones(bad: str) -> None:
    if bad == "":
        assert release(bad) == release()  # empty: the default, as an unset option
        return
    with pytest.raises(VersionError) as exc:
        release(bad)
    assert repr(bad) in str(exc.value) and "1.34 (v1.34.4), 1.35 (v1.35.4)" in str(exc.value)


def test_gates_are_each_releases_defaults() -> None:
    """Read off upstream's tables (featuregates_generated.py): the gates a plugin meets changing by release."""
    off_on = {"1.35": False, "1.36": True, "1.37": True}
    for minor, on in off_on.items():
        kube = KubeVersion.of(minor)
        assert kube.gate("ResourceHealthStatus") is on
        assert kube.gate("DRAExtendedResource") is on
        assert kube.gate("DRADeviceTaints") is on
    assert KubeVersion.of("1.35").gate("ResourceHealthStatusMessage") is False  # not a gate of 1.35 yet
    assert KubeVersion.of("1.38").gate("DynamicResourceAllocation") is True  # removed after GA: on
    assert "DynamicResourceAllocation" not in GATES[38] and GATES[37]["DynamicResourceAllocation"] == (True, "GA", True)
    with pytest.raises(KeyError):
        KubeVersion.of().gate("NoSuchGate")


def test_a_run_sets_gates_as_the_components_flag_does() -> None:
    kube = KubeVersion.of("1.35", "ResourceHealthStatus=true, DRADeviceTaints=True")
    assert kube.gate("ResourceHealthStatus") and kube.gate("DRADeviceTaints")
    assert kube.gate_flag() == "DRADeviceTaints=true,ResourceHealthStatus=true"
    assert KubeVersion.of("1.37", "DRADeviceTaints=false,DRADeviceTaintRules=false").gate("DRADeviceTaints") is False
    with pytest.raises(VersionError, match="invalid value of ResourceHealthStatus=yes"):
        KubeVersion.of("1.37", "ResourceHealthStatus=yes")


def test_a_nodes_release_is_judged_by_its_own_rules() -> None:
    run = KubeVersion.of("1.37", "ResourceHealthStatus=false,ResourceHealthStatusMessage=false")
    assert run.on_node("v1.36.3").release.minor == "1.36"
    assert run.on_node("v1.36.3").gate("ResourceHealthStatus") is False  # the run's setting travels with it
    assert run.on_node("v1.41.0").release.minor == "1.38" and run.on_node("v1.29.1").release.minor == "1.34"
    assert run.on_node("") is run and run.on_node("v1.37.2") is run
    assert run.on_node("v1.37.0").patch == "1.37.0"  # judged at its own patch, not the pinned one


def test_rules_name_their_release_and_upstream_file() -> None:
    for rule in RULES.values():
        assert rule.since in releases() and rule.since != "1.34", rule
        assert rule.upstream.startswith("pkg/"), rule
        assert rule.change.startswith("kubernetes/kubernetes#"), rule
        assert not KubeVersion.of(f"1.{int(rule.since[2:]) - 1}").has(rule.name) and KubeVersion.of(rule.since).has(
            rule.name
        )
    with pytest.raises(VersionError, match="unknown rule"):
        KubeVersion.of("1.37", no_such_rule=True)
    assert typing.get_args(RuleName) == tuple(RULES) and all(name == rule.name for name, rule in RULES.items())


def test_header_names_the_release(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--devplug-resource-name", "example.com/x")
    result.stdout.fnmatch_lines(["devplug: backend=sim, kubernetes 1.37.2; *"])
    result = pytester.runpytest_inprocess(
        "-p",
        "no:cacheprovider",
        "--devplug-kubernetes-version",
        "1.35",
        "--devplug-feature-gates",
        "ResourceHealthStatus=true",
    )
    result.stdout.fnmatch_lines(
        ["devplug: backend=sim, kubernetes 1.35.4 (feature gates ResourceHealthStatus=true); *"]
    )


DOC = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "kubernetes-releases.md"


def test_the_differences_table_has_every_rule_and_the_pins() -> None:
    text = DOC.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| 1.")]
    for rule in RULES.values():
        row = next((r for r in rows if f"`{rule.name}`" in r), None)
        assert row is not None, f"no row for {rule.name} in {DOC.name}"
        assert row.startswith(f"| {rule.since} |") and rule.upstream.split(" ")[0] in row, row
        assert all(tag in row for tag in rule.first_in) and rule.change.split(" ")[0] in row, row
    for minor, pins in releases().items():
        assert any(r.startswith(f"| {minor} | {pins.kubernetes} | {pins.etcd} |") for r in rows), minor


def test_a_bad_version_on_the_command_line_is_one_line_and_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Not argparse's forty-option usage first: the error, then where the options are; exit status 2."""
    from pytest_devplug import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["conformance", "--kubernetes-version", "1.99"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "devplug conformance: error: argument --kubernetes-version: '1.99': Kubernetes '1.99' is not a supported "
        "version; choose one of 1.34 (v1.34.4), 1.35 (v1.35.4), 1.36 (v1.36.3), 1.37 (v1.37.2), 1.38 (v1.38.0-beta.0)",
        "(`devplug conformance --help` lists the options)",
    ], err
