"""The options as the harness uses them: parsed once (``pytest_configure``) from the table in :mod:`.options`
into a :class:`DevplugSettings`, read with :func:`get_settings`."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

import pytest

from .backends import mockstate
from .backends.base import CONTROL_PLANES, BackendOptions, PluginSpec
from .kubeletmodel.releases import KubeVersion
from .errors import VersionError
from .options import CONVENTIONS, MissingFaults, command_line, env_pairs, given, option, value
from .soakwatch import DEFAULT_SOAK_S

__all__ = ["DevplugSettings", "default_plugin_argv", "get_settings", "parse_settings", "settings_from_config"]

#: The options as parsed once, in ``pytest_configure``.
_SETTINGS_KEY = pytest.StashKey["DevplugSettings"]()


@dataclass(frozen=True)
class DevplugSettings:
    """The resolved options (command line first, then ini keys, then defaults)."""

    backend: str
    backend_options: BackendOptions
    plugin: PluginSpec
    missing_faults: MissingFaults
    included_plugin: bool = False  # no plugin option given: the included GPU plugin is the one under test
    #: Whether @devplug_disruptive tests run (cluster backend: only with --devplug-allow-disruptive).
    allow_disruptive: bool = True
    #: Device nodes the node under test has (``--devplug-device-nodes``; sim: stubs in the plugin's namespace).
    device_nodes: tuple[str, ...] = ()
    #: Seconds the long-lived connection check holds its registration (``--devplug-soak``; 0: off).
    soak: float = DEFAULT_SOAK_S
    #: The mock PCI/NIC node file of the node under test (``--devplug-pci-node``; sim).
    pci_node: str | None = None


def default_plugin_argv(
    resource_name: str, *, pre_start_required: bool = True, second_resource: tuple[str, int] | None = None
) -> list[str]:
    """The included GPU plugin on the mock NVML, with the harness's placeholders; ``second_resource``
    (name, GPUs) has it advertise that many of its GPUs as a second resource from the same process."""
    argv = [
        sys.executable,
        "-m",
        "devplug_gpu_plugin",
        "--plugin-dir",
        "{plugin_dir}",
        "--resource-name",
        resource_name,
        "--nvml",
        "mock",
        "--mock-state",
        "{mock_state}",
    ]
    if pre_start_required:
        argv.append("--pre-start-required")
    if second_resource is not None:
        argv += ["--second-resource", f"{second_resource[0]}={second_resource[1]}"]
    return argv


_Choice = TypeVar("_Choice", bound=str)


def _one_of(config: pytest.Config, name: str, choices: tuple[_Choice, ...]) -> _Choice:
    """Option ``name``'s value as the type of its choices (the options table has already refused any other)."""
    got = str(value(config, name))
    for choice in choices:
        if choice == got:
            return choice
    raise pytest.UsageError(f"{option(name).named}: {got!r} is not one of {', '.join(choices)}")


def settings_from_config(config: pytest.Config) -> DevplugSettings:
    """Parse the options (command line first, then ini keys, then the defaults declared with them); a bad
    value raises :class:`pytest.UsageError` naming the option and what it accepts. ``pytest_configure``
    calls it once: read the result with :func:`get_settings`."""
    backend = str(value(config, "backend"))
    control_plane = _one_of(config, "control-plane", CONTROL_PLANES)
    resource, *extra_resources = _resource_names(value(config, "resource-name"))
    cmd = given(config, "plugin-cmd")
    image = given(config, "plugin-image")
    manifest = given(config, "plugin-manifest")
    # An image without a manifest is deployed with the included plugin's own DaemonSet (its DP_* settings), so
    # it is the included plugin, built elsewhere (e.g. pushed to the cluster's registry): the same defaults.
    custom = bool(cmd or manifest)
    mock = given(config, "mock")
    mock = (not custom) if mock is None else bool(mock)
    pre_start = given(config, "pre-start-required")
    pre_start = (not custom) if pre_start is None else bool(pre_start)
    model = str(value(config, "gpu-model"))
    gpus = int(value(config, "gpus"))
    if cmd:
        argv = command_line("plugin-cmd", cmd)  # placeholders are filled when the plugin starts (PluginSpec.command)
    else:
        argv = default_plugin_argv(
            resource, pre_start_required=pre_start, second_resource=_included_second(gpus, extra_resources)
        )
    named = value(config, "conventions")
    conventions = frozenset({n.strip() for n in named.split(",")} - {"", "none"}) if named is not None else None
    spec = PluginSpec(
        resource_name=resource,
        extra_resource_names=tuple(extra_resources),
        argv=tuple(argv),
        image=image,
        manifest=manifest,
        mock=mock,
        gpus=gpus,
        numa_nodes=int(value(config, "numa-nodes")),
        mig=_mig(given(config, "mig"), model),
        gpu_model=model,
        pre_start_required=pre_start,
        env=env_pairs("plugin-env", given(config, "plugin-env")),
        conventions=(frozenset() if custom else frozenset(CONVENTIONS)) if conventions is None else conventions,
    )
    timeout = float(value(config, "timeout"))
    opts = BackendOptions(
        kube=_kube_version(config),
        kube_chosen=given(config, "kubernetes-version") is not None,
        timeout=timeout,
        reregistration_timeout=max(float(value(config, "reregistration-timeout")), timeout),
        grace_period=float(value(config, "grace-period")),
        control_plane=control_plane,
        k8s_bin_dir=given(config, "k8s-bin-dir"),
        cluster_name=str(value(config, "cluster-name")),
        keep_cluster=bool(given(config, "keep-cluster")),
        kind_bin=given(config, "kind-bin"),
        kind_image=given(config, "kind-image"),
        kubeconfig=given(config, "kubeconfig"),
        kind_config=given(config, "kind-config"),
        kube_context=given(config, "kube-context"),
        node=given(config, "node"),
        second_node=given(config, "second-node"),
        plugin_daemonset=given(config, "plugin-daemonset"),
        node_image=given(config, "node-image") or image,
        workload_image=given(config, "workload-image"),
    )
    pci_node = _pci_node(given(config, "pci-node"))
    if pci_node is not None and backend != "sim":
        raise pytest.UsageError(
            f"{option('pci-node').named}: a mock PCI node is the embedded kubelet's (--devplug-backend sim); "
            f"the nodes of {backend} have the NICs they have"
        )
    allow = given(config, "allow-disruptive")
    allow_disruptive = backend != "cluster" if allow is None else bool(allow)
    return DevplugSettings(
        backend,
        opts,
        spec,
        _one_of(config, "missing-faults", get_args(MissingFaults)),
        included_plugin=not custom,
        allow_disruptive=allow_disruptive,
        soak=float(value(config, "soak")),
        device_nodes=_device_nodes(given(config, "device-nodes")),
        pci_node=pci_node,
    )


def _kube_version(config: pytest.Config) -> KubeVersion:
    """The release (``--devplug-kubernetes-version``) and its feature gates (``--devplug-feature-gates``)."""
    version = str(value(config, "kubernetes-version"))
    gates = given(config, "feature-gates")
    try:
        return KubeVersion.of(version, str(gates or ""))
    except VersionError as exc:
        raise pytest.UsageError(f"{option('feature-gates').named} = {gates!r}: {exc}") from None


def _resource_names(text: Any) -> list[str]:
    names = [n.strip() for n in str(text).split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise pytest.UsageError(
            f"{option('resource-name').named} = {text!r}: expected one resource name or several, comma-separated, "
            "each once (e.g. nvidia.com/gpu,nvidia.com/mig-1g.5gb)"
        )
    return names


def _included_second(gpus: int, extra: list[str]) -> tuple[str, int] | None:
    """The included plugin's ``--second-resource``: the second name and half the mock GPUs (rounded down)."""
    if not extra:
        return None
    if len(extra) > 1 or gpus < 2:
        raise pytest.UsageError(
            f"{option('resource-name').named}: the included plugin advertises at most two resources, and needs 2+ "
            f"GPUs for two (--devplug-gpus {gpus}; resources {extra!r} beside the first)"
        )
    return extra[0], gpus // 2


def _mig(text: Any, model: str) -> tuple[str, ...]:
    profiles = tuple(p.strip() for p in str(text or "").split(",") if p.strip())
    try:
        mockstate.check_mig_profiles(profiles, model)
    except ValueError as exc:
        raise pytest.UsageError(f"{option('mig').named} = {text!r}: {exc}") from None
    return profiles


def _pci_node(text: Any) -> str | None:
    """The PCI node file, checked now (a bad file is a usage error naming it), read again by the backend."""
    if not text:
        return None
    from .pcinodes import EXAMPLES, example
    from .pcinodes.spec import load_pci_node
    from .errors import PciNodeError

    path = str(example(str(text))) if str(text) in EXAMPLES else os.path.abspath(str(text))
    try:
        load_pci_node(path)
    except PciNodeError as exc:
        raise pytest.UsageError(
            f"{option('pci-node').named}: {exc} (or one of the examples: {', '.join(EXAMPLES)})"
        ) from None
    return path


def _device_nodes(text: Any) -> tuple[str, ...]:
    nodes = tuple(n.strip() for n in str(text or "").split(",") if n.strip())
    bad = [n for n in nodes if not n.startswith("/dev/") or ".." in n.split("/") or n == "/dev/"]
    if bad:
        raise pytest.UsageError(
            f"{option('device-nodes').named} = {text!r}: {', '.join(bad)}: want absolute paths under /dev"
        )
    return nodes


def parse_settings(config: pytest.Config) -> DevplugSettings:
    """Parse the options now and keep them for :func:`get_settings` (``pytest_configure``: a bad value stops the run
    there)."""
    settings = config.stash[_SETTINGS_KEY] = settings_from_config(config)
    return settings


def get_settings(config: pytest.Config) -> DevplugSettings:
    """The options as ``pytest_configure`` parsed them (parsed here on first use where it did not run them,
    e.g. under ``--help``)."""
    settings = config.stash.get(_SETTINGS_KEY, None)
    return parse_settings(config) if settings is None else settings
