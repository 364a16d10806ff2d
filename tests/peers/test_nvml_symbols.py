"""Every NVML function NVIDIA's binaries call on the mock GPU node is one the mock NVML answers.

Each binary runs a few checks of its suite (registration, devices handed to a container, a health event) with the
dynamic loader tracing its bindings (``LD_DEBUG=bindings``, to files: ``LD_DEBUG_OUTPUT``); the NVML symbols it bound
must all be exported by the mock library, and none may be missing (``symbol lookup error``, the process dies with exit
127, which fails the checks and is quoted in their report). The trace lists exactly what the binary called, not the ~400
functions go-nvml declares (its executable leaves every one undefined, so ``nm`` of its imports would list them all).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_devplug.backends.mockstate import GPU_MODELS
from pytest_devplug.nvml.build import mock_library

from ..support import parse_junit, run_conformance
from .test_nvidia_dra import _command as dra_command
from .test_nvidia_dra import _env as dra_env

SUITE_TIMEOUT_S = 600
#: ld.so's line for a symbol bound into the NVML library:
#: "binding file X [0] to .../libnvidia-ml.so.1 [0]: normal symbol `nvmlInit_v2'".
_BOUND = re.compile(r"binding file .* to \S*libnvidia-ml\.so[.\d]* \[\d+\]: normal symbol `(nvml\w+)'")
_MISSING = re.compile(r"undefined symbol: (nvml\w+)")


def _mock_exports() -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(mock_library())], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split() and line.split()[-1].startswith("nvml")}


def _bound(trace_dir: Path) -> set[str]:
    names: set[str] = set()
    for f in trace_dir.glob("trace.*"):
        names |= set(_BOUND.findall(f.read_text(errors="replace")))
    return names


def _judge(what: str, trace_dir: Path, output: str, failed: list[str]) -> set[str]:
    __tracebackhide__ = True
    # from the process's own output: the trace also logs the optional functions go-nvml probes with dlsym and
    # does without (nvmlDeviceGetAddressingMode, older _vN names), which are no error
    missing = set(_MISSING.findall(output))
    assert not missing, f"{what} called NVML functions the mock lacks: {sorted(missing)}"
    bound = _bound(trace_dir)
    assert bound, (
        f"{what}: no NVML binding traced (LD_DEBUG_OUTPUT files: {sorted(p.name for p in trace_dir.iterdir())}):\n"
        f"{output}"
    )
    lacking = bound - _mock_exports()
    assert not lacking, f"{what} bound NVML functions the mock does not export: {sorted(lacking)}"
    assert not failed, f"{what}: checks failed while tracing:\n" + "\n".join(failed) + output
    return bound


@pytest.mark.parametrize("model", sorted(GPU_MODELS))
def test_nvidias_dra_driver_calls_only_what_the_mock_answers(
    model: str, peer_binary: Callable[[str], Path], tmp_path: Path
) -> None:
    """On every GPU model the mock has (it publishes each GPU's product name, architecture, brand, memory and MIG
    profiles as attributes)."""
    trace = tmp_path / "ld-trace"
    trace.mkdir()
    options = [*dra_command(peer_binary("gpu-kubelet-plugin")), "--gpu-model", model]
    at = options.index("--driver-env") + 1
    options[at] += f",LD_DEBUG=bindings,LD_DEBUG_OUTPUT={trace}/trace"
    result = run_conformance(
        options,
        ["-k", "registers_with or claim_prepared_and_container or claim_for_two"],
        tmp_path,
        timeout=SUITE_TIMEOUT_S,
    )
    bound = _judge("NVIDIA's DRA driver", trace, result.output, result.failed)
    # what it publishes for every GPU: the calls the mock gained for it
    assert {"nvmlDeviceGetArchitecture", "nvmlDeviceGetBrand", "nvmlDeviceGetCudaComputeCapability"} <= bound, sorted(
        bound
    )


@pytest.mark.parametrize("model", sorted(GPU_MODELS))
def test_nvidias_device_plugin_calls_only_what_the_mock_answers(
    model: str, peer_binary: Callable[[str], Path], tmp_path: Path
) -> None:
    trace = tmp_path / "ld-trace"
    trace.mkdir()
    binary = peer_binary("nvidia-device-plugin")
    options = [
        "--plugin-cmd",
        f"{binary} --device-discovery-strategy nvml",
        "--mock",
        "--gpu-model",
        model,
        "--plugin-env",
        f"LD_DEBUG=bindings,LD_DEBUG_OUTPUT={trace}/trace",
    ]
    result = run_conformance(
        options,
        ["-k", "registers_its_resource or allocate_injections or critical_xid"],
        tmp_path,
        timeout=SUITE_TIMEOUT_S,
    )
    bound = _judge("NVIDIA's device plugin", trace, result.output, result.failed)
    assert {"nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2"} <= bound, sorted(bound)  # its health checks


#: NVIDIA's ComputeDomain kubelet plugin (``compute-domain-kubelet-plugin``, the same tarball), as its chart's
#: ``compute-domains`` container starts it with the default values: ``compute-domain-kubelet-plugin -v 4`` and this
#: environment (NODE_NAME is the harness's).
CD_DRIVER = "compute-domain.nvidia.com"
CD_CHART_ENV = {
    "HTTP_ENDPOINT": ":8081",
    "METRICS_PATH": "/metrics",
    "LOG_VERBOSITY": "4",
    "MASK_NVIDIA_DRIVER_PARAMS": "false",
    "NVIDIA_DRIVER_ROOT": "/",
    "NVIDIA_VISIBLE_DEVICES": "void",
    "CDI_ROOT": "/var/run/cdi",
    "NVIDIA_MIG_CONFIG_DEVICES": "all",
    "NAMESPACE": "dra-driver-nvidia-gpu",
    "KUBELET_REGISTRAR_DIRECTORY_PATH": "/var/lib/kubelet/plugins_registry",
    "KUBELET_PLUGINS_DIRECTORY_PATH": "/var/lib/kubelet/plugins",
    "HEALTHCHECK_PORT": "51515",
}
#: Chart values that differ on the mock GPU node: the ports, as for the GPU plugin (one network namespace);
#: ``featureGates`` IMEXDaemonsWithDNSNames and ComputeDomainCliques off, as the plugin itself advises for a driver
#: older than 570.158.01 (the mock's is 550.54.15); and ``altProcDevices``, the chart's value for mock NVML on a node
#: without NVIDIA's kernel modules: a ``/proc/devices`` naming ``nvidia-caps-imex-channels``, whose major the plugin
#: puts in its IMEX channels' device nodes (written per test: ALT_PROC_DEVICES_PATH).
CD_SIM_VALUES = {
    "HTTP_ENDPOINT": "",
    "HEALTHCHECK_PORT": "0",
    "FEATURE_GATES": "IMEXDaemonsWithDNSNames=false,ComputeDomainCliques=false",
}
#: The major the kernel module registers for ``nvidia-caps-imex-channels`` (dynamic; gpunode's nvidia-caps has 511).
IMEX_CHANNELS_MAJOR = 510
#: What the mock NVML's fabric answers (mock_nvml.c): the Hopper and newer models are on an NVLink fabric, one
#: cluster and clique; the A100s answer NOT_SUPPORTED.
FABRIC_CLUSTER, FABRIC_CLIQUE = "f2a3b4c5-d6e7-4f80-9a1b-2c3d4e5f6a7b", 1
FABRIC_MODELS = {"h100-80gb", "h200-141gb", "b200"}
CD_GPUS = 2
#: Run inside a pytest run against the plugin on the real control plane (the API server serves its CRDs): the CRDs
#: its chart installs first (its informer waits until ComputeDomains are served, and publishes nothing before), then
#: ``devplug_driver`` (registered with the kubelet, its ResourceSlice published).
COMPUTE_DOMAIN_CHECK = """
import re
from pathlib import Path

import yaml
from kubernetes import config

from pytest_devplug.kuberest import KubeRest, RestError
from pytest_devplug.waiting import wait_for

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def _established(rest, name):
    conditions = rest.get(f"{{CRDS}}/{{name}}").get("status", {{}}).get("conditions") or []
    return {{c["type"]: c["status"] for c in conditions}}.get("Established") == "True"


def test_compute_domain_plugin(devplug_cluster, request):
    rest = KubeRest(config.new_client_from_config(devplug_cluster.kubeconfig), 30)
    for crd in sorted(Path({crds!r}).glob("*.yaml")):
        name = rest.create(CRDS, yaml.safe_load(crd.read_text()))["metadata"]["name"]
        wait_for(lambda: _established(rest, name), bool, timeout=60, what=f"the CRD {{name}} Established",
                 retry_on=(RestError,))
    driver = request.getfixturevalue("devplug_driver")
    # without a ComputeDomain it publishes its daemon device and IMEX channel 0
    # (the other channels are the controller's)
    assert sorted(d for s in driver.slices() for d in s.devices) == ["channel-0", "daemon-0"], driver.slices()
    log = driver.log()
    cliques = re.findall(r"identified fabric clique UUID/ID \\(device (\\d+)/GPU-[^)]*\\): (\\S+)", log)
    no_fabric = re.findall(r"no-clique fallback: NVLink fabric not supported by driver \\(device (\\d+)/", log)
    want = {fabric!r}
    if want:
        assert cliques == [(str(i), want) for i in range({gpus})], (
            f"clique IDs {{cliques}}, not {{want}} for each GPU:\\n{{log[-3000:]}}")
    else:
        assert (cliques, no_fabric) == ([], [str(i) for i in range({gpus})]), (
            f"fabric on a GPU without NVLink fabric:\\n{{log[-3000:]}}")
"""


def _proc_devices_with_imex_channels(host: str) -> str:
    """``host`` (a ``/proc/devices`` text) with ``nvidia-caps-imex-channels`` among its character devices."""
    head, sep, tail = host.partition("\nBlock devices:")
    assert sep, f"/proc/devices without a 'Block devices:' section:\n{host}"
    return f"{head.rstrip()}\n{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n{sep}{tail}"


@pytest.mark.parametrize("model", sorted(GPU_MODELS))
def test_nvidias_compute_domain_plugin_calls_only_what_the_mock_answers(
    model: str, peer_binary: Callable[[str], Path], tmp_path: Path
) -> None:
    """It starts on every GPU model, registers and publishes its devices, and takes the node's clique ID from the
    mock's NVLink fabric (``<cluster UUID>.<clique ID>`` on H100, H200, B200; no clique on an A100, whose NVML has no
    fabric). Without a ComputeDomain (its controller and IMEX daemons) it prepares no claim: the DRA suite's claim
    checks do not apply."""
    binary = peer_binary("compute-domain-kubelet-plugin")
    trace = tmp_path / "ld-trace"
    trace.mkdir()
    proc_devices = tmp_path / "alt-proc-devices"
    proc_devices.write_text(_proc_devices_with_imex_channels(Path("/proc/devices").read_text()))
    fabric = f"{FABRIC_CLUSTER}/{FABRIC_CLIQUE}" if model in FABRIC_MODELS else ""  # as it logs each GPU's
    check = COMPUTE_DOMAIN_CHECK.format(crds=str(binary.parents[1] / "crds"), fabric=fabric, gpus=CD_GPUS)
    (tmp_path / "test_compute_domain.py").write_text(check)
    env = {
        **CD_CHART_ENV,
        **CD_SIM_VALUES,
        "ALT_PROC_DEVICES_PATH": str(proc_devices),
        "LD_DEBUG": "bindings",
        "LD_DEBUG_OUTPUT": f"{trace}/trace",
    }
    junit = tmp_path / "junit.xml"
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        f"--junitxml={junit}",
        "test_compute_domain.py",
        "--devplug-control-plane",
        "real",
        "--devplug-mock",
        "--devplug-gpu-model",
        model,
        "--devplug-gpus",
        str(CD_GPUS),
        "--devplug-driver-cmd",
        f"{binary} -v 4",
        "--devplug-driver-name",
        CD_DRIVER,
        "--devplug-driver-env",
        dra_env(env),
    ]
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S, check=False)
    output = (done.stdout + done.stderr)[-8000:]
    result = parse_junit(junit) if junit.exists() else None
    assert result is not None, f"pytest exited {done.returncode} without a junit report:\n{output}"
    bound = _judge("NVIDIA's ComputeDomain kubelet plugin", trace, output, result.failed)
    assert result.passed == ["test_compute_domain_plugin"], f"skipped: {result.skipped}\n{output}"
    # the node's clique ID: the calls the mock gained for it
    assert "nvmlDeviceGetGpuFabricInfo" in bound, sorted(bound)
