"""pytest entry point of pytest-devplug: hooks, fixtures, markers, report sections (the options: :mod:`.options`).

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
import shlex
import time
import warnings
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pytest

from .assertions import assert_registered
from .backends import create_backend
from .backends.base import Backend, NodeSpec, PluginSpec
from .deployment import SessionDeployment
from .errors import BackendUnavailableError, DevplugAssertionError, UnsupportedOperationError
from .evidence import Evidence, collect_evidence, set_test_window
from .faults import CONTRACT, FaultInjector, MockNvmlFaults, NvmlXidFaults
from .handles import ClusterHandle, NodeHandle, PluginChanges, PluginHandle, PodFactory
from .options import CONVENTIONS, given, register
from .report import ReportWriter, is_dra_run, note_plugin, note_run
from .settings import DevplugSettings, get_settings, parse_settings
from .soakwatch import SOAK_MARKER, SoakWatch

__all__ = [
    "NODE_NAME",
    "NO_PLUGIN_MESSAGE",
    "DISRUPTIVE_MARKER",
    "GRACE_PERIOD_MARKER",
    "CONVENTION_MARKER",
    "DevplugWarning",
]

#: The node the default fixtures deploy on.
NODE_NAME = "devplug-node"
DISRUPTIVE_MARKER = "devplug_disruptive"
GRACE_PERIOD_MARKER = "devplug_grace_period"
CONVENTION_MARKER = "devplug_convention"

S = TypeVar("S")
_STATE_KEY = pytest.StashKey["_TestState"]()
#: The plugin the report header showed (None: it said a conftest overrides devplug_plugin_spec).
_HEADER_SPEC_KEY = pytest.StashKey["PluginSpec | None"]()


#: Why there is nothing to test: no plugin option, and the included plugin (its own distribution) is absent.
NO_PLUGIN_MESSAGE = (
    "no device plugin to test: no --devplug-plugin-cmd (devplug conformance: --plugin-cmd) was given, and the "
    "included GPU plugin is not installed (it is the separate distribution devplug-gpu-plugin). Either install "
    "it: pip install 'pytest-devplug[gpu-plugin]', or point at your plugin: --devplug-plugin-cmd "
    '"{python} -m my_plugin --plugin-dir {plugin_dir}" --devplug-resource-name example.com/widget'
)


def included_plugin_installed() -> bool:
    """Whether the included GPU plugin can be started here (``python -m devplug_gpu_plugin``)."""
    return importlib.util.find_spec("devplug_gpu_plugin") is not None


def pytest_addoption(parser: pytest.Parser) -> None:
    """The options and ini keys of the table in :mod:`.options` (the DRA ones: ``dra/plugin.py``)."""
    register(parser, dra=False)


def pytest_configure(config: pytest.Config) -> None:
    """Parse the options once: a bad value stops the run here, as one usage error (exit 4), before any test."""
    if not config.getoption("help", default=False):
        parse_settings(config)
    report = given(config, "report")
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


def fixture_overrides(config: pytest.Config, name: str, ours: object) -> list[str]:
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
    return subject_header(
        config,
        s.plugin,
        _describe(s.backend, s.plugin),
        what="the plugin",
        fixture="devplug_plugin_spec",
        ours=devplug_plugin_spec,
        key=_HEADER_SPEC_KEY,
    )


def subject_header(
    config: pytest.Config,
    spec: S,
    description: str,
    *,
    what: str,
    fixture: str,
    ours: object,
    key: pytest.StashKey[S | None],
) -> str:
    """The header's line on what the run tests (``what``: the plugin, the DRA driver): its ``description`` from the
    options, or, when a conftest overrides ``fixture`` (``ours``: the harness's), a pointer to the line printed when
    what that fixture names is deployed (its value needs a fixture run). ``key`` keeps what was shown (``None``: the
    pointer), so the deployment prints only what the header did not show."""
    s = get_settings(config)
    overrides = fixture_overrides(config, fixture, ours)
    if overrides:
        config.stash[key] = None
        return (
            f"devplug: backend={s.backend}, {_kubernetes_header(s)}{_control_plane_header(s)}; "
            f"{fixture} is overridden in {', '.join(overrides)}: {what} under test is printed when it is deployed"
        )
    config.stash[key] = spec
    return f"devplug: backend={s.backend}, {_kubernetes_header(s)}{_control_plane_header(s)}; {description}"


def _kubernetes_header(s: DevplugSettings) -> str:
    """``kubernetes 1.37.2`` (with the run's feature gates); on kind and a cluster the nodes' release is told once
    they are known."""
    kube = s.backend_options.kube
    gates = f" (feature gates {kube.gate_flag()})" if kube.feature_gates else ""
    if s.backend == "sim":
        return f"{kube.name}{gates}"
    return (
        f"{kube.name} asked{gates}, the nodes' release told when known"
        if s.backend_options.kube_chosen
        else f"kubernetes: the nodes' release, told when known{gates}"
    )


def _control_plane_header(s: DevplugSettings) -> str:
    """``, control-plane=real (kubernetes v1.37.2, etcd v3.7.0 from ...)``: the binaries found now (no download)."""
    if s.backend != "sim" or s.backend_options.control_plane != "real":
        return ""
    from .controlplane import resolve
    from .errors import BinariesNotFoundError

    try:
        found = resolve(
            s.backend_options.k8s_bin_dir, version=s.backend_options.kube.release.minor, download=False
        ).describe()
    except BinariesNotFoundError:
        found = "binaries to be downloaded"
    return f", control-plane=real ({found})"


def say(config: pytest.Config, line: str) -> None:
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
    say(config, f"devplug: plugin under test (from devplug_plugin_spec): {_describe(backend, spec)}")


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
            say(pytestconfig, f"devplug: real control plane up; kubectl --kubeconfig {handle.kubeconfig} get nodes")
        yield handle
    finally:
        backend.close()
        kept = getattr(backend, "kept", None)
        if kept:
            say(pytestconfig, f"devplug: the control plane is kept (--keep-cluster): {kept}")


@pytest.fixture(scope="session")
def devplug_node_spec(devplug_plugin_spec: PluginSpec, devplug_settings: DevplugSettings) -> NodeSpec:
    """The node under test as the run wants it (a NodeSpec): every node the suite adds for a copy of the plugin (the
    soak's, a single-numa-node one) is made like it (``dataclasses.replace``), its device nodes and PCI node too."""
    return NodeSpec(
        NODE_NAME,
        numa_nodes=max(devplug_plugin_spec.numa_nodes, 1),
        resource_name=devplug_plugin_spec.resource_name,
        device_nodes=devplug_settings.device_nodes,
        pci_node=devplug_settings.pci_node,
    )


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


class PluginDeployable:
    """The device plugin under test as the session deploys it (a :class:`~pytest_devplug.deployment.Deployable`)."""

    what = "the plugin under test"

    def __init__(self, cluster: ClusterHandle, node: NodeHandle, spec: PluginSpec) -> None:
        self.cluster, self.node, self.spec = cluster, node, spec

    def deploy(self, changes: PluginChanges) -> PluginHandle:
        return self.cluster.deploy(self.node, self.spec, changes=changes)

    def wait_ready(self, handle: PluginHandle) -> None:
        # The kubelet's capacity is whatever ListAndWatch lists (replicas, MIG devices): no count demanded.
        for resource in self.spec.resource_names:
            assert_registered(handle, resource=resource)
        handle.wait_listed()

    def observe(self, handle: PluginHandle) -> tuple[tuple[int | None, int | None], ...]:
        """(capacity, allocatable) of every resource the plugin advertises."""
        return tuple(self.node.counts(r) for r in self.spec.resource_names)

    def came_up(self, handle: PluginHandle) -> None:
        for resource in self.spec.resource_names:
            _warn_odd_ids(resource, self.node.device_ids(resource))

    def remove(self) -> None:
        self.cluster.backend.remove_plugin(self.node.name)


def plugin_deployment(cluster: ClusterHandle, node: NodeHandle, spec: PluginSpec) -> SessionDeployment[PluginHandle]:
    """The session's deployment of the plugin ``spec`` on ``node``, as the plugin fixtures keep it."""
    return SessionDeployment(PluginDeployable(cluster, node, spec))


def node_kubernetes_version(config: pytest.Config, cluster: ClusterHandle, node: str) -> str:
    """What the report says of the Kubernetes the subject ran on: the node's kubelet version (the embedded kubelet's
    is the release it behaves as). Where the run chose a release and the node runs another, say so on the terminal
    too: every release-dependent check judges by the node's."""
    s = get_settings(config)
    version = str(cluster.backend.get_node(node).get("status", {}).get("nodeInfo", {}).get("kubeletVersion") or "")
    if not version:
        return "unknown: the node reports no kubelet version"
    what = f"kubernetes {version.removeprefix('v')}" + (" (the embedded kubelet)" if s.backend == "sim" else "")
    asked = s.backend_options.kube
    if s.backend == "sim" and asked.patch is not None:
        what = f"{asked.name} (the embedded kubelet)"
    if s.backend != "sim":
        mismatch = s.backend_options.kube_chosen and not version.removeprefix("v").startswith(asked.release.minor + ".")
        note = f"; --devplug-kubernetes-version asked for {asked.release.minor}: MISMATCH" if mismatch else ""
        say(config, f"devplug: node {node} runs {what}{note}")
        what += note
    return what


@pytest.fixture(scope="session")
def _devplug_deployment(
    pytestconfig: pytest.Config,
    devplug_settings: DevplugSettings,
    devplug_cluster: ClusterHandle,
    devplug_node: NodeHandle,
    devplug_plugin_spec: PluginSpec,
) -> SessionDeployment[PluginHandle]:
    _announce_plugin(pytestconfig, devplug_settings.backend, devplug_plugin_spec)
    note_run(
        pytestconfig,
        devplug_settings.backend,
        devplug_plugin_spec,
        node_kubernetes_version(pytestconfig, devplug_cluster, devplug_node.name),
    )
    return plugin_deployment(devplug_cluster, devplug_node, devplug_plugin_spec)


@pytest.fixture(scope="session")
def devplug_soak(
    pytestconfig: pytest.Config,
    devplug_cluster: ClusterHandle,
    devplug_node: NodeHandle,
    devplug_plugin_spec: PluginSpec,
    devplug_node_spec: NodeSpec,
) -> Iterator[SoakWatch]:
    """The long-lived connection watch (a SoakWatch), for the whole session: a second copy of the plugin on a node of
    its own, registered once and left alone; ``.verdict(timeout)`` waits until it has been registered for
    ``--devplug-soak`` seconds. Started by the first test of a session that collected a soak check."""
    with SoakWatch(
        devplug_cluster, devplug_plugin_spec, soak_seconds(pytestconfig), devplug_node.name, devplug_node_spec
    ) as watch:
        yield watch


@pytest.fixture(scope="session", autouse=True)
def _devplug_soak_early(request: pytest.FixtureRequest) -> None:
    """Start the soak with the session's first test when a soak check is collected and the soak is on."""
    items = request.session.items
    if soak_seconds(request.config) > 0 and any(i.get_closest_marker(SOAK_MARKER) is not None for i in items):
        request.getfixturevalue("devplug_soak")


@pytest.fixture
def devplug_plugin(
    request: pytest.FixtureRequest,
    _devplug_deployment: SessionDeployment[PluginHandle],
    devplug_plugin_spec: PluginSpec,
) -> Iterator[PluginHandle]:
    """The plugin under test (a PluginHandle), registered and ready. Deployed once per session; a test that changed it
    (faults, stop/kill/restart, ``devplug_faults`` used) gets it redeployed clean after it."""
    for mark in request.node.iter_markers(CONVENTION_MARKER):
        name = mark.args[0] if mark.args else "?"
        if name not in devplug_plugin_spec.conventions:
            pytest.skip(
                f"convention check {name!r} ({CONVENTIONS.get(name, 'unknown convention')}): the kubelet does not "
                f"require it and the plugin under test ({devplug_plugin_spec.resource_name}) does not declare it "
                f"(--devplug-conventions {name} switches it on)"
            )
    state = _state(request)
    state.backend, state.node = _devplug_deployment.node.backend, _devplug_deployment.node.name
    handle = _devplug_deployment.get(request.node.nodeid)
    yield handle
    if used_fixture(request, "devplug_faults"):
        _devplug_deployment.faults_handed_out()
    _devplug_deployment.reset_if_needed(request.node.nodeid)


def used_fixture(request: pytest.FixtureRequest, name: str) -> bool:
    """Whether the test asked for fixture ``name`` (after an interrupt, Ctrl-C or SIGTERM, pytest tears a test down
    at session end with its funcargs already None: then it did not)."""
    return name in (getattr(request.node, "funcargs", None) or {})


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
    request: pytest.FixtureRequest, _devplug_deployment: SessionDeployment[PluginHandle]
) -> Iterator[PluginHandle]:
    """The plugin under test, deployed but not waited for: for tests that judge registration themselves."""
    state = _state(request)
    state.backend, state.node = _devplug_deployment.node.backend, _devplug_deployment.node.name
    yield _devplug_deployment.started()
    _devplug_deployment.reset_if_needed(request.node.nodeid)


@pytest.fixture
def devplug_pod(
    request: pytest.FixtureRequest,
    devplug_cluster: ClusterHandle,
    devplug_node: NodeHandle,
    devplug_plugin: PluginHandle,
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
    return (
        report.failed
        and call.when != "teardown"
        and call.excinfo is not None
        and call.excinfo.errisinstance(UnsupportedOperationError)
    )


def _uses_devplug(item: pytest.Item) -> bool:
    return any(f.startswith("devplug_") for f in getattr(item, "fixturenames", ()))


def _labelled_skip(item: pytest.Item, longrepr: tuple[str, int, str]) -> tuple[str, int, str]:
    """A skip raised in a fixture or helper points at the test and names it: ``-rs`` would otherwise list
    every such skip under the fixture's line, merging tests that skipped for different reasons."""
    path, lineno, reason = longrepr
    name = item.name
    prefix = "Skipped: "
    text = reason[len(prefix) :] if reason.startswith(prefix) else reason
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
