"""The Kubernetes releases the harness reproduces, and the one a run chose with its feature gates.

A plugin meets a different kubelet on a 1.35 node than on a 1.37 one (how a second registration is treated,
whether device health reaches the pod's status, which DRA health service is called, ...). Every such difference
the harness reproduces is a :class:`Rule` in :data:`RULES`, keyed by the first release that has it and naming the
upstream file it comes from, or follows a feature gate at that release's default (``featuregates_generated.py``,
made from upstream's tables by ``tools/genfeaturegates.py``). The embedded kubelet and control plane ask a
:class:`KubeVersion` (``version.has(rule)``, ``version.gate(name)``) instead of keeping copies per release.

The pins (patch release, etcd, pause, CoreDNS, Go toolchain) are ``releases.tsv`` beside this file, which the
offline kind build reads too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Literal

from .featuregates_generated import DEPENDENCIES, GATES
from ..errors import VersionError

__all__ = [
    "DEFAULT_VERSION",
    "RULES",
    "KubeVersion",
    "Release",
    "Rule",
    "RuleName",
    "parse_feature_gates",
    "patch_of",
    "release",
    "releases",
]


@dataclass(frozen=True)
class Release:
    """One pinned release: what a node or a control plane of it is built from."""

    minor: str  # "1.37"
    kubernetes: str  # "v1.37.2"
    etcd: str
    etcd_image: str
    pause: str
    coredns: str
    #: The Go toolchain its go.mod needs (``GOTOOLCHAIN``), ``local`` for the installed one.
    go: str

    @property
    def number(self) -> int:
        """The minor as a number (37), for comparisons."""
        return int(self.minor.split(".")[1])

    @property
    def staging(self) -> str:
        """The version of its staging modules (k8s.io/api, k8s.io/kubelet, ...): ``v0.37.2``."""
        return "v0." + self.kubernetes.removeprefix("v1.")


@lru_cache(maxsize=1)
def _table() -> tuple[dict[str, Release], str]:
    rows: dict[str, Release] = {}
    default = ""
    text = resources.files(__package__).joinpath("releases.tsv").read_text()
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        minor, kubernetes, etcd, etcd_image, pause, coredns, go, mark = line.split("\t")
        rows[minor] = Release(minor, kubernetes, etcd, etcd_image, pause, coredns, go)
        if mark == "default":
            default = minor
    return rows, default


def releases() -> dict[str, Release]:
    """Every supported release by minor (``"1.35"``), oldest first."""
    return dict(_table()[0])


#: The release a run reproduces when no version is chosen.
DEFAULT_VERSION = _table()[1]


#: ``1.37``, ``v1.37``, ``1.37.1``, ``1.38.0-beta.0``: a minor, then maybe a patch release of it.
_VERSION_RE = re.compile(r"v?(?P<minor>[0-9]+\.[0-9]+)(?:\.(?P<patch>[0-9]+(?:-(?:alpha|beta|rc)\.[0-9]+)?))?")


def release(version: str | None = None) -> Release:
    """The pinned release of ``version``'s minor (``1.37``, ``v1.37``, ``1.37.1``; ``None``: :data:`DEFAULT_VERSION`):
    every patch release of a minor is modelled on its pinned one, less the rules a later patch brought
    (:meth:`KubeVersion.has`). :class:`VersionError` naming the supported ones when it is no release of them."""
    table = _table()[0]
    matched = _VERSION_RE.fullmatch(str(version or DEFAULT_VERSION).strip())
    found = table.get(matched.group("minor")) if matched else None
    if found is None:
        supported = ", ".join(f"{m} ({r.kubernetes})" for m, r in table.items())
        raise VersionError(f"Kubernetes {version!r} is not a supported version; choose one of {supported}")
    return found


def patch_of(version: str | None) -> str | None:
    """The patch release ``version`` names (``1.36.1``), ``None`` when it names only a minor."""
    matched = _VERSION_RE.fullmatch(str(version or "").strip())
    return f"{matched.group('minor')}.{matched.group('patch')}" if matched and matched.group("patch") else None


def _minor_and_patch(version: str) -> tuple[int, int]:
    """``v1.35.4`` -> (35, 4); a pre-release counts as its patch (``v1.38.0-beta.0`` -> (38, 0))."""
    matched = _VERSION_RE.fullmatch(version.strip())
    if matched is None:
        raise VersionError(f"{version!r} is no Kubernetes release tag")
    patch = (matched.group("patch") or "0").split("-")[0]
    return int(matched.group("minor").split(".")[1]), int(patch)


#: The name of every rule in :data:`RULES` (a test holds the two equal): a misspelt rule is a type error.
RuleName = Literal[
    "endpoint-per-socket",
    "podresources-get-terminal-not-found",
    "dra-checkpoint-share-id",
    "pluginwatcher-retry",
    "scheduler-dra-postfilter-silent",
    "dra-health-v1",
]


@dataclass(frozen=True)
class Rule:
    """A way the kubelet (or the API server, the scheduler) behaves from one release on, as a plugin sees it.

    ``first_in`` holds the first release tag of each minor line whose source has it (checked in the tagged source
    of ``k8s.io/kubernetes``): the release that brought it, then any older line it was backported to. Every minor
    after the first has it; an older one only from the backport's patch on."""

    name: RuleName
    first_in: tuple[str, ...]  # ("v1.35.4", "v1.34.7")
    what: str
    #: Where upstream does it (the first release's tree).
    upstream: str
    #: The upstream change that brought it (``kubernetes/kubernetes#135437``), its backports after it.
    change: str

    @property
    def since(self) -> str:
        """The first minor that has it in every patch from ``first_in[0]`` on: ``"1.37"``."""
        return f"1.{_minor_and_patch(self.first_in[0])[0]}"

    @property
    def releases(self) -> str:
        """Where it holds, as a skip message says it: ``1.37 and later``; ``1.35.4 and later, and 1.34.7 and later
        1.34 patches`` for one brought in a patch release and backported."""
        (minor, patch), *older = [_minor_and_patch(t) for t in self.first_in]
        said = f"1.{minor}" + (f".{patch}" if patch else "") + " and later"
        return said + "".join(f", and 1.{m}.{p} and later 1.{m} patches" for m, p in older)

    def holds_at(self, minor: int, patch: int) -> bool:
        """Whether release 1.<minor>.<patch> behaves as this rule says."""
        for tag in self.first_in:
            tag_minor, tag_patch = _minor_and_patch(tag)
            if tag_minor == minor:
                return patch >= tag_patch
        return minor > _minor_and_patch(self.first_in[0])[0]


RULES: dict[RuleName, Rule] = {
    r.name: r
    for r in (
        Rule(
            "endpoint-per-socket",
            ("v1.37.0",),
            "the device manager keeps one endpoint per plugin socket: a second plugin for a resource joins the first, "
            "the resource stays while any is connected, and a Register on a socket the kubelet holds is refused",
            "pkg/kubelet/cm/devicemanager/manager.go (endpointStore, PluginConnected, PluginDisconnected)",
            "kubernetes/kubernetes#135437 (DRA-like fix for device-plugin race condition problem)",
        ),
        Rule(
            "podresources-get-terminal-not-found",
            ("v1.35.4", "v1.34.7"),
            'pod-resources Get answers "pod <name> in namespace <ns> not found" for a pod that has terminated',
            "pkg/kubelet/kubelet.go (kubeletPodsProvider.GetPodByName)",
            "kubernetes/kubernetes#135485 (in v1.36.0), cherry-picked to 1.35 by #138042 and to 1.34 by #138027",
        ),
        Rule(
            "dra-checkpoint-share-id",
            ("v1.35.0",),
            "dra_manager_state carries ShareID on every prepared device, null where the driver gave none",
            "pkg/kubelet/cm/dra/state/state.go (Device.ShareID)",
            "kubernetes/kubernetes#134520 ([DRA] Add ShareID to kubelet plugin API)",
        ),
        Rule(
            "pluginwatcher-retry",
            ("v1.36.0",),
            "the plugin watcher retries a registration whose RegisterPlugin or NotifyRegistrationStatus failed",
            "pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go",
            "kubernetes/kubernetes#133335 (pluginmanager: fix handling registration failures)",
        ),
        Rule(
            "scheduler-dra-postfilter-silent",
            ("v1.37.0",),
            'a pod no node fits reads "0/N nodes are available: ... preemption: ...": DynamicResources\' PostFilter no '
            'longer adds "no new claims to deallocate, " for a pod without claims',
            "pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go (PostFilter)",
            "kubernetes/kubernetes#140222 (scheduler: reduce scheduler PostFilter event noise)",
        ),
        Rule(
            "dra-health-v1",
            ("v1.37.0",),
            "the kubelet watches DRA device health through v1.DRAResourceHealth (then v1alpha1), only for a driver "
            "that lists the service, and stops on Unimplemented",
            "pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go (pickHealthService)",
            "kubernetes/kubernetes#139477 (DRA kubelet: add v1 DRAResourceHealth gRPC API)",
        ),
    )
}


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``A=true,B=false`` as the components' ``--feature-gates`` flag reads it; :class:`VersionError` on bad syntax."""
    out: dict[str, bool] = {}
    for item in str(text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip().lower()
        if not sep or not name:
            raise VersionError(f"feature gate {item!r}: missing bool value for {name or item} (want Name=true|false)")
        if value not in ("true", "false"):
            raise VersionError(f"feature gate {item!r}: invalid value of {name}={value} (want true or false)")
        out[name] = value == "true"
    return out


@dataclass(frozen=True)
class KubeVersion:
    """The release a run reproduces and its feature gates (the release's defaults, then the run's settings).

    ``rules`` overrides a rule's release check; tests use it to switch one rule to the other release's behaviour.
    """

    release: Release
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    rules: Mapping[str, bool] = field(default_factory=dict)
    #: The patch release the run named when it is not the pinned one (``1.36.1``): judged by the pinned one's rules.
    patch: str | None = None

    @classmethod
    def of(cls, version: str | None = None, feature_gates: str | Mapping[str, bool] = "", **rules: bool) -> KubeVersion:
        """The version named (default :data:`DEFAULT_VERSION`) with ``feature_gates`` checked as that release's
        components check them (unknown gates, locked gates, unmet dependencies are :class:`VersionError`)."""
        chosen = release(version)
        gates = parse_feature_gates(feature_gates) if isinstance(feature_gates, str) else dict(feature_gates)
        unknown = sorted(set(rules) - {n.replace("-", "_") for n in RULES})
        if unknown:
            raise VersionError(f"unknown rule(s) {', '.join(unknown)}; known: {', '.join(RULES)}")
        asked = patch_of(version)
        patch = asked if asked and "v" + asked != chosen.kubernetes else None
        made = cls(chosen, gates, {k.replace("_", "-"): v for k, v in rules.items()}, patch)
        made._check_gates()
        return made

    def on_node(self, kubelet_version: str) -> KubeVersion:
        """This run's gates and rule switches on the release a node's kubelet reports (``v1.36.3``), at its patch:
        what a release-dependent check judges by on kind and a cluster. A release outside the supported ones is
        judged as the nearest supported one; an unreadable version as this run's."""
        matched = _VERSION_RE.match(kubelet_version.strip())
        if matched is None:
            return self
        number = int(matched.group("minor").split(".")[1])
        table = _table()[0]
        nearest = min(table.values(), key=lambda r: (abs(r.number - number), -r.number))
        named = f"{matched.group('minor')}.{matched.group('patch')}" if matched.group("patch") else None
        patch = named if nearest.number == number and named and "v" + named != nearest.kubernetes else None
        if nearest == self.release and patch == self.patch:
            return self
        gates = {k: v for k, v in self.feature_gates.items() if k in GATES[nearest.number]}
        return KubeVersion(nearest, gates, self.rules, patch)

    @property
    def name(self) -> str:
        """``kubernetes 1.37.2``: what the report header says; for a patch release other than the pinned one,
        ``kubernetes 1.36.1 (modelled on 1.36.3, the pinned patch release, with 1.36.1's rules)``."""
        pinned = self.release.kubernetes.removeprefix("v")
        if self.patch is None:
            return f"kubernetes {pinned}"
        return f"kubernetes {self.patch} (modelled on {pinned}, the pinned patch release, with {self.patch}'s rules)"

    def at_least(self, minor: str) -> bool:
        return self.release.number >= int(minor.split(".")[1])

    def has(self, rule: RuleName) -> bool:
        """Whether this release, at the patch the run named, behaves as ``rule`` says (unless a test switched it)."""
        if rule in self.rules:
            return self.rules[rule]
        return RULES[rule].holds_at(*_minor_and_patch(self.patch or self.release.kubernetes))

    def gate(self, name: str) -> bool:
        """Whether feature gate ``name`` is on: the run's setting, else this release's default. A gate this release
        does not have yet is off; one it no longer has (removed after GA) is on."""
        if name in self.feature_gates:
            return self.feature_gates[name]
        spec = GATES[self.release.number].get(name)
        if spec is not None:
            return spec[0]
        having = [minor for minor, gates in GATES.items() if name in gates]
        if not having:
            raise KeyError(f"{name} is not a feature gate of any supported Kubernetes release")
        return max(having) < self.release.number

    def gate_flag(self) -> str:
        """The run's gate settings as a ``--feature-gates`` value for real components (empty when none)."""
        return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))

    def _check_gates(self) -> None:
        known = GATES[self.release.number]
        problems = []
        for name, value in self.feature_gates.items():
            spec = known.get(name)
            if spec is None:
                problems.append(f"unrecognized feature gate: {name}")
            elif spec[2] and value != spec[0]:
                problems.append(
                    f"cannot set feature gate {name} to {str(value).lower()}, "
                    f"feature is locked to {str(spec[0]).lower()}"
                )
        if not problems:  # as component-base does: the dependencies of every enabled gate, once all are set
            for name, needs in sorted(DEPENDENCIES.get(self.release.number, {}).items()):
                off = [n for n in needs if n in known and not self.gate(n)]
                if name in known and self.gate(name) and off:
                    problems.append(f"{name} is enabled, but depends on features that are disabled: [{' '.join(off)}]")
        if problems:
            raise VersionError(f"Kubernetes {self.release.minor}: " + "; ".join(dict.fromkeys(problems)))
