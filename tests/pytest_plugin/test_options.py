"""Options are parsed once, in ``pytest_configure``: a bad value is one usage error at start (exit 4, one line
naming the option and what it accepts), never an error per test; the settings live in the config's stash."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

#: Three tests that use the settings (fixture, disruptive setup) and one that uses none.
TESTS = """
import pytest

def test_plain():
    pass

def test_settings(devplug_settings):
    assert devplug_settings.backend == "sim"

@pytest.mark.devplug_disruptive
def test_disruptive():
    pass
"""


@pytest.mark.parametrize(
    "args, ini, names",
    [
        ([], "devplug_conventions = ids-visible,nope", ["devplug_conventions", "nope", "ids-visible"]),
        ([], "devplug_backend = bogus", ["devplug_backend", "'bogus'", "sim, kind, cluster"]),
        ([], "devplug_timeout = soon", ["devplug_timeout", "'soon'", "a number"]),
        ([], "devplug_gpus = 2.5", ["devplug_gpus", "'2.5'", "an integer"]),
        ([], "devplug_missing_faults = maybe", ["devplug_missing_faults", "skip, fail"]),
        (["--devplug-plugin-cmd", "'unclosed"], "", ["--devplug-plugin-cmd", "quotation"]),
        (["--devplug-plugin-cmd", "  "], "", ["--devplug-plugin-cmd (ini devplug_plugin_cmd)", "empty command line"]),
        (["--devplug-driver-cmd", " "], "", ["--devplug-driver-cmd (ini devplug_driver_cmd)", "empty command line"]),
        (["--devplug-resource-name", "nvidia.com/gpu,nvidia.com/gpu"], "", ["--devplug-resource-name", "each once"]),
        (["--devplug-plugin-env", "DP_A=1,oops"], "", ["--devplug-plugin-env", "'oops' is not KEY=VALUE"]),
        (
            ["--devplug-pci-node", "nope.yaml"],
            "",
            ["--devplug-pci-node", "nope.yaml: No such file", "rdma-connectx, sriov-iavf, sriov-mlx5-rdma, sriov-vfio"],
        ),
        (
            ["--devplug-pci-node", "sriov-iavf", "--devplug-backend", "kind"],
            "",
            ["--devplug-pci-node", "the embedded kubelet's"],
        ),
        (
            [],
            "devplug_plugin_env = 1X=2",
            ["devplug_plugin_env", "'1X=2' is not KEY=VALUE", "not starting with a digit"],
        ),
        ([], "devplug_gpu_model = v100", ["devplug_gpu_model", "unknown GPU model 'v100'", "h100-80gb, h200-141gb"]),
        (
            ["--devplug-gpu-model", "h100-80gb", "--devplug-mig", "1g.5gb"],
            "",
            ["--devplug-mig", "(h100-80gb) have 1g.10gb"],
        ),
        (
            ["--devplug-driver-env", "A=1,B"],
            "",
            ["--devplug-driver-env (ini devplug_driver_env)", "'B' is not KEY=VALUE"],
        ),
        ([], "devplug_resource_name = nvidia.com/gpu,", ["devplug_resource_name", "each once"]),
        ([], "devplug_resource_name = a.com/x,b.com/y,c.com/z", ["devplug_resource_name", "at most two resources"]),
        (["--devplug-mig", "1g.6gb"], "", ["--devplug-mig", "'1g.6gb'", "unknown MIG profile", "1g.5gb, 1g.5gb+me"]),
        ([], "devplug_mig = 7g.40gb,1g.5gb", ["devplug_mig", "do not fit on one GPU: 8 of 7 compute slices"]),
        (
            [],
            "devplug_kubernetes_version = 1.33",
            ["devplug_kubernetes_version", "'1.33'", "1.35 (v1.35.4)", "1.37 (v1.37.2)"],
        ),
        (
            [],
            "devplug_kubernetes_version = 1.37.x",
            ["devplug_kubernetes_version", "'1.37.x'", "not a supported version"],
        ),
        (
            ["--devplug-feature-gates", "NoSuchGate=true"],
            "",
            ["--devplug-feature-gates", "unrecognized feature gate: NoSuchGate"],
        ),
        (
            ["--devplug-feature-gates", "DRAExtendedResource=false"],
            "",
            [
                "devplug_feature_gates",
                "cannot set feature gate DRAExtendedResource to false, feature is locked to true",
            ],
        ),
        (
            ["--devplug-feature-gates", "DRADeviceTaints=false"],
            "",
            ["DRADeviceTaintRules is enabled, but depends on features that are disabled: [DRADeviceTaints]"],
        ),
        (
            [],
            "devplug_feature_gates = ResourceHealthStatus",
            ["devplug_feature_gates", "missing bool value for ResourceHealthStatus"],
        ),
        (
            ["--devplug-kubernetes-version", "1.35", "--devplug-feature-gates", "ResourceHealthStatusMessage=true"],
            "",
            ["Kubernetes 1.35: unrecognized feature gate: ResourceHealthStatusMessage"],
        ),
    ],
)
def test_bad_value_is_one_usage_error_at_start(
    pytester: pytest.Pytester, args: list[str], ini: str, names: list[str]
) -> None:
    pytester.makepyfile(TESTS)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.errlines
    for name in names:
        assert name in errors[0], errors[0]
    assert "passed" not in result.stdout.str() and "Traceback" not in result.stderr.str()


@pytest.mark.parametrize(
    "args",
    [
        ["--devplug-backend", "bogus", "sim, kind, cluster"],
        ["--devplug-timeout", "soon", "a number"],
        ["--devplug-conventions", "bogus", "ids-visible, nvidia-env, numa-packing"],
        ["--devplug-gpu-model", "v100", "h100-80gb, h200-141gb"],
        ["--devplug-kubernetes-version", "1.33", "1.35 (v1.35.4)"],
    ],
)
def test_bad_command_line_value_is_refused_by_the_parser(pytester: pytest.Pytester, args: list[str]) -> None:
    """A value the option's check refuses stops the command line's parsing (``devplug conformance`` refuses it
    alike: ``test_option_table.py``), saying the option, the value and what it accepts."""
    pytester.makepyfile(TESTS)
    flag, value, accepted = args
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", flag, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any(flag in line and value in line and accepted in line for line in result.errlines), result.errlines


def test_settings_are_parsed_once(pytester: pytest.Pytester) -> None:
    """Header, disruptive setup and fixture read the one object ``pytest_configure`` made."""
    pytester.makeconftest(
        """
import pytest_devplug.settings as settings

calls = []
real = settings.settings_from_config

def counting(config):
    calls.append(1)
    return real(config)

settings.settings_from_config = counting

def pytest_unconfigure(config):
    print("settings parsed", len(calls), "time(s)")
"""
    )
    pytester.makepyfile(TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--devplug-reregistration-timeout", "5")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*settings parsed 1 time(s)*"])


def test_reregistration_bound_is_never_below_the_timeout(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
def test_bounds(devplug_settings):
    opts = devplug_settings.backend_options
    assert (opts.timeout, opts.reregistration_timeout) == (60.0, 60.0)
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--devplug-timeout", "60")
    result.assert_outcomes(passed=1)


def test_several_resource_names_declare_extra_resources(pytester: pytest.Pytester) -> None:
    """``--devplug-resource-name a,b``: ``a`` is the resource the single-resource checks judge, ``b`` an extra one,
    which the included plugin serves from half its GPUs (``--second-resource``)."""
    pytester.makepyfile(
        """
def test_spec(devplug_settings):
    spec = devplug_settings.plugin
    assert (spec.resource_name, spec.extra_resource_names) == ("nvidia.com/gpu", ("example.com/gpu-half",))
    assert list(spec.argv[-2:]) == ["--second-resource", "example.com/gpu-half=3"]
"""
    )
    result = pytester.runpytest_inprocess(
        "-p",
        "no:cacheprovider",
        "--devplug-resource-name",
        "nvidia.com/gpu, example.com/gpu-half",
        "--devplug-gpus",
        "7",
    )
    result.assert_outcomes(passed=1)


def test_plugin_env_reaches_the_spec_with_its_placeholders(pytester: pytest.Pytester) -> None:
    """``--devplug-plugin-env``: KEY=VALUE pairs (a value may hold '='), placeholders left for the node to fill."""
    pytester.makepyfile(
        """
def test_env(devplug_settings):
    assert dict(devplug_settings.plugin.env) == {"DP_REGISTRATION": "plugins_registry",
                                                 "DP_KUBELET_REGISTRAR_DIR": "{plugins_registry}", "X": "a=b"}
"""
    )
    env = "DP_REGISTRATION=plugins_registry, DP_KUBELET_REGISTRAR_DIR={plugins_registry},X=a=b"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--devplug-plugin-env", env)
    result.assert_outcomes(passed=1)


def test_driver_env_reaches_the_driver_spec_with_escaped_commas(pytester: pytest.Pytester) -> None:
    """``--devplug-driver-env``: a chart's environment, ``\\,`` a comma inside a value
    (FEATURE_GATES=A=true,B=false)."""
    pytester.makepyfile(
        """
def test_env(devplug_driver_spec):
    assert dict(devplug_driver_spec.env) == {"CDI_ROOT": "/var/run/cdi", "FEATURE_GATES": "A=true,B=false", "EMPTY": ""}
"""
    )
    env = r"CDI_ROOT=/var/run/cdi,FEATURE_GATES=A=true\,B=false,EMPTY="
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--devplug-driver-cmd", "my-driver", "--devplug-driver-env", env
    )
    result.assert_outcomes(passed=1)


def test_gpu_model_reaches_the_plugin_and_the_driver(pytester: pytest.Pytester) -> None:
    """``--devplug-gpu-model`` sets the mock GPUs of both the device plugin and a DRA driver, and the state they get."""
    pytester.makepyfile(
        """
from pytest_devplug.backends import mockstate

def test_model(devplug_settings, devplug_driver_spec):
    assert devplug_settings.plugin.gpu_model == devplug_driver_spec.gpu_model == "h100-80gb"
    assert devplug_driver_spec.mig == devplug_settings.plugin.mig == ("1g.10gb",)
    state = mockstate.initial_state(1, 1, devplug_settings.plugin.mig, devplug_settings.plugin.gpu_model)
    assert state["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
"""
    )
    result = pytester.runpytest_inprocess(
        "-p",
        "no:cacheprovider",
        "--devplug-gpu-model",
        "h100-80gb",
        "--devplug-mig",
        "1g.10gb",
        "--devplug-driver-cmd",
        "my-driver",
    )
    result.assert_outcomes(passed=1)
