"""pytest entry point of pytest-devplug: the ``devplug`` option group, ini keys, fixtures, markers, report sections.

Fixtures, from widest to narrowest:

- ``devplug_cluster`` (session): the cluster (``--devplug-backend``), torn down at the end.
- ``devplug_plugin_spec`` (session): what to deploy; override it in a ``conftest.py`` to point at your plugin.
- ``devplug_node`` (session): the node that carries the resource.
- ``devplug_plugin`` (function): the deployed plugin, deployed once per session and redeployed with a
  fresh mock state after any test that changed it (faults, stop/kill/restart), so tests stay isolated
  without paying a deployment each.
- ``devplug_faults`` (function): the :class:`~pytest_devplug.faults.FaultInjector` for the plugin; override it
  in a ``conftest.py`` for a plugin that is not on the mock NVML.
- ``devplug_pod`` (function): a pod factory pinned to that node; deletes its pods after the test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import sys
import time
import warnings
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

from .backends import BACKENDS, create_backend, mockstate
from .backends.base import (
    DEFAULT_GRACE_PERIOD,
    DEFAULT_REREGISTRATION_TIMEOUT,
    DEFAULT_RESOURCE_NAME,
    DEFAULT_TIMEOUT,
    Backend,
    BackendOptions,
    BackendUnavailableError,
    NodeSpec,
    PluginSpec,
    UnsupportedOperationError,
)
from .assertions import assert_registered
from .evidence import DevplugAssertionError, Evidence, collect_evidence, set_test_window
from .faults import CONTRACT, FaultInjector, MockNvmlFaults, NvmlXidFaults
from .handles import ClusterHandle, NodeHandle, PluginChanges, PluginHandle, PodFactory
from .kubeletmodel.releases import DEFAULT_VERSION, KubeVersion, VersionError, release, releases
from .report import ReportWriter, is_dra_run, note_plugin, note_run
from .soak import DEFAULT_SOAK_S, SOAK_MARKER, SoakWatch

__all__ = [
    "DevplugSettings",
    "settings_from_config",
    "get_settings",
    "default_plugin_argv",
    "NODE_NAME",
    "NO_PLUGIN_MESSAGE",
    "DISRUPTIVE_MARKER",
    "GRACE_PERIOD_MARKER",
    "CONVENTION_MARKER",
    "CONVENTIONS",
    "DevplugWarning",
    "PluginNotReadyError",
]

#: The node the default fixtures deploy on.
NODE_NAME = "devplug-node"
DISRUPTIVE_MARKER = "devplug_disruptive"
GRACE_PERIOD_MARKER = "devplug_grace_period"
CONVENTION_MARKER = "devplug_convention"

#: Opt-in checks of conventions some plugin families follow and the kubelet does not require.
#: The included plugin follows all of them, so its run switches them all on.
CONVENTIONS: dict[str, str] = {
    "ids-visible": "every assigned device ID appears in what Allocate injected, and no other device's ID does",
    "nvidia-env": "NVIDIA_VISIBLE_DEVICES lists the assigned IDs and /dev/nvidia<minor> is injected (NVIDIA's envvar strategy)",
    "numa-packing": "GetPreferredAllocation packs a request onto one NUMA node, filling one node before the next",
    "nvml-xid": "on the mock NVML, a critical Xid makes every device backed by that GPU Unhealthy and the "
    "application-error Xids leave it Healthy (NVML health monitoring)",
    "rolling-update": "a second instance of the plugin started beside the running one (a DaemonSet rollout with "
    "maxSurge) takes over its resource with no moment at 0 allocatable, and the first one's exit leaves it registered",
    "exclusive-devices": "each device is one container's alone: no device node injected for one device reaches a "
    "container holding another (nodes every container gets, such as a control node, aside); a plugin that shares a "
    "device by design (time-slicing, a scheduling budget) does not declare it",
}

#: Values of ``--devplug-control-plane``.
CONTROL_PLANES = ("embedded", "real")

S = TypeVar("S")
_STATE_KEY = pytest.StashKey["_TestState"]()
#: The options as parsed once, in ``pytest_configure``.
_SETTINGS_KEY = pytest.StashKey["DevplugSettings"]()
#: The plugin the report header showed (None: it said a conftest overrides devplug_plugin_spec).
_HEADER_SPEC_KEY = pytest.StashKey["PluginSpec | None"]()


@dataclass(frozen=True)
class DevplugSettings:
    """The resolved options (command line first, then ini keys, then defaults)."""

    backend: str
    backend_options: BackendOptions
    plugin: PluginSpec
    missing_faults: str  # "skip" or "fail"
    included_plugin: bool = False  # no plugin option given: the included GPU plugin is the one under test
    #: Whether @devplug_disruptive tests run (cluster backend: only with --devplug-allow-disruptive).
    allow_disruptive: bool = True
    #: Device nodes the node under test has (``--devplug-device-nodes``; sim: stubs in the plugin's namespace).
    device_nodes: tuple[str, ...] = ()
    #: Seconds the long-lived connection check holds its registration (``--devplug-soak``; 0: off).
    soak: float = DEFAULT_SOAK_S
    #: The mock PCI/NIC node file of the node under test (``--devplug-pci-node``; sim).
    pci_node: str | None = None


#: Why there is nothing to test: no plugin option, and the included plugin (its own distribution) is absent.
NO_PLUGIN_MESSAGE = (
    "no device plugin to test: no --devplug-plugin-cmd (devplug conformance: --plugin-cmd) was given, and the "
    "included GPU plugin is not installed (it is the separate distribution devplug-gpu-plugin). Either install "
    "it: pip install 'pytest-devplug[gpu-plugin]', or point at your plugin: --devplug-plugin-cmd "
    "\"{python} -m my_plugin --plugin-dir {plugin_dir}\" --devplug-resource-name example.com/widget"
)


def included_plugin_installed() -> bool:
    """Whether the included GPU plugin can be started here (``python -m devplug_gpu_plugin``)."""
    return importlib.util.find_spec("devplug_gpu_plugin") is not None


def default_plugin_argv(
    resource_name: str, *, pre_start_required: bool = True, second_resource: tuple[str, int] | None = None
) -> list[str]:
    """The included GPU plugin on the mock NVML, with the harness's placeholders; ``second_resource``
    (name, GPUs) has it advertise that many of its GPUs as a second resource from the same process."""
    argv = [
        sys.executable, "-m", "devplug_gpu_plugin",
        "--plugin-dir", "{plugin_dir}", "--resource-name", resource_name,
        "--nvml", "mock", "--mock-state", "{mock_state}",
    ]  # fmt: skip
    if pre_start_required:
        argv.append("--pre-start-required")
    if second_resource is not None:
        argv += ["--second-resource", f"{second_resource[0]}={second_resource[1]}"]
    return argv


# -- options -------------------------------------------------------------------------------------

_OPTIONS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "backend",
        "where to run: sim (embedded kubelet), kind (a kind cluster it creates or reuses) or cluster "
        "(the kubeconfig's cluster, through the API only)",
        {"default": "sim", "choices": BACKENDS},
    ),
    (
        "plugin-cmd",
        "command line of the plugin under test (sim); placeholders {plugin_dir}, {plugins_registry}, {mock_state}, "
        "{python}. Default: the included GPU plugin on a mock NVML (pip install 'pytest-devplug[gpu-plugin]')",
        {},
    ),
    (
        "plugin-env",
        "environment of the plugin under test, KEY=VALUE pairs, comma-separated (sim: its process, placeholders as "
        "in --devplug-plugin-cmd; kind and cluster: every container of its DaemonSet; \\, is a comma in a value), e.g. "
        "DP_REGISTRATION=plugins_registry to have the included plugin register through the kubelet's plugin watcher",
        {},
    ),
    ("plugin-image", "container image of the plugin under test (kind, cluster)", {}),
    ("plugin-manifest", "manifest (DaemonSet) that deploys the plugin under test (kind)", {}),
    (
        "kind-config",
        "kind: cluster config, a path or a file name in kind-config/ (default $DEVPLUG_KIND_CONFIG, else single-node.yaml)",
        {},
    ),
    ("kube-context", "cluster: kubeconfig context (default: the current one; the file: --kubeconfig)", {}),
    (
        "node",
        "kind, cluster: the node to test on (default: the first node advertising the resource, else one labelled "
        "devplug.io/gpu=true)",
        {},
    ),
    (
        "second-node",
        "kind, cluster: a node beside --devplug-node where a check that needs a second node runs a copy of the "
        "plugin (the soak); without it that check skips saying so",
        {},
    ),
    (
        "plugin-daemonset",
        "cluster: NAMESPACE/NAME of a running plugin DaemonSet to test as it is, instead of deploying one",
        {},
    ),
    (
        "node-image",
        "cluster: image of the privileged node-operations pod (needs sh, nsenter, python3 + grpcio; "
        "default: the plugin image)",
        {},
    ),
    ("workload-image", "kind, cluster: image of the test pods (default busybox; any image with sh and sleep)", {}),
    (
        "resource-name",
        "extended resource the plugin advertises; several, comma-separated, for a plugin that advertises more than "
        "one from one process (the first is the one the single-resource checks judge; the included plugin takes two: "
        "half its GPUs, rounded down, become the second)",
        {"default": DEFAULT_RESOURCE_NAME},
    ),
    ("gpus", "GPUs in the mock NVML state", {"type": int, "default": 4}),
    ("numa-nodes", "NUMA nodes the mock GPUs are spread over, 0 = no topology", {"type": int, "default": 2}),
    (
        "gpu-model",
        "the mock GPUs' model, for what NVML answers (name, memory, PCI device ID, architecture, compute capability, "
        f"SMs, MIG profile names): one of {', '.join(mockstate.GPU_MODELS)}",
        {"default": mockstate.DEFAULT_GPU_MODEL},
    ),
    (
        "mig",
        "MIG devices on every mock GPU, comma-separated profiles (on the default a100-40gb: 1g.5gb, 1g.5gb+me, 1g.10gb, "
        "2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb; named for the model's memory, e.g. 1g.10gb on h100-80gb; e.g. "
        "1g.5gb,1g.5gb,2g.10gb): the mock GPUs are MIG-enabled, and what is advertised is the "
        "plugin's choice (NVIDIA's --mig-strategy single: nvidia.com/gpu, mixed: nvidia.com/mig-1g.5gb ...)",
        {},
    ),
    ("timeout", "seconds every bounded wait may take", {"type": float, "default": DEFAULT_TIMEOUT}),
    (
        "reregistration-timeout",
        "seconds a plugin may take to register again after a kubelet restart, at least --devplug-timeout "
        "(the kubelet's own dial may take 10 s, upstream-style plugins wait 10 s after a new kubelet.sock)",
        {"type": float, "default": DEFAULT_REREGISTRATION_TIMEOUT},
    ),
    (
        "grace-period",
        "sim: seconds the kubelet keeps a resource whose plugin went away",
        {"type": float, "default": DEFAULT_GRACE_PERIOD},
    ),
    (
        "control-plane",
        "sim: embedded (the harness's own API server and scheduler, default) or real (etcd, kube-apiserver, "
        "kube-scheduler and kube-controller-manager as child processes, the embedded kubelets its Nodes; "
        "kubectl works against devplug_cluster.kubeconfig)",
        {"default": "embedded"},
    ),
    (
        "kubernetes-version",
        f"the Kubernetes release to reproduce and judge against, one of {', '.join(releases())} (each a pinned patch "
        "release): sim: the embedded kubelet, API server and scheduler behave as it and the real control plane runs "
        f"its binaries; kind: nodes of it; kind and cluster: the nodes' own release is reported beside it (default "
        f"{DEFAULT_VERSION})",
        {},
    ),
    (
        "feature-gates",
        "feature gates over the release's defaults, as the components' --feature-gates takes them (e.g. "
        "DRADeviceTaints=false,ResourceHealthStatus=false); checked as that release checks them (unknown, locked, "
        "dependencies); sim: the embedded kubelet and control plane follow them and the real control plane gets them",
        {},
    ),
    (
        "k8s-bin-dir",
        "sim with --devplug-control-plane real: directory with etcd, kube-apiserver, kube-scheduler, "
        "kube-controller-manager (default: KUBEBUILDER_ASSETS, then the cache `devplug control-plane build` fills, "
        "then the release binaries, SHA-256 checked)",
        {},
    ),
    (
        "soak",
        "seconds the long-lived connection check holds one registration of a second copy of the plugin on a node "
        "of its own, overlapped with the other checks (0 switches the check off)",
        {"type": float, "default": DEFAULT_SOAK_S},
    ),
    (
        "device-nodes",
        "sim: device nodes the node has, comma-separated (e.g. /dev/ttyS0,/dev/widget0), for a plugin that scans "
        "/dev: stub character devices in the private mount namespace of a plugin started without {plugin_dir} "
        "(a mock-NVML node has the GPU's /dev/nvidia* anyway)",
        {},
    ),
    (
        "pci-node",
        "sim: a mock PCI/NIC node file (YAML: PCI functions with vendor/device/class, driver, NUMA node, PF/VF, IOMMU "
        "group, netdev and MAC, RDMA device), or the name of a shipped example (sriov-iavf, sriov-vfio, sriov-mlx5-rdma, "
        "rdma-connectx), "
        "shown to a plugin started without "
        "{plugin_dir}: its sysfs, pci.ids, device nodes and a network namespace with its netdevs (needs root)",
        {},
    ),
    (
        "report",
        "write a Markdown report of the run to this file (one row per check, grouped core / conventions / faults) "
        "and the same as JSON beside it (.json)",
        {},
    ),
    (
        "missing-faults",
        "what the fault-injection tests do when there is no fault injector (mock NVML or a conftest's "
        "devplug_faults fixture): skip (naming the contract to implement) or fail",
        {"choices": ("skip", "fail"), "default": "skip"},
    ),
    (
        "conventions",
        "opt-in checks of plugin-family conventions the kubelet does not require, comma-separated, or none: "
        + "; ".join(f"{k}: {v}" for k, v in CONVENTIONS.items())
        + ". Default: all for the included plugin (also from --devplug-plugin-image alone), none for "
        "--devplug-plugin-cmd/-manifest",
        {},
    ),
]


#: The kind cluster options. pytest-kind-ng (the ``kind`` extra) registers them itself; without it they are
#: registered here under the same names, so ``--help``, ini-free command lines and CI recipes stay the same.
_KIND_OPTIONS: list[tuple[str, str, dict[str, Any]]] = [
    ("--cluster-name", "kind: name of the cluster (default devplug)", {}),
    ("--keep-cluster", "kind: keep the cluster afterwards (the next run reuses it)", {"action": "store_true"}),
    ("--kubeconfig", "kind: where to write the cluster's kubeconfig", {}),
    ("--kind-image", "kind: node image (default: kind's standard image)", {}),
    ("--kind-bin", "kind: the kind binary (default: kind on PATH)", {}),
]


def add_options(parser: pytest.Parser, options: list[tuple[str, str, dict[str, Any]]]) -> Any:
    """Add ``--devplug-<name>`` options, each with an ini key ``devplug_<name>``, to the devplug group (returned)."""
    group = parser.getgroup("devplug", "device-plugin end-to-end tests (pytest-devplug)")
    for name, help_text, kw in options:
        dest = "devplug_" + name.replace("-", "_")
        default = kw.get("default")
        # The default lives in the ini key only (getoption None -> getini), so it is declared once, here.
        text = help_text if default is None else f"{help_text} (default {default:g})" if isinstance(default, float) \
            else f"{help_text} (default {default})"
        group.addoption(f"--devplug-{name}", dest=dest, default=None, help=text, **{k: v for k, v in kw.items() if k != "default"})
        parser.addini(dest, text, default=None if default is None else str(default))
    return group


def pytest_addoption(parser: pytest.Parser) -> None:
    if importlib.util.find_spec("pytest_kind") is None:
        kind = parser.getgroup("kind", "kind cluster (pytest-devplug; pip install 'pytest-devplug[kind]')")
        for flag, help_text, kw in _KIND_OPTIONS:
            kind.addoption(flag, default=None, help=help_text, **kw)
    group = add_options(parser, _OPTIONS)
    group.addoption(
        "--devplug-mock",
        dest="devplug_mock",
        action="store_true",
        default=None,
        help="the plugin under test reads the mock-NVML state file (fault controls available); "
        "default: yes for the included plugin (also from --devplug-plugin-image alone), no for --devplug-plugin-cmd/-manifest",
    )
    group.addoption("--devplug-no-mock", dest="devplug_mock", action="store_false", help="the plugin has no mock controls")
    parser.addini("devplug_mock", "see --devplug-mock", type="bool", default=None)
    group.addoption(
        "--devplug-pre-start-required",
        dest="devplug_pre_start_required",
        action="store_true",
        default=None,
        help="the plugin sets pre_start_required (default: yes for the included plugin, which is started so)",
    )
    parser.addini("devplug_pre_start_required", "see --devplug-pre-start-required", type="bool", default=None)
    group.addoption(
        "--devplug-allow-disruptive",
        dest="devplug_allow_disruptive",
        action="store_true",
        default=None,
        help=f"cluster: also run the @{DISRUPTIVE_MARKER} tests (kubelet restarts, plugin stop/kill, kubelet config "
        "changes on the node under test); always on for sim and kind, whose clusters are the harness's own",
    )
    parser.addini("devplug_allow_disruptive", "see --devplug-allow-disruptive", type="bool", default=None)


def _opt(config: pytest.Config, dest: str) -> Any:
    value = config.getoption(dest, default=None)
    if value is None:
        value = config.getini(dest)
    return None if value in ("", []) else value


def _kind_opt(config: pytest.Config, dest: str) -> Any:
    # pytest-kind-ng registers these; pytest -p no:pytest-kind-ng would leave them undefined.
    return config.getoption(dest, default=None)


def _flag(dest: str) -> str:
    """How the user names option ``dest``: its command-line flag and its ini key."""
    return f"--{dest.replace('_', '-')} (ini {dest})"


def _command_line(dest: str, value: object) -> list[str]:
    """Option ``dest``'s command line split as a shell would; a usage error naming the option when it cannot be."""
    try:
        words = shlex.split(str(value))
    except ValueError as exc:
        raise pytest.UsageError(f"{_flag(dest)} = {value!r}: {exc}") from None
    if not words:
        raise pytest.UsageError(f"{_flag(dest)} = {value!r}: empty command line")
    return words


def _choice(config: pytest.Config, dest: str, allowed: tuple[str, ...]) -> str:
    value = str(_opt(config, dest))
    if value not in allowed:
        raise pytest.UsageError(f"{_flag(dest)} = {value!r}: choose one of {', '.join(allowed)}")
    return value


def _number(config: pytest.Config, dest: str, kind: type[int] | type[float], minimum: float = 0) -> Any:
    value = _opt(config, dest)
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum:
        what = "an integer" if kind is int else "a number"
        raise pytest.UsageError(f"{_flag(dest)} = {value!r}: expected {what} >= {minimum:g}")
    return number


def _conventions(value: Any, default: frozenset[str]) -> frozenset[str]:
    if value is None:
        return default
    names = {n.strip() for n in str(value).split(",")} - {"", "none"}
    unknown = sorted(names - set(CONVENTIONS))
    if unknown:
        raise pytest.UsageError(
            f"{_flag('devplug_conventions')} = {value!r}: unknown {', '.join(unknown)}; "
            f"choose from {', '.join(CONVENTIONS)} or none (comma-separated)"
        )
    return frozenset(names)


def settings_from_config(config: pytest.Config) -> DevplugSettings:
    """Parse the options (command line first, then ini keys, then the defaults declared with them); a bad
    value raises :class:`pytest.UsageError` naming the option and what it accepts. ``pytest_configure``
    calls it once: read the result with :func:`get_settings`."""
    backend = _choice(config, "devplug_backend", BACKENDS)
    control_plane = _choice(config, "devplug_control_plane", CONTROL_PLANES)
    resource, *extra_resources = _resource_names(_opt(config, "devplug_resource_name"))
    cmd = _opt(config, "devplug_plugin_cmd")
    image = _opt(config, "devplug_plugin_image")
    manifest = _opt(config, "devplug_plugin_manifest")
    # An image without a manifest is deployed with the included plugin's own DaemonSet (its DP_* settings), so
    # it is the included plugin, built elsewhere (e.g. pushed to the cluster's registry): the same defaults.
    custom = bool(cmd or manifest)
    mock = _opt(config, "devplug_mock")
    mock = (not custom) if mock is None else bool(mock)
    pre_start = _opt(config, "devplug_pre_start_required")
    pre_start = (not custom) if pre_start is None else bool(pre_start)
    model = _gpu_model(_opt(config, "devplug_gpu_model"))
    if cmd:
        argv = _command_line("devplug_plugin_cmd", cmd)  # placeholders are filled when the plugin starts (PluginSpec.command)
    else:
        argv = default_plugin_argv(resource, pre_start_required=pre_start, second_resource=_included_second(config, extra_resources))
    spec = PluginSpec(
        resource_name=resource,
        extra_resource_names=tuple(extra_resources),
        argv=tuple(argv),
        image=image,
        manifest=manifest,
        mock=mock,
        gpus=_number(config, "devplug_gpus", int),
        numa_nodes=_number(config, "devplug_numa_nodes", int),
        mig=_mig(_opt(config, "devplug_mig"), model),
        gpu_model=model,
        pre_start_required=pre_start,
        env=_env_pairs("devplug_plugin_env", _opt(config, "devplug_plugin_env")),
        conventions=_conventions(_opt(config, "devplug_conventions"), frozenset() if custom else frozenset(CONVENTIONS)),
    )
    timeout = _number(config, "devplug_timeout", float)
    opts = BackendOptions(
        kube=_kube_version(config),
        kube_chosen=_opt(config, "devplug_kubernetes_version") is not None,
        timeout=timeout,
        reregistration_timeout=max(_number(config, "devplug_reregistration_timeout", float), timeout),
        grace_period=_number(config, "devplug_grace_period", float),
        control_plane=control_plane,
        k8s_bin_dir=_opt(config, "devplug_k8s_bin_dir"),
        cluster_name=str(_kind_opt(config, "cluster_name") or "pytest-kind"),
        keep_cluster=bool(_kind_opt(config, "keep_cluster")),
        kind_bin=_kind_opt(config, "kind_bin"),
        kind_image=_kind_opt(config, "kind_image"),
        kubeconfig=_kind_opt(config, "kubeconfig"),
        kind_config=_opt(config, "devplug_kind_config"),
        kube_context=_opt(config, "devplug_kube_context"),
        node=_opt(config, "devplug_node"),
        second_node=_opt(config, "devplug_second_node"),
        plugin_daemonset=_opt(config, "devplug_plugin_daemonset"),
        node_image=_opt(config, "devplug_node_image") or image,
        workload_image=_opt(config, "devplug_workload_image"),
    )
    pci_node = _pci_node(_opt(config, "devplug_pci_node"))
    if pci_node is not None and backend != "sim":
        raise pytest.UsageError(
            f"{_flag('devplug_pci_node')}: a mock PCI node is the embedded kubelet's (--devplug-backend sim); the nodes of "
            f"{backend} have the NICs they have"
        )
    allow = _opt(config, "devplug_allow_disruptive")
    allow_disruptive = backend != "cluster" if allow is None else bool(allow)
    return DevplugSettings(
        backend,
        opts,
        spec,
        _choice(config, "devplug_missing_faults", ("skip", "fail")),
        included_plugin=not custom,
        allow_disruptive=allow_disruptive,
        soak=_number(config, "devplug_soak", float),
        device_nodes=_device_nodes(_opt(config, "devplug_device_nodes")),
        pci_node=pci_node,
    )


def _kube_version(config: pytest.Config) -> KubeVersion:
    """The release (``--devplug-kubernetes-version``) and its feature gates (``--devplug-feature-gates``)."""
    version = _opt(config, "devplug_kubernetes_version") or DEFAULT_VERSION
    try:
        chosen = release(str(version))
    except VersionError as exc:
        raise pytest.UsageError(f"{_flag('devplug_kubernetes_version')} = {version!r}: {exc}") from None
    gates = _opt(config, "devplug_feature_gates")
    try:
        return KubeVersion.of(chosen.minor, str(gates or ""))
    except VersionError as exc:
        raise pytest.UsageError(f"{_flag('devplug_feature_gates')} = {gates!r}: {exc}") from None


def _resource_names(value: Any) -> list[str]:
    names = [n.strip() for n in str(value).split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise pytest.UsageError(
            f"{_flag('devplug_resource_name')} = {value!r}: expected one resource name or several, comma-separated, "
            "each once (e.g. nvidia.com/gpu,nvidia.com/mig-1g.5gb)"
        )
    return names


def _included_second(config: pytest.Config, extra: list[str]) -> tuple[str, int] | None:
    """The included plugin's ``--second-resource``: the second name and half the mock GPUs (rounded down)."""
    if not extra:
        return None
    gpus = _number(config, "devplug_gpus", int)
    if len(extra) > 1 or gpus < 2:
        raise pytest.UsageError(
            f"{_flag('devplug_resource_name')}: the included plugin advertises at most two resources, and needs 2+ "
            f"GPUs for two (--devplug-gpus {gpus}; resources {extra!r} beside the first)"
        )
    return extra[0], gpus // 2


def _gpu_model(value: Any) -> str:
    model = str(value or mockstate.DEFAULT_GPU_MODEL)
    try:
        mockstate.check_gpu_model(model)
    except ValueError as exc:
        raise pytest.UsageError(f"{_flag('devplug_gpu_model')} = {value!r}: {exc}") from None
    return model


def _mig(value: Any, model: str) -> tuple[str, ...]:
    profiles = tuple(p.strip() for p in str(value or "").split(",") if p.strip())
    try:
        mockstate.check_mig_profiles(profiles, model)
    except ValueError as exc:
        raise pytest.UsageError(f"{_flag('devplug_mig')} = {value!r}: {exc}") from None
    return profiles


def _pci_node(value: Any) -> str | None:
    """The PCI node file, checked now (a bad file is a usage error naming it), read again by the backend."""
    if not value:
        return None
    from .pcinodes import EXAMPLES, example
    from .sim.pcinode import PciNodeError, load_pci_node

    path = str(example(str(value))) if str(value) in EXAMPLES else os.path.abspath(str(value))
    try:
        load_pci_node(path)
    except PciNodeError as exc:
        raise pytest.UsageError(f"{_flag('devplug_pci_node')}: {exc} (or one of the examples: {', '.join(EXAMPLES)})") from None
    return path


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_pairs(dest: str, value: Any) -> dict[str, str]:
    """Option ``dest``'s ``KEY=VALUE`` pairs, comma-separated; ``\\,`` is a comma inside a value (a chart's
    ``FEATURE_GATES=A=true,B=false`` is ``FEATURE_GATES=A=true\\,B=false``)."""
    env: dict[str, str] = {}
    for raw in re.split(r"(?<!\\),", str(value or "")):
        pair = raw.replace("\\,", ",").strip()
        if not pair:
            continue
        key, sep, val = pair.partition("=")
        if not sep or not _ENV_NAME.fullmatch(key):
            raise pytest.UsageError(
                f"{_flag(dest)} = {value!r}: {pair!r} is not KEY=VALUE (KEY a variable name: letters, "
                "digits and _, not starting with a digit)"
            )
        env[key] = val
    return env


def _device_nodes(value: Any) -> tuple[str, ...]:
    nodes = tuple(n.strip() for n in str(value or "").split(",") if n.strip())
    bad = [n for n in nodes if not n.startswith("/dev/") or ".." in n.split("/") or n == "/dev/"]
    if bad:
        raise pytest.UsageError(f"devplug_device_nodes = {value!r}: {', '.join(bad)}: want absolute paths under /dev")
    return nodes


def get_settings(config: pytest.Config) -> DevplugSettings:
    """The options as ``pytest_configure`` parsed them (parsed here on first use where it did not run them,
    e.g. under ``--help``)."""
    settings = config.stash.get(_SETTINGS_KEY, None)
    if settings is None:
        settings = config.stash[_SETTINGS_KEY] = settings_from_config(config)
    return settings


def pytest_configure(config: pytest.Config) -> None:
    """Parse the options once: a bad value stops the run here, as one usage error (exit 4), before any test."""
    if not config.getoption("help", default=False):
        config.stash[_SETTINGS_KEY] = settings_from_config(config)
    report = _opt(config, "devplug_report")
    if report:
        ReportWriter.install(config, str(report))
    config.addinivalue_line(
        "markers",
        f"{CONVENTION_MARKER}(name): an opt-in check of a plugin-family convention the kubelet does not require "
        "(see --devplug-conventions); skipped, saying so, for a plugin that does not declare it",
    )
    config.addinivalue_line(
        "markers",
        f"{DISRUPTIVE_MARKER}: the test disrupts the node under test (restarts its kubelet, stops or kills the plugin, "
        "changes the kubelet's config); on the cluster backend it runs only with --devplug-allow-disruptive",
    )
    config.addinivalue_line(
        "markers",
        f"{SOAK_MARKER}: the long-lived connection verdict; runs last, the soaking copy of the plugin starts with the "
        "first test (see --devplug-soak)",
    )
    config.addinivalue_line(
        "markers",
        f"{GRACE_PERIOD_MARKER}: the test waits out the kubelet's grace period after its plugin went away (5 min on a "
        "real kubelet); select it with -m to run it on a node of its own, in parallel with the rest (nox -s e2e does)",
    )


def soak_seconds(config: pytest.Config) -> float:
    """``--devplug-soak`` (ini ``devplug_soak``) as parsed once with the other options."""
    return get_settings(config).soak


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The soak verdict runs last, so the soak overlaps every other check instead of adding its time."""
    soaking = [i for i in items if i.get_closest_marker(SOAK_MARKER) is not None]
    if soaking:
        soak_seconds(config)  # a bad value stops the run here, once
        items[:] = [i for i in items if i.get_closest_marker(SOAK_MARKER) is None] + soaking


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Open the test's evidence window; skip @devplug_disruptive tests on a cluster the harness does not own,
    unless allowed (saying so)."""
    _open_test_window(item)
    if item.get_closest_marker(DISRUPTIVE_MARKER) is None:
        return
    if not get_settings(item.config).allow_disruptive:
        pytest.skip(
            f"disrupts the node under test (@{DISRUPTIVE_MARKER}: kubelet restart, plugin stop/kill or kubelet config "
            f"change) on a cluster the harness does not own; run with --devplug-allow-disruptive where that is safe"
        )


def _describe(backend: str, spec: PluginSpec) -> str:
    what = shlex.join(spec.argv) if backend == "sim" else f"image {spec.image} manifest {spec.manifest}"
    return f"resource={spec.resource_name} mock={spec.mock} plugin: {what}"


def _fixture_overrides(config: pytest.Config, name: str, ours: object) -> list[str]:
    """Loaded conftests (or plugins) that define their own fixture ``name`` (``ours``: the harness's), as paths from
    the rootdir."""
    found = []
    for plugin in config.pluginmanager.get_plugins():
        fixture = getattr(plugin, name, None)
        if isinstance(plugin, ModuleType) and fixture is not None and fixture is not ours:
            path = Path(plugin.__file__ or plugin.__name__)
            found.append(str(path.relative_to(config.rootpath)) if path.is_relative_to(config.rootpath) else str(path))
    return sorted(found)


def pytest_report_header(config: pytest.Config) -> str | None:
    """The plugin under test (a DRA run's header describes its driver instead: ``dra/plugin.py``)."""
    if is_dra_run(config):
        return None
    s = get_settings(config)
    return _subject_header(config, s.plugin, _describe(s.backend, s.plugin), what="the plugin", fixture="devplug_plugin_spec",
                           ours=devplug_plugin_spec, key=_HEADER_SPEC_KEY)  # fmt: skip


def _subject_header(
    config: pytest.Config, spec: S, description: str, *, what: str, fixture: str, ours: object, key: pytest.StashKey[S | None]
) -> str:
    """The header's line on what the run tests (``what``: the plugin, the DRA driver): its ``description`` from the
    options, or, when a conftest overrides ``fixture`` (``ours``: the harness's), a pointer to the line printed when
    what that fixture names is deployed (its value needs a fixture run). ``key`` keeps what was shown (``None``: the
    pointer), so the deployment prints only what the header did not show."""
    s = get_settings(config)
    overrides = _fixture_overrides(config, fixture, ours)
    if overrides:
        config.stash[key] = None
        return (f"devplug: backend={s.backend}, {_kubernetes_header(s)}{_control_plane_header(s)}; {fixture} is overridden in "
                f"{', '.join(overrides)}: {what} under test is printed when it is deployed")
    config.stash[key] = spec
    return f"devplug: backend={s.backend}, {_kubernetes_header(s)}{_control_plane_header(s)}; {description}"


def _kubernetes_header(s: DevplugSettings) -> str:
    """``kubernetes 1.37.2`` (with the run's feature gates); on kind and a cluster the nodes' release is told once
    they are known."""
    kube = s.backend_options.kube
    gates = f" (feature gates {kube.gate_flag()})" if kube.feature_gates else ""
    if s.backend == "sim":
        return f"{kube.name}{gates}"
    return f"{kube.name} asked{gates}, the nodes' release told when known" if s.backend_options.kube_chosen else \
        f"kubernetes: the nodes' release, told when known{gates}"


def _control_plane_header(s: DevplugSettings) -> str:
    """``, control-plane=real (kubernetes v1.37.2, etcd v3.7.0 from ...)``: the binaries found now (no download)."""
    if s.backend != "sim" or s.backend_options.control_plane != "real":
        return ""
    from .controlplane import BinariesNotFoundError, resolve

    try:
        found = resolve(s.backend_options.k8s_bin_dir, version=s.backend_options.kube.release.minor, download=False).describe()
    except BinariesNotFoundError:
        found = "binaries to be downloaded"
    return f", control-plane=real ({found})"


def _say(config: pytest.Config, line: str) -> None:
    """One line on the terminal, outside the capture (from a fixture)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        reporter.ensure_newline()
        reporter.write_line(line)


def _announce_plugin(config: pytest.Config, backend: str, spec: PluginSpec) -> None:
    """Print the plugin under test once it is known, unless the header already showed exactly it
    (a conftest loaded after the header, or one the header named, decides it)."""
    if config.stash.get(_HEADER_SPEC_KEY, None) == spec:
        return
    _say(config, f"devplug: plugin under test (from devplug_plugin_spec): {_describe(backend, spec)}")


# -- fixtures ------------------------------------------------------------------------------------


@dataclass
class _TestState:
    backend: Backend | None = None
    node: str | None = None
    pods: PodFactory | None = None


def _state(request: pytest.FixtureRequest) -> _TestState:
    item: pytest.Item = request.node
    return item.stash.setdefault(_STATE_KEY, _TestState())


@pytest.fixture(scope="session")
def devplug_settings(pytestconfig: pytest.Config) -> DevplugSettings:
    """The resolved pytest-devplug options, parsed once per run (``pytest_configure``)."""
    return get_settings(pytestconfig)


@pytest.fixture(scope="session")
def devplug_plugin_spec(devplug_settings: DevplugSettings) -> PluginSpec:
    """What ``devplug_plugin`` deploys. Override in your conftest.py to test your own plugin."""
    if devplug_settings.included_plugin and devplug_settings.backend == "sim" and not included_plugin_installed():
        # Say so now, instead of a registration wait that ends in "No module named devplug_gpu_plugin".
        pytest.exit(f"devplug: {NO_PLUGIN_MESSAGE}", returncode=pytest.ExitCode.USAGE_ERROR)
    return devplug_settings.plugin


@pytest.fixture(scope="session")
def devplug_cluster(pytestconfig: pytest.Config, devplug_settings: DevplugSettings) -> Iterator[ClusterHandle]:
    """The cluster (a ClusterHandle) for the whole session (sim: an embedded kubelet in a temp dir, removed afterwards;
    with a real control plane its ``kubeconfig`` works for kubectl until then, or after with --keep-cluster)."""
    try:
        backend = create_backend(devplug_settings.backend, devplug_settings.backend_options)
    except BackendUnavailableError as exc:
        pytest.exit(f"devplug: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    try:
        try:
            backend.start()
        except BackendUnavailableError as exc:
            # Every devplug test would error the same way: stop once, saying why.
            pytest.exit(f"devplug: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        opts = devplug_settings.backend_options
        handle = ClusterHandle(backend, timeout=opts.timeout, reregistration_timeout=opts.reregistration_timeout)
        if handle.kubeconfig is not None and backend.name == "sim":
            _say(pytestconfig, f"devplug: real control plane up; kubectl --kubeconfig {handle.kubeconfig} get nodes")
        yield handle
    finally:
        backend.close()
        kept = getattr(backend, "kept", None)
        if kept:
            _say(pytestconfig, f"devplug: the control plane is kept (--keep-cluster): {kept}")


@pytest.fixture(scope="session")
def devplug_node_spec(devplug_plugin_spec: PluginSpec, devplug_settings: DevplugSettings) -> NodeSpec:
    """The node under test as the run wants it (a NodeSpec): every node the suite adds for a copy of the plugin (the
    soak's, a single-numa-node one) is made like it (``dataclasses.replace``), its device nodes and PCI node too."""
    return NodeSpec(
        NODE_NAME, numa_nodes=max(devplug_plugin_spec.numa_nodes, 1), resource_name=devplug_plugin_spec.resource_name,
        device_nodes=devplug_settings.device_nodes, pci_node=devplug_settings.pci_node,
    )  # fmt: skip


@pytest.fixture(scope="session")
def devplug_node(devplug_cluster: ClusterHandle, devplug_node_spec: NodeSpec) -> NodeHandle:
    """The node (a NodeHandle) the plugin under test runs on."""
    return devplug_cluster.ensure_node(devplug_node_spec)


class DevplugWarning(UserWarning):
    """Something the kubelet accepts but that is almost surely a plugin bug (shown in pytest's warnings summary)."""


def _warn_odd_ids(resource: str, ids: list[str]) -> None:
    """Device IDs with control characters (e.g. ``'\\x00'`` from Go's ``string(uint)``): the kubelet takes them,
    ``kubectl`` and logs show them garbled; a warning, not a failure."""
    odd = [i for i in ids if any(ord(c) < 32 or ord(c) == 127 for c in i)]
    if odd:
        warnings.warn(
            DevplugWarning(f"{resource}: device IDs with control characters: {odd!r} (of {len(ids)} listed)"),
            stacklevel=2,
        )


class PluginNotReadyError(AssertionError):
    """The plugin under test did not come up in an earlier test's set-up; that test's report has the details."""


class _Deployment:
    """The session's deployment of the plugin, redeployed when a test left it changed.

    It owns the bookkeeping of what tests did to the plugin (``_changes``, which the handle reports to)."""

    def __init__(self, cluster: ClusterHandle, node: NodeHandle, spec: PluginSpec) -> None:
        self.cluster, self.node, self.spec = cluster, node, spec
        self.handle: PluginHandle | None = None
        self.baseline: tuple[tuple[int | None, int | None], ...] = ()
        self.ready = False
        self.failure: AssertionError | None = None
        self.failed_in = ""  # the test whose set-up reported the failure, in full
        self._changes = PluginChanges()

    def started(self) -> PluginHandle:
        """Deployed, not waited for (registration tests judge registration themselves)."""
        if self.handle is None:
            self._changes = PluginChanges()
            self.handle = self.cluster.deploy(self.node, self.spec, changes=self._changes)
            self.ready = False
        return self.handle

    def faults_handed_out(self) -> None:
        """An injector was handed out; one of a conftest does not report its changes, so assume it made some."""
        self._changes.note(devices=True)

    def get(self, test: str = "") -> PluginHandle:
        if self.failure is not None:
            # Do not wait again in every test for a plugin that never came up, nor repeat the whole report:
            # one root cause, reported once; the tests after it fail at once pointing there.
            first = str(self.failure).splitlines()[0] if str(self.failure) else type(self.failure).__name__
            raise PluginNotReadyError(
                f"the plugin under test did not come up (reported in full in {self.failed_in or 'an earlier test'}): "
                f"{first[:300]}"
            )
        handle = self.started()
        if not self.ready:
            try:
                # The kubelet's capacity is whatever ListAndWatch lists (replicas, MIG devices): no count demanded.
                for resource in self.spec.resource_names:
                    assert_registered(handle, resource=resource)
                handle.wait_listed()
            except AssertionError as exc:
                self.failure, self.failed_in = exc, test
                raise
            self.ready = True
            self.baseline = self._counts()
            for resource in self.spec.resource_names:
                _warn_odd_ids(resource, self.node.device_ids(resource))
        return handle

    def _counts(self) -> tuple[tuple[int | None, int | None], ...]:
        """(capacity, allocatable) of every resource the plugin advertises."""
        return tuple(self.node.counts(r) for r in self.spec.resource_names)

    def reset_if_needed(self) -> None:
        h = self.handle
        if h is None:
            return
        clean = not self._changes.touched and h.running and self._counts() == self.baseline
        if clean:
            return
        if not self._changes.devices and self._restored(h):
            return
        self.cluster.backend.remove_plugin(self.node.name)
        self.handle = None
        self.get()

    def _restored(self, h: PluginHandle) -> bool:
        """A plugin only stopped, killed or restarted (its devices untouched): start it again if needed and
        wait until it is back as deployed. Much cheaper than a redeploy on a real cluster, where removing
        a DaemonSet and creating it again waits for pod deletion and kubelet status updates."""
        if not h.running:
            h.start()  # through the handle: its waits give up on a crash again
        try:
            h.wait_listed()
        except AssertionError:
            return False
        if self._counts() != self.baseline:
            return False
        self._changes.clear()
        return True


def _kubernetes_version(config: pytest.Config, cluster: ClusterHandle, node: str) -> str:
    """What the report says of the Kubernetes the subject ran on: the node's kubelet version (the embedded kubelet's
    is the release it behaves as). Where the run chose a release and the node runs another, say so on the terminal
    too: every release-dependent check judges by the node's."""
    s = get_settings(config)
    version = str(cluster.backend.get_node(node).get("status", {}).get("nodeInfo", {}).get("kubeletVersion") or "")
    if not version:
        return "unknown: the node reports no kubelet version"
    what = f"kubernetes {version.removeprefix('v')}" + (" (the embedded kubelet)" if s.backend == "sim" else "")
    asked = s.backend_options.kube
    if s.backend != "sim":
        mismatch = s.backend_options.kube_chosen and not version.removeprefix("v").startswith(asked.release.minor + ".")
        note = f"; --devplug-kubernetes-version asked for {asked.release.minor}: MISMATCH" if mismatch else ""
        _say(config, f"devplug: node {node} runs {what}{note}")
        what += note
    return what


@pytest.fixture(scope="session")
def _devplug_deployment(
    pytestconfig: pytest.Config,
    devplug_settings: DevplugSettings,
    devplug_cluster: ClusterHandle,
    devplug_node: NodeHandle,
    devplug_plugin_spec: PluginSpec,
) -> _Deployment:
    _announce_plugin(pytestconfig, devplug_settings.backend, devplug_plugin_spec)
    note_run(pytestconfig, devplug_settings.backend, devplug_plugin_spec, _kubernetes_version(pytestconfig, devplug_cluster, devplug_node.name))
    return _Deployment(devplug_cluster, devplug_node, devplug_plugin_spec)


@pytest.fixture(scope="session")
def devplug_soak(
    pytestconfig: pytest.Config, devplug_cluster: ClusterHandle, devplug_node: NodeHandle, devplug_plugin_spec: PluginSpec,
    devplug_node_spec: NodeSpec,
) -> Iterator[SoakWatch]:
    """The long-lived connection watch (a SoakWatch), for the whole session: a second copy of the plugin on a node of
    its own, registered once and left alone; ``.verdict(timeout)`` waits until it has been registered for
    ``--devplug-soak`` seconds. Started by the first test of a session that collected a soak check."""
    with SoakWatch(devplug_cluster, devplug_plugin_spec, soak_seconds(pytestconfig), devplug_node.name, devplug_node_spec) as watch:
        yield watch


@pytest.fixture(scope="session", autouse=True)
def _devplug_soak_early(request: pytest.FixtureRequest) -> None:
    """Start the soak with the session's first test when a soak check is collected and the soak is on."""
    items = request.session.items
    if soak_seconds(request.config) > 0 and any(i.get_closest_marker(SOAK_MARKER) is not None for i in items):
        request.getfixturevalue("devplug_soak")


@pytest.fixture
def devplug_plugin(
    request: pytest.FixtureRequest, _devplug_deployment: _Deployment, devplug_settings: DevplugSettings
) -> Iterator[PluginHandle]:
    """The plugin under test (a PluginHandle), registered and ready. Deployed once per session; a test that changed it
    (faults, stop/kill/restart, ``devplug_faults`` used) gets it redeployed clean after it."""
    for mark in request.node.iter_markers(CONVENTION_MARKER):
        name = mark.args[0] if mark.args else "?"
        if name not in _devplug_deployment.spec.conventions:
            pytest.skip(
                f"convention check {name!r} ({CONVENTIONS.get(name, 'unknown convention')}): the kubelet does not "
                f"require it and the plugin under test ({_devplug_deployment.spec.resource_name}) does not declare it "
                f"(--devplug-conventions {name} switches it on)"
            )
    state = _state(request)
    state.backend, state.node = _devplug_deployment.cluster.backend, _devplug_deployment.node.name
    handle = _devplug_deployment.get(request.node.nodeid)
    yield handle
    # After an interrupt (Ctrl-C, SIGTERM) pytest tears this down at session end, with funcargs already None.
    if "devplug_faults" in (getattr(request.node, "funcargs", None) or {}):
        _devplug_deployment.faults_handed_out()
    _devplug_deployment.reset_if_needed()


@pytest.fixture
def devplug_faults(devplug_plugin: PluginHandle, devplug_settings: DevplugSettings) -> FaultInjector:
    """How the fault tests make the plugin's devices fail (a :class:`~pytest_devplug.faults.FaultInjector`).

    Default: the mock NVML for a plugin that reads the mock-state file (``--devplug-mock``): every fault
    for the included plugin, the ones NVML itself can express for another plugin on the mock NVML
    (:class:`~pytest_devplug.faults.NvmlXidFaults`). For another plugin, override this fixture in your
    conftest.py; lives for one test, after which the plugin is redeployed. Without an injector a test
    asking for it skips (``--devplug-missing-faults=fail``: fails)."""
    if devplug_plugin.has_mock:
        if devplug_settings.included_plugin:
            return MockNvmlFaults(devplug_plugin)
        return NvmlXidFaults(devplug_plugin, xid_health="nvml-xid" in devplug_plugin.spec.conventions)
    reason = (
        f"needs a fault injector: the plugin under test ({devplug_plugin.resource_name}) does not read the "
        f"mock-NVML state and no conftest overrides the devplug_faults fixture to return a {CONTRACT}"
    )
    if devplug_settings.missing_faults == "fail":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def devplug_plugin_started(
    request: pytest.FixtureRequest, _devplug_deployment: _Deployment
) -> Iterator[PluginHandle]:
    """The plugin under test, deployed but not waited for: for tests that judge registration themselves."""
    state = _state(request)
    state.backend, state.node = _devplug_deployment.cluster.backend, _devplug_deployment.node.name
    yield _devplug_deployment.started()
    if _devplug_deployment.ready:
        _devplug_deployment.reset_if_needed()


@pytest.fixture
def devplug_pod(
    request: pytest.FixtureRequest, devplug_cluster: ClusterHandle, devplug_node: NodeHandle, devplug_plugin: PluginHandle
) -> Iterator[PodFactory]:
    """A PodFactory: ``devplug_pod(count=2)`` (alias ``gpus=2``) or ``devplug_pod(manifest={...})`` makes a pod on the
    plugin's node requesting the resource under test and returns its PodHandle; the pods are deleted afterwards."""
    factory = devplug_cluster.pods(devplug_node, devplug_plugin.resource_name, prefix=request.node.name)
    _state(request).pods = factory
    yield factory
    errors = factory.cleanup()
    if errors:
        raise RuntimeError("devplug_pod could not delete: " + "; ".join(errors))


# -- report sections -----------------------------------------------------------------------------

_NEXT_WINDOW = pytest.StashKey[float]()


def _open_test_window(item: pytest.Item) -> None:
    """Evidence quotes the kubelet lines of this test: from the previous test's teardown on (it redeploys
    the plugin for this one), or from this setup for the first test."""
    set_test_window(item.config.stash.get(_NEXT_WINDOW, None) or time.time())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    item.config.stash[_NEXT_WINDOW] = time.time()


def _backend_cannot(report: pytest.TestReport, call: pytest.CallInfo[None]) -> bool:
    return report.failed and call.when != "teardown" and call.excinfo is not None and \
        call.excinfo.errisinstance(UnsupportedOperationError)


def _uses_devplug(item: pytest.Item) -> bool:
    return any(f.startswith("devplug_") for f in getattr(item, "fixturenames", ()))


def _labelled_skip(item: pytest.Item, longrepr: tuple[str, int, str]) -> tuple[str, int, str]:
    """A skip raised in a fixture or helper points at the test and names it: ``-rs`` would otherwise list
    every such skip under the fixture's line, merging tests that skipped for different reasons."""
    path, lineno, reason = longrepr
    name = item.name
    prefix = "Skipped: "
    text = reason[len(prefix):] if reason.startswith(prefix) else reason
    if not text.startswith(f"{name}: "):
        text = f"{name}: {text}"
    fspath, line, _ = item.reportinfo()  # what pytest itself uses for a skip marker
    return (os.fspath(fspath), lineno if line is None else line + 1, text)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the cluster's evidence to a failed test's report (before teardown changes it); tell the report how
    often the plugin was restarted."""
    report = yield
    state = item.stash.get(_STATE_KEY, None)
    if state is not None and state.backend is not None and state.node is not None:
        note_plugin(item.config, item.nodeid, state.backend, state.node)
    if _backend_cannot(report, call) and _uses_devplug(item):
        # No verdict is possible where the backend lacks the ability (e.g. stopping an adopted plugin on
        # the cluster backend): a skip quoting why, not an error blamed on the plugin.
        assert call.excinfo is not None
        report.outcome = "skipped"
        report.longrepr = (str(item.path), 0, f"Skipped: {call.excinfo.value}")  # labelled just below
    if report.skipped and isinstance(report.longrepr, tuple) and _uses_devplug(item):
        report.longrepr = _labelled_skip(item, report.longrepr)
    if not report.failed or call.excinfo is None or call.when == "teardown":
        return report
    evidence: list[Evidence] = []
    exc = call.excinfo.value
    pods = list(state.pods.created) if state is not None and state.pods else []
    if isinstance(exc, DevplugAssertionError):
        evidence = list(exc.evidence)
        if pods and state is not None and state.backend is not None and not any(e.title == "pods" for e in evidence):
            evidence += collect_evidence(state.backend, None, pods)  # the test's pods, next to the helper's view
    elif state is not None and state.backend is not None:
        evidence = collect_evidence(state.backend, state.node, pods)
    for ev in evidence:
        report.sections.append((f"devplug: {ev.title}", ev.text))
    return report
