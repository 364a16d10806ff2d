"""Every NVML function NVIDIA's binaries call on the mock GPU node is one the mock NVML answers.

Each binary runs a few checks of its suite (registration, devices handed to a container, a health event) with the
dynamic loader tracing its bindings (``LD_DEBUG=bindings``, to files: ``LD_DEBUG_OUTPUT``); the NVML symbols it bound
must all be exported by the mock library, and none may be missing (``symbol lookup error``, the process dies with
exit 127, which fails the checks and is quoted in their report). The trace lists exactly what the binary called, not the ~400 functions go-nvml declares (its executable
leaves every one undefined, so ``nm`` of its imports would list them all).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_devplug.backends.mockstate import GPU_MODELS
from pytest_devplug.nvml.build import mock_library

from ..support import run_conformance
from .test_nvidia_dra import _command as dra_command

SUITE_TIMEOUT_S = 600
#: ld.so's line for a symbol bound into the NVML library: "binding file X [0] to .../libnvidia-ml.so.1 [0]: normal symbol `nvmlInit_v2'".
_BOUND = re.compile(r"binding file .* to \S*libnvidia-ml\.so[.\d]* \[\d+\]: normal symbol `(nvml\w+)'")
_MISSING = re.compile(r"undefined symbol: (nvml\w+)")


def _mock_exports() -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(mock_library())], capture_output=True, text=True, check=True).stdout
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
    assert bound, f"{what}: no NVML binding traced (LD_DEBUG_OUTPUT files: {sorted(p.name for p in trace_dir.iterdir())}):\n{output}"
    lacking = bound - _mock_exports()
    assert not lacking, f"{what} bound NVML functions the mock does not export: {sorted(lacking)}"
    assert not failed, f"{what}: checks failed while tracing:\n" + "\n".join(failed) + output
    return bound


@pytest.mark.parametrize("model", sorted(GPU_MODELS))
def test_nvidias_dra_driver_calls_only_what_the_mock_answers(model: str, peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    """On every GPU model the mock has (it publishes each GPU's product name, architecture, brand, memory and MIG
    profiles as attributes)."""
    trace = tmp_path / "ld-trace"
    trace.mkdir()
    options = [*dra_command(peer_binary("gpu-kubelet-plugin")), "--gpu-model", model]
    at = options.index("--driver-env") + 1
    options[at] += f",LD_DEBUG=bindings,LD_DEBUG_OUTPUT={trace}/trace"
    result = run_conformance(options, ["-k", "registers_with or claim_prepared_and_container or claim_for_two"], tmp_path,
                             timeout=SUITE_TIMEOUT_S)  # fmt: skip
    bound = _judge("NVIDIA's DRA driver", trace, result.output, result.failed)
    # what it publishes for every GPU: the calls the mock gained for it
    assert {"nvmlDeviceGetArchitecture", "nvmlDeviceGetBrand", "nvmlDeviceGetCudaComputeCapability"} <= bound, sorted(bound)


@pytest.mark.parametrize("model", sorted(GPU_MODELS))
def test_nvidias_device_plugin_calls_only_what_the_mock_answers(model: str, peer_binary: Callable[[str], Path], tmp_path: Path) -> None:
    trace = tmp_path / "ld-trace"
    trace.mkdir()
    binary = peer_binary("nvidia-device-plugin")
    options = ["--plugin-cmd", f"{binary} --device-discovery-strategy nvml", "--mock", "--gpu-model", model,
               "--plugin-env", f"LD_DEBUG=bindings,LD_DEBUG_OUTPUT={trace}/trace"]  # fmt: skip
    result = run_conformance(options, ["-k", "registers_its_resource or allocate_injections or critical_xid"], tmp_path,
                             timeout=SUITE_TIMEOUT_S)  # fmt: skip
    bound = _judge("NVIDIA's device plugin", trace, result.output, result.failed)
    assert {"nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2"} <= bound, sorted(bound)  # its health checks


