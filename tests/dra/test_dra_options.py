"""The DRA options and ``devplug conformance --dra`` refuse what cannot work, naming the input and the way out."""

from __future__ import annotations

import pytest

from pytest_devplug import cli
from pytest_devplug.backends.base import BackendOptions, UnsupportedOperationError
from pytest_devplug.backends.dra import DriverSpec, dra_of
from pytest_devplug.backends.sim import SimBackend

pytest_plugins = ["pytester"]


def test_dra_refuses_another_backend_or_the_embedded_control_plane(capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--control-plane", "embedded"], ["--backend", "kind"]):
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


def test_bad_driver_command_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--devplug-driver-cmd", "'unclosed")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--devplug-driver-cmd (ini devplug_driver_cmd) = \"'unclosed\": No closing quotation*"])
