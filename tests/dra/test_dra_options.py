"""The DRA options and ``devplug conformance --dra`` refuse what cannot work, naming the input and the way out."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_devplug import cli
from pytest_devplug.backends.base import BackendOptions
from pytest_devplug.errors import UnsupportedOperationError
from pytest_devplug.backends.dra import DriverSpec, dra_of
from pytest_devplug.backends.sim import SimBackend

pytest_plugins = ["pytester"]


def test_dra_refuses_the_embedded_control_plane_or_a_control_plane_on_kind(capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--control-plane", "embedded"], ["--backend", "kind", "--control-plane", "real"]):
        assert cli.main(["conformance", "--dra", "--driver-cmd", "x", *flags]) == int(pytest.ExitCode.USAGE_ERROR)
        assert "--dra runs DRA drivers on the embedded kubelet with the real control plane" in capsys.readouterr().err


def test_dra_without_a_driver_and_without_the_included_plugin_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("pytest_devplug.plugin.included_plugin_installed", lambda: False)
    assert cli.main(["conformance", "--dra"]) == int(pytest.ExitCode.USAGE_ERROR)
    err = capsys.readouterr().err
    assert "no --driver-cmd was given" in err and "pip install 'pytest-devplug[gpu-plugin]'" in err


def test_the_embedded_control_plane_has_no_dra_side_and_says_why() -> None:
    with pytest.raises(UnsupportedOperationError, match="--devplug-control-plane real"):
        dra_of(SimBackend(BackendOptions()))


def test_a_command_with_a_directory_placeholder_runs_with_flags_not_standard_paths() -> None:
    assert DriverSpec(argv=["./plugin"]).uses_standard_paths()
    assert not DriverSpec(argv=["./plugin", "--registry", "{plugins_registry}"]).uses_standard_paths()
    assert not DriverSpec(argv=["./plugin"], env={"CDI_ROOT": "{cdi_root}"}).uses_standard_paths()
    assert DriverSpec(argv=["./plugin", "{plugins_dir}"], standard_paths=True).uses_standard_paths()


def test_driver_spec_fills_its_placeholders_in_one_pass() -> None:
    spec = DriverSpec(
        argv=[
            "{python}",
            "d.py",
            "--registry={plugins_registry}",
            "{plugins_dir}",
            "{cdi_root}",
            "{node_name}",
            "--kubeconfig",
            "{kubeconfig}",
            "--state",
            "{mock_state}",
            "{other}",
        ],
        env={"CDI_ROOT": "{cdi_root}/x", "KEEP": "plain"},
    )
    dirs = {"plugins_registry": "/n/{node_name}/reg", "plugins_dir": Path("/n/p"), "cdi_root": "/n/cdi"}
    argv, env = spec.command(**dirs, node_name="n1", kubeconfig=Path("/n/kc"), mock_state=Path("/m/state.json"))
    # a value holding a placeholder's text is not filled again; an unknown placeholder is left as it is
    assert argv == [
        sys.executable,
        "d.py",
        "--registry=/n/{node_name}/reg",
        "/n/p",
        "/n/cdi",
        "n1",
        "--kubeconfig",
        "/n/kc",
        "--state",
        "/m/state.json",
        "{other}",
    ]
    assert env == {"CDI_ROOT": "/n/cdi/x", "KEEP": "plain"}
    assert spec.command(**dirs, node_name="n1", kubeconfig="/kc", mock_state=None)[0][9] == ""  # no mock: empty
    assert spec.argv[0] == "{python}"  # the spec itself keeps them


def test_driver_command_option_keeps_its_placeholders_for_the_node(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "from pytest_devplug.dra.plugin import get_dra_settings\n"
        "def test_argv(pytestconfig):\n"
        "    assert get_dra_settings(pytestconfig).driver.argv == ('{python}', 'd.py', '{plugins_registry}')\n"
    )
    pytester.runpytest("--devplug-driver-cmd", "{python} d.py {plugins_registry}").assert_outcomes(passed=1)


def test_bad_driver_command_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--devplug-driver-cmd", "'unclosed")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ['*--devplug-driver-cmd (ini devplug_driver_cmd) = "\'unclosed": No closing quotation*']
    )
