"""Every option of pytest-devplug, declared once: name, value kind, default, choices, help, ini key, the
``devplug conformance`` flag and whether it is a DRA option.

From this table are made the pytest options and ini keys (:func:`register`), the values the settings are parsed
from (:func:`value`, :func:`given`), the ``devplug conformance`` flags and the pytest arguments they become
(:func:`add_cli_flags`, :func:`cli_pytest_args`) and the options reference (:func:`options_markdown`). One value
check (:meth:`Option.check`) serves the command line of both parsers and the ini keys, so they accept the same values.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import pytest

from .backends import BACKENDS
from .backends.base import (
    CONTROL_PLANES,
    DEFAULT_GRACE_PERIOD,
    DEFAULT_REREGISTRATION_TIMEOUT,
    DEFAULT_RESOURCE_NAME,
    DEFAULT_TIMEOUT,
)
from .backends.dra import DEFAULT_DRIVER_NAME
from .backends.mockstate import DEFAULT_GPU_MODEL, GPU_MODELS, check_gpu_model, mig_profiles
from .kubeletmodel.releases import DEFAULT_VERSION, release, releases
from .soakwatch import DEFAULT_SOAK_S

__all__ = [
    "CONVENTIONS",
    "OPTIONS",
    "Option",
    "add_cli_flags",
    "cli_pytest_args",
    "command_line",
    "env_pairs",
    "given",
    "option",
    "options_markdown",
    "register",
    "value",
]

#: The option group, as ``pytest --help`` titles it (the README names it too).
GROUP = ("devplug", "device-plugin end-to-end tests (pytest-devplug)")
#: The group of the kind cluster options when pytest-kind-ng (which registers them itself) is absent.
KIND_GROUP = ("kind", "kind cluster (pytest-devplug; pip install 'pytest-devplug[kind]')")

#: Opt-in checks of conventions some plugin families follow and the kubelet does not require.
#: The included plugin follows all of them, so its run switches them all on.
CONVENTIONS: dict[str, str] = {
    "ids-visible": "every assigned device ID appears in what Allocate injected, and no other device's ID does",
    "nvidia-env": "NVIDIA_VISIBLE_DEVICES lists the assigned IDs and /dev/nvidia<minor> is injected "
    "(NVIDIA's envvar strategy)",
    "numa-packing": "GetPreferredAllocation packs a request onto one NUMA node, filling one node before the next",
    "nvml-xid": "on the mock NVML, a critical Xid makes every device backed by that GPU Unhealthy and the "
    "application-error Xids leave it Healthy (NVML health monitoring)",
    "rolling-update": "a second instance of the plugin started beside the running one (a DaemonSet rollout with "
    "maxSurge) takes over its resource with no moment at 0 allocatable, and the first one's exit leaves it registered",
    "exclusive-devices": "each device is one container's alone: no device node injected for one device reaches a "
    "container holding another (nodes every container gets, such as a control node, aside); a plugin that shares a "
    "device by design (time-slicing, a scheduling budget) does not declare it",
}

#: What the fault-injection tests do without a fault injector (``--devplug-missing-faults``).
MissingFaults = Literal["skip", "fail"]

ValueKind = Literal["str", "int", "float", "switch"]
Default = str | int | float | None


@dataclass(frozen=True)
class Option:
    """One option. ``default`` is applied by :func:`value` when neither the command line nor the ini file gives
    one (so whether it was given stays known); ``default_text`` says a default that depends on other options."""

    name: str
    help: str
    kind: ValueKind = "str"
    default: Default = None
    default_text: str | None = None
    #: The values it takes (``several``: a comma-separated list of them, or ``none``).
    choices: tuple[str, ...] = ()
    several: bool = False
    #: What the value must satisfy beyond its kind and choices; raises ``ValueError`` saying why.
    validate: Callable[[str], object] | None = None
    #: The ``devplug conformance`` flag (None: not offered there; it can follow ``--`` as the pytest option).
    cli: str | None = None
    dra: bool = False
    metavar: str | None = None
    #: A switch's flag that turns it off (``--devplug-no-mock``), and what it says.
    negative: str | None = None
    negative_help: str = ""
    #: ``kind``: a kind cluster option, named as pytest-kind-ng names it, no ini key.
    group: Literal["devplug", "kind"] = "devplug"
    #: A value the help shows where it says ``{example}``; valid at the default release (a test runs each).
    example: str | None = None

    @property
    def dest(self) -> str:
        """Where pytest keeps it; also the ini key."""
        prefix = "devplug_" if self.group == "devplug" else ""
        return prefix + self.name.replace("-", "_")

    @property
    def flag(self) -> str:
        return f"--devplug-{self.name}" if self.group == "devplug" else f"--{self.name}"

    @property
    def ini(self) -> str | None:
        return self.dest if self.group == "devplug" else None

    @property
    def named(self) -> str:
        """How an error names it: its flag and its ini key."""
        return f"{self.flag} (ini {self.ini})" if self.ini else self.flag

    @property
    def cli_dest(self) -> str | None:
        return None if self.cli is None else self.cli[2:].replace("-", "_")

    def shown_default(self) -> str | None:
        if self.default_text is not None:
            return self.default_text
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return None if self.default is None else str(self.default)

    @property
    def described(self) -> str:
        """The help with its example in place."""
        return self.help if self.example is None else self.help.replace("{example}", self.example)

    def help_text(self, naming: Callable[[str], str] = lambda flag: flag) -> str:
        """The help, its default rendered from the table; ``naming`` renames the ``--devplug-*`` options it mentions
        (``devplug conformance`` shows its own flags)."""
        text = re.sub(r"--devplug-[a-z0-9-]*[a-z0-9]", lambda m: naming(m.group(0)), self.described)
        default = self.shown_default()
        return text if default is None else f"{text} (default: {default})"

    def check(self, raw: object) -> Any:
        """The value of ``raw`` (a command-line or ini string, or what a parser made of one): an int or float for a
        number, else the text; ``ValueError`` saying what it accepts."""
        if self.kind == "switch":
            return bool(raw)
        if self.kind in ("int", "float"):
            number: int | float | None
            try:
                number = int(str(raw)) if self.kind == "int" else float(str(raw))
            except ValueError:
                number = None
            if number is None or number < 0:
                raise ValueError(f"expected {'an integer' if self.kind == 'int' else 'a number'} >= 0")
            return number
        text = str(raw)
        if self.several:
            names = {n.strip() for n in text.split(",")} - {"", "none"}
            unknown = sorted(names - set(self.choices))
            if unknown:
                raise ValueError(
                    f"unknown {', '.join(unknown)}; choose from {', '.join(self.choices)} or none (comma-separated)"
                )
        elif self.validate is not None:
            self.validate(text)
        elif self.choices and text not in self.choices:
            raise ValueError(f"invalid choice; choose one of {', '.join(self.choices)}")
        return text

    def argparse_type(self, raw: str) -> Any:
        """:meth:`check` for an argparse parser: its error names the option (argparse) and the value (here)."""
        try:
            return self.check(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{raw!r}: {exc}") from None


OPTIONS: tuple[Option, ...] = (
    Option(
        "backend",
        "where to run: sim (embedded kubelet), kind (a kind cluster it creates or reuses) or cluster "
        "(the kubeconfig's cluster, through the API only)",
        default="sim",
        choices=BACKENDS,
        cli="--backend",
    ),
    Option(
        "plugin-cmd",
        "command line of the plugin under test (sim); placeholders {plugin_dir}, {plugins_registry}, {mock_state}, "
        "{python}",
        default_text="the included GPU plugin on a mock NVML (pip install 'pytest-devplug[gpu-plugin]')",
        cli="--plugin-cmd",
    ),
    Option(
        "plugin-env",
        "environment of the plugin under test, KEY=VALUE pairs, comma-separated (sim: its process, placeholders as "
        "in --devplug-plugin-cmd; kind and cluster: every container of its DaemonSet; \\, is a comma in a value), e.g. "
        "{example} to have the included plugin register through the kubelet's plugin watcher",
        cli="--plugin-env",
        example="DP_REGISTRATION=plugins_registry",
        metavar="KEY=VALUE,...",
    ),
    Option("plugin-image", "container image of the plugin under test (kind, cluster)", cli="--plugin-image"),
    Option(
        "plugin-manifest", "manifest (DaemonSet) that deploys the plugin under test (kind)", cli="--plugin-manifest"
    ),
    Option(
        "kind-config",
        "kind: cluster config, a path or a file name in kind-config/",
        default_text="$DEVPLUG_KIND_CONFIG, else single-node.yaml",
    ),
    Option("kube-context", "cluster: kubeconfig context (the file: --kubeconfig)", default_text="the current one"),
    Option(
        "node",
        "kind, cluster: the node to test on",
        default_text="the first node advertising the resource, else one labelled devplug.io/gpu=true",
    ),
    Option(
        "second-node",
        "kind, cluster: a node beside --devplug-node where a check that needs a second node runs a copy of the "
        "plugin (the soak); without it that check skips saying so",
    ),
    Option(
        "plugin-daemonset",
        "cluster: NAMESPACE/NAME of a running plugin DaemonSet to test as it is, instead of deploying one",
    ),
    Option(
        "node-image",
        "cluster: image of the privileged node-operations pod (needs sh, nsenter, python3 + grpcio)",
        default_text="the plugin image",
    ),
    Option(
        "workload-image", "kind, cluster: image of the test pods (any image with sh and sleep)", default_text="busybox"
    ),
    Option(
        "resource-name",
        "extended resource the plugin advertises; several, comma-separated, for a plugin that advertises more than "
        "one from one process (the first is the one the single-resource checks judge; the included plugin takes two: "
        "half its GPUs, rounded down, become the second)",
        default=DEFAULT_RESOURCE_NAME,
        cli="--resource-name",
    ),
    Option("gpus", "GPUs in the mock NVML state", kind="int", default=4, cli="--gpus"),
    Option(
        "numa-nodes",
        "NUMA nodes the mock GPUs are spread over, 0 = no topology",
        kind="int",
        default=2,
        cli="--numa-nodes",
    ),
    Option(
        "gpu-model",
        "the mock GPUs' model, for what NVML answers (name, memory, PCI device ID, architecture, compute capability, "
        "SMs, MIG profile names)",
        default=DEFAULT_GPU_MODEL,
        choices=tuple(GPU_MODELS),
        validate=check_gpu_model,
        cli="--gpu-model",
    ),
    Option(
        "mig",
        f"MIG devices on every mock GPU, comma-separated profiles (on the default {DEFAULT_GPU_MODEL}: "
        f"{', '.join(mig_profiles())}; named for the model's memory, e.g. 1g.10gb on h100-80gb; e.g. "
        "{example}): the mock GPUs are MIG-enabled, and what is advertised is the "
        "plugin's choice (NVIDIA's --mig-strategy single: nvidia.com/gpu, mixed: nvidia.com/mig-1g.5gb ...)",
        cli="--mig",
        metavar="PROFILE,...",
        example="1g.5gb,1g.5gb,2g.10gb",
    ),
    Option("timeout", "seconds every bounded wait may take", kind="float", default=DEFAULT_TIMEOUT, cli="--timeout"),
    Option(
        "reregistration-timeout",
        "seconds a plugin may take to register again after a kubelet restart, at least --devplug-timeout "
        "(the kubelet's own dial may take 10 s, upstream-style plugins wait 10 s after a new kubelet.sock)",
        kind="float",
        default=DEFAULT_REREGISTRATION_TIMEOUT,
        cli="--reregistration-timeout",
    ),
    Option(
        "grace-period",
        "sim: seconds the kubelet keeps a resource whose plugin went away",
        kind="float",
        default=DEFAULT_GRACE_PERIOD,
        cli="--grace-period",
    ),
    Option(
        "control-plane",
        "sim: embedded (the harness's own API server and scheduler) or real (etcd, kube-apiserver, "
        "kube-scheduler and kube-controller-manager as child processes, the embedded kubelets its Nodes; "
        "kubectl works against devplug_cluster.kubeconfig)",
        default="embedded",
        choices=CONTROL_PLANES,
        cli="--control-plane",
    ),
    Option(
        "kubernetes-version",
        "the Kubernetes release to reproduce and judge against (each a pinned patch release; v1.37 names 1.37 too, "
        "and any patch release of a minor, e.g. 1.35.2, runs as that minor's with the rules of the patch named): "
        "sim: the embedded kubelet, API server and scheduler behave as it and the real control plane runs its "
        "binaries; kind: nodes of it; kind and cluster: the nodes' own release is reported beside it",
        default=DEFAULT_VERSION,
        choices=tuple(releases()),
        validate=release,
        cli="--kubernetes-version",
    ),
    Option(
        "feature-gates",
        "feature gates over the release's defaults, as the components' --feature-gates takes them (e.g. "
        "{example}); checked as that release checks them (unknown, locked, "
        "dependencies); sim: the embedded kubelet and control plane follow them and the real control plane gets them",
        cli="--feature-gates",
        metavar="NAME=true|false,...",
        example="DRAPartitionableDevices=false,DRAConsumableCapacity=false",
    ),
    Option(
        "k8s-bin-dir",
        "sim with --devplug-control-plane real: directory with etcd, kube-apiserver, kube-scheduler, "
        "kube-controller-manager",
        default_text="KUBEBUILDER_ASSETS, then the cache `devplug control-plane build` fills, then the release "
        "binaries, SHA-256 checked",
        cli="--k8s-bin-dir",
        metavar="DIR",
    ),
    Option(
        "soak",
        "seconds the long-lived connection check holds one registration of a second copy of the plugin on a node "
        "of its own, overlapped with the other checks (0 switches the check off)",
        kind="float",
        default=DEFAULT_SOAK_S,
    ),
    Option(
        "device-nodes",
        "sim: device nodes the node has, comma-separated (e.g. {example}), for a plugin that scans "
        "/dev: stub character devices in the private mount namespace of a plugin started without {plugin_dir} "
        "(a mock-NVML node has the GPU's /dev/nvidia* anyway)",
        example="/dev/ttyS0,/dev/widget0",
    ),
    Option(
        "pci-node",
        "sim: a mock PCI/NIC node file (YAML: PCI functions with vendor/device/class, driver, NUMA node, PF/VF, IOMMU "
        "group, netdev and MAC, RDMA device), or the name of a shipped example (sriov-iavf, sriov-vfio, "
        "sriov-mlx5-rdma, rdma-connectx), shown to a plugin started without "
        "{plugin_dir}: its sysfs, pci.ids, device nodes and a network namespace with its netdevs (needs root)",
        cli="--pci-node",
        metavar="FILE",
    ),
    Option(
        "report",
        "write a Markdown report of the run to this file (one row per check, grouped core / conventions / faults) "
        "and the same as JSON beside it (.json)",
        cli="--report",
        metavar="FILE",
    ),
    Option(
        "missing-faults",
        "what the fault-injection tests do when there is no fault injector (mock NVML or a conftest's "
        "devplug_faults fixture): skip (naming the contract to implement) or fail",
        default="skip",
        choices=get_args(MissingFaults),
        cli="--missing-faults",
    ),
    Option(
        "conventions",
        "opt-in checks of plugin-family conventions the kubelet does not require, comma-separated, or none: "
        + "; ".join(f"{k}: {v}" for k, v in CONVENTIONS.items()),
        default_text="all for the included plugin (also from --devplug-plugin-image alone), none for "
        "--devplug-plugin-cmd/-manifest",
        choices=tuple(CONVENTIONS),
        several=True,
        cli="--conventions",
        metavar="NAME,...|none",
    ),
    Option(
        "mock",
        "the plugin under test reads the mock-NVML state file (fault controls available)",
        kind="switch",
        default_text="yes for the included plugin (also from --devplug-plugin-image alone), no for "
        "--devplug-plugin-cmd/-manifest",
        cli="--mock",
        negative="no-mock",
        negative_help="the plugin has no mock controls",
    ),
    Option(
        "pre-start-required",
        "the plugin sets pre_start_required",
        kind="switch",
        default_text="yes for the included plugin, which is started so",
        cli="--pre-start-required",
    ),
    Option(
        "allow-disruptive",
        "cluster: also run the @devplug_disruptive tests (kubelet restarts, plugin stop/kill, kubelet config "
        "changes on the node under test)",
        kind="switch",
        default_text="on for sim and kind, whose clusters are the harness's own",
    ),
    Option(
        "driver-cmd",
        "command line of the DRA driver under test (sim, --devplug-control-plane real); placeholders "
        "{plugins_registry}, {plugins_dir}, {cdi_root}, {node_name}, {kubeconfig}, {mock_state}, {python}. "
        "Without a directory placeholder it runs as its DaemonSet would: at the kubelet's standard paths, "
        "NODE_NAME set, in-cluster API credentials",
        default_text="the included GPU plugin's DRA mode (devplug-gpu-plugin --dra)",
        cli="--driver-cmd",
        dra=True,
    ),
    Option(
        "driver-env",
        "environment of the DRA driver under test, KEY=VALUE pairs, comma-separated (\\, is a comma in a value; "
        "sim: its process, placeholders as in --devplug-driver-cmd; kind and cluster: every container of its "
        "DaemonSet), e.g. the variables its Helm chart sets",
        cli="--driver-env",
        dra=True,
        metavar="KEY=VALUE,...",
    ),
    Option(
        "driver-name",
        "the DRA driver's name (what it registers and publishes ResourceSlices under)",
        default=DEFAULT_DRIVER_NAME,
        cli="--driver-name",
        dra=True,
    ),
    Option(
        "driver-manifest",
        "kind, cluster: the DRA driver's manifest (its ServiceAccount, RBAC and DaemonSet, "
        "as `helm template` renders them)",
        default_text="the included driver's (plugin_under_test/deploy/dra-driver.yaml)",
        cli="--driver-manifest",
        dra=True,
    ),
    Option(
        "driver-image",
        "kind, cluster: the image the driver's containers run",
        default_text="the manifest's; the included driver's is built here",
        cli="--driver-image",
        dra=True,
    ),
    # pytest-kind-ng (the kind extra) registers these itself; without it they are registered here under the same
    # names, so --help, ini-free command lines and CI recipes stay the same.
    Option("cluster-name", "kind: name of the cluster", default="pytest-kind", group="kind"),
    Option("keep-cluster", "kind: keep the cluster afterwards (the next run reuses it)", kind="switch", group="kind"),
    Option("kubeconfig", "kind: where to write the cluster's kubeconfig", group="kind"),
    Option("kind-image", "kind: node image", default_text="kind's standard image", group="kind"),
    Option("kind-bin", "kind: the kind binary", default_text="kind on PATH", group="kind"),
)

_BY_NAME = {o.name: o for o in OPTIONS}
_BY_FLAG = {o.flag: o for o in OPTIONS}


def option(name: str) -> Option:
    """The option ``name`` (``"backend"`` for ``--devplug-backend``)."""
    return _BY_NAME[name]


def _metavar(o: Option) -> str | None:
    return o.metavar or ("|".join(o.choices) if o.choices and not o.several else None)


def register(parser: pytest.Parser, *, dra: bool) -> None:
    """Add the options (``dra``: the DRA ones, else the others) and their ini keys. Every option defaults to None
    (the ini key's value or the table's default is applied by :func:`value`), so the default is declared once."""
    group = parser.getgroup(*GROUP)
    kind_group = None
    if not dra and importlib.util.find_spec("pytest_kind") is None:
        kind_group = parser.getgroup(*KIND_GROUP)
    for o in OPTIONS:
        if o.dra != dra:
            continue
        if o.group == "kind":
            if kind_group is not None:
                extra: dict[str, Any] = {"action": "store_true"} if o.kind == "switch" else {}
                kind_group.addoption(o.flag, default=None, help=o.help_text(), **extra)
            continue
        if o.kind == "switch":
            group.addoption(o.flag, dest=o.dest, action="store_true", default=None, help=o.help_text())
            if o.negative:
                group.addoption(f"--devplug-{o.negative}", dest=o.dest, action="store_false", help=o.negative_help)
            parser.addini(o.dest, f"see {o.flag}", type="bool", default=None)
        else:
            group.addoption(
                o.flag, dest=o.dest, default=None, help=o.help_text(), type=o.argparse_type, metavar=_metavar(o)
            )
            parser.addini(o.dest, o.help_text(), default=None)


def given(config: pytest.Config, name: str) -> Any:
    """What the command line or else the ini file gives for option ``name``, unchecked (None: neither gives one)."""
    o = option(name)
    found = config.getoption(o.dest, default=None)
    if found is None and o.ini is not None:
        found = config.getini(o.ini)
    return None if found in ("", []) else found


def value(config: pytest.Config, name: str) -> Any:
    """Option ``name``'s value (command line, else ini key, else the table's default), checked; a bad ini value is a
    :class:`pytest.UsageError` naming the option and what it accepts."""
    o = option(name)
    found = given(config, name)
    if found is None:
        return o.default
    try:
        return o.check(found)
    except ValueError as exc:
        raise pytest.UsageError(f"{o.named} = {found!r}: {exc}") from None


def command_line(name: str, text: object) -> list[str]:
    """Option ``name``'s command line split as a shell would; a usage error naming the option when it cannot be."""
    o = option(name)
    try:
        words = shlex.split(str(text))
    except ValueError as exc:
        raise pytest.UsageError(f"{o.named} = {text!r}: {exc}") from None
    if not words:
        raise pytest.UsageError(f"{o.named} = {text!r}: empty command line")
    return words


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_pairs(name: str, text: object) -> dict[str, str]:
    """Option ``name``'s ``KEY=VALUE`` pairs, comma-separated; ``\\,`` is a comma inside a value (a chart's
    ``FEATURE_GATES=A=true,B=false`` is ``FEATURE_GATES=A=true\\,B=false``)."""
    env: dict[str, str] = {}
    for raw in re.split(r"(?<!\\),", str(text or "")):
        pair = raw.replace("\\,", ",").strip()
        if not pair:
            continue
        key, sep, val = pair.partition("=")
        if not sep or not _ENV_NAME.fullmatch(key):
            raise pytest.UsageError(
                f"{option(name).named} = {text!r}: {pair!r} is not KEY=VALUE (KEY a variable name: letters, "
                "digits and _, not starting with a digit)"
            )
        env[key] = val
    return env


# -- devplug conformance ---------------------------------------------------------------------------


def _cli_naming(flag: str) -> str:
    o = _BY_FLAG.get(flag)
    return o.cli if o is not None and o.cli is not None else flag


def _cli_help(o: Option) -> str:
    return o.help_text(_cli_naming).replace("%", "%%")


def add_cli_flags(parser: argparse.ArgumentParser) -> None:
    """The ``devplug conformance`` flags: the options that have one, checked as pytest checks them (default None:
    an option not given is left to pytest, and so to the table's default)."""
    for o in OPTIONS:
        if o.cli is None:
            continue
        if o.kind != "switch":
            parser.add_argument(o.cli, dest=o.cli_dest, type=o.argparse_type, metavar=_metavar(o), help=_cli_help(o))
        elif o.negative is None:
            parser.add_argument(o.cli, dest=o.cli_dest, action="store_true", default=None, help=_cli_help(o))
        else:
            pair = parser.add_mutually_exclusive_group()
            pair.add_argument(o.cli, dest=o.cli_dest, action="store_true", default=None, help=_cli_help(o))
            pair.add_argument(f"--{o.negative}", dest=o.cli_dest, action="store_false", help=o.negative_help)


def cli_pytest_args(args: argparse.Namespace) -> list[str]:
    """The pytest options the given ``devplug conformance`` flags become."""
    out: list[str] = []
    for o in OPTIONS:
        given_value = None if o.cli_dest is None else getattr(args, o.cli_dest)
        if given_value is None:
            continue
        if o.kind == "switch":
            out.append(o.flag if given_value else f"--devplug-{o.negative}")
        else:
            out.append(f"{o.flag}={given_value}")
    return out


# -- reference -------------------------------------------------------------------------------------


def _cell(text: str | None) -> str:
    return "—" if not text else text.replace("|", "\\|").replace("\n", " ")


def options_markdown(options: Iterable[Option] = OPTIONS) -> str:
    """The options reference as a Markdown table (option, ini key, ``devplug conformance`` flag, default, choices,
    help), for the docs."""
    rows = ["| option | ini key | CLI flag | default | choices | help |", "|---|---|---|---|---|---|"]
    for o in options:
        flags = f"`{o.flag}`" + (f" / `--devplug-{o.negative}`" if o.negative else "")
        cli = f"`{o.cli}`" + (f" / `--{o.negative}`" if o.negative and o.cli else "") if o.cli else None
        choices = ", ".join(o.choices) + (" (comma-separated) or none" if o.several else "") if o.choices else None
        ini = f"`{o.ini}`" if o.ini else None
        rows.append(
            f"| {flags} | {_cell(ini)} | {_cell(cli)} | {_cell(o.shown_default())} | {_cell(choices)} "
            f"| {_cell(('DRA: ' if o.dra else '') + o.described)} |"
        )
    return "\n".join(rows) + "\n"
