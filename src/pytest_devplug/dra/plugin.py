"""pytest entry point of the DRA side: its options (in the ``devplug`` group), fixtures and report evidence.

Fixtures, from widest to narrowest:

- ``devplug_driver_spec`` (session): the DRA driver to deploy; override it in a ``conftest.py`` for your driver.
- ``devplug_dra_node`` (session): the node the driver runs on, with its kubelet's DRA side (``DRANodeHandle``).
- ``devplug_driver`` (function): the driver, registered and publishing its slices; deployed once per session and
  started again (or redeployed, after a fault) after a test that changed it.
- ``devplug_driver_started`` (function): deployed, not waited for.
- ``devplug_claims`` (function): makes DeviceClasses, ResourceClaims, templates and pods using them; deletes them
  after the test.
- ``devplug_dra_faults`` (function): the driver's :class:`~pytest_devplug.dra.faults.DRAFaultInjector`.
- ``devplug_dra_resync`` (session): a second copy of the driver on a node of its own whose kubelet restarts once, for
  the check of the slices published again after a kubelet start (started with the first test when it is collected).

DRA needs the API server: run with ``--devplug-control-plane real`` (``devplug conformance --dra`` does);
without it the DRA fixtures skip saying so.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..backends.base import NodeSpec
from ..errors import DevplugAssertionError, UnsupportedOperationError
from ..backends.dra import DriverSpec, dra_of
from ..deployment import SessionDeployment
from ..handles import ClusterHandle, PluginChanges
from ..options import command_line, env_pairs, given, option, register, value
from ..plugin import (
    NODE_NAME,
    fixture_overrides,
    included_plugin_installed,
    node_kubernetes_version,
    say,
    subject_header,
    used_fixture,
)
from ..settings import DevplugSettings, get_settings
from ..report import is_dra_run, mark_dra_run, note_driver
from .assertions import assert_driver_registered, assert_slices_published, dra_evidence
from .faults import DRA_CONTRACT, DRAFaultInjector, DRAMockNvmlFaults, DRANvmlXidFaults
from .handles import ClaimFactory, DRANodeHandle, DriverHandle
from .resyncwatch import RESYNC_MARKER, ResyncWatch

#: The marker of a check about a bug inherited from an upstream library (kubernetes/kubernetes#140011's).
UPSTREAM_LIBRARY_BUG_MARKER = "upstream_library_bug"

__all__ = ["DRASettings", "default_driver_argv", "get_dra_settings"]

_SETTINGS_KEY = pytest.StashKey["DRASettings"]()
_DRIVER_KEY = pytest.StashKey["tuple[DriverHandle, ClaimFactory | None]"]()
#: The driver the report header showed (None: it said a conftest overrides devplug_driver_spec).
_HEADER_DRIVER_KEY = pytest.StashKey["DriverSpec | None"]()
#: The DRA suite, as ``devplug conformance --dra`` (its directory) or ``pytest --pyargs`` (its module) names it.
_SUITE_DIR = Path(__file__).parent / "conformance"
_SUITE_MODULE = f"{__package__}.conformance"


@dataclass(frozen=True)
class DRASettings:
    """The DRA options as parsed once (``pytest_configure``)."""

    driver: DriverSpec
    #: No driver option given: the included GPU plugin's DRA mode is the driver under test.
    included: bool


def default_driver_argv(driver_name: str) -> list[str]:
    """The included GPU plugin as a DRA driver on the mock NVML, at the kubelet's standard paths, publishing its
    devices' status in the claims (so the device-status check judges code we own)."""
    return [
        sys.executable,
        "-m",
        "devplug_gpu_plugin",
        "--dra",
        "--device-status",
        "--driver-name",
        driver_name,
        "--nvml",
        "mock",
        "--mock-state",
        "{mock_state}",
    ]


def pytest_addoption(parser: pytest.Parser) -> None:
    """The DRA options of the table in :mod:`..options`."""
    register(parser, dra=True)


def dra_settings_from_config(config: pytest.Config, base: DevplugSettings) -> DRASettings:
    name = str(value(config, "driver-name"))
    cmd = given(config, "driver-cmd")
    manifest = given(config, "driver-manifest")
    image = given(config, "driver-image")
    if manifest and not Path(str(manifest)).is_file():
        raise pytest.UsageError(f"{option('driver-manifest').named} = {manifest!r}: no such file")
    env = env_pairs("driver-env", given(config, "driver-env"))
    included = not (cmd or manifest or image)
    argv: list[str] = []
    if cmd:
        argv = command_line("driver-cmd", cmd)  # placeholders stay: DriverSpec.command fills them on the driver's node
    elif included:
        argv = default_driver_argv(name)
    explicit_mock = given(config, "mock")
    mock = included if explicit_mock is None else bool(explicit_mock)
    spec = DriverSpec(
        driver_name=name,
        argv=tuple(argv),
        image=str(image) if image else None,
        manifest=str(manifest) if manifest else None,
        env=env,
        mock=mock,
        gpus=base.plugin.gpus,
        numa_nodes=base.plugin.numa_nodes,
        gpu_model=base.plugin.gpu_model,
        mig=base.plugin.mig,
    )
    return DRASettings(spec, included=included)


def get_dra_settings(config: pytest.Config) -> DRASettings:
    settings = config.stash.get(_SETTINGS_KEY, None)
    if settings is None:
        settings = config.stash[_SETTINGS_KEY] = dra_settings_from_config(config, get_settings(config))
    return settings


def _runs_the_suite(config: pytest.Config) -> bool:
    """Whether the run's arguments name the DRA suite (or a part of it)."""
    for arg in config.args:
        target = arg.split("::", 1)[0]
        if config.option.pyargs and (target == _SUITE_MODULE or target.startswith(f"{_SUITE_MODULE}.")):
            return True
        path = (config.invocation_params.dir / target).resolve()
        if path == _SUITE_DIR or _SUITE_DIR in path.parents:
            return True
    return False


def _is_a_dra_run(config: pytest.Config) -> bool:
    """A run that judges a DRA driver: its arguments name the DRA suite (``devplug conformance --dra``), a driver
    command is given (``--devplug-driver-cmd`` / ini), or a conftest overrides ``devplug_driver_spec``."""
    if not get_dra_settings(config).included or _runs_the_suite(config):
        return True
    return bool(fixture_overrides(config, "devplug_driver_spec", devplug_driver_spec))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Parse the DRA options once, after the device-plugin ones they build on: a bad value stops the run here; say
    whether the run judges a DRA driver (the header and ``--devplug-report`` then describe it)."""
    if not config.getoption("help", default=False) and _is_a_dra_run(config):
        mark_dra_run(config)
    config.addinivalue_line(
        "markers",
        f"{RESYNC_MARKER}: the verdict on a driver's slices after a kubelet start; runs last, "
        "its node's kubelet restarts when the first DRA check begins (overlapped with the suite)",
    )
    config.addinivalue_line(
        "markers",
        f"{UPSTREAM_LIBRARY_BUG_MARKER}: a check of a bug drivers inherit from an upstream library (its failure names "
        "the report and the fixed release); deselect it knowingly with -m 'not upstream_library_bug' until the driver "
        "can upgrade",
    )


def _describe_driver(spec: DriverSpec, backend: str) -> str:
    """The embedded kubelet runs the driver's command; kind and a cluster run its DaemonSet."""
    if backend == "sim":
        how = "at the kubelet's standard paths" if spec.uses_standard_paths() else "with the node's paths as flags"
        what = f"{shlex.join(spec.argv)} ({how})"
    else:
        image = spec.image or ("built here" if spec.manifest is None else "as in the manifest")
        what = f"a DaemonSet from {spec.manifest or 'the included manifest'}, image {image}"
    return f"driver={spec.driver_name} mock={spec.mock} DRA driver: {what}"


def pytest_report_header(config: pytest.Config) -> str | None:
    """In a DRA run, the driver under test, as the device plugin's header line says the plugin."""
    if not is_dra_run(config):
        return None
    spec = get_dra_settings(config).driver
    return subject_header(
        config,
        spec,
        _describe_driver(spec, get_settings(config).backend),
        what="the DRA driver",
        fixture="devplug_driver_spec",
        ours=devplug_driver_spec,
        key=_HEADER_DRIVER_KEY,
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The resync verdict runs last, so the driver's resync delay overlaps every other check."""
    last = [i for i in items if i.get_closest_marker(RESYNC_MARKER) is not None]
    if last:
        items[:] = [i for i in items if i.get_closest_marker(RESYNC_MARKER) is None] + last


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def devplug_driver_spec(pytestconfig: pytest.Config) -> DriverSpec:
    """What ``devplug_driver`` deploys. Override in your conftest.py to test your own DRA driver."""
    settings = get_dra_settings(pytestconfig)
    if settings.included and not included_plugin_installed():
        pytest.exit(
            "devplug: no DRA driver to test: no --devplug-driver-cmd (devplug conformance --dra: --driver-cmd) "
            "was given and the included GPU plugin is not installed: pip install 'pytest-devplug[gpu-plugin]', or "
            '--devplug-driver-cmd "my-kubelet-plugin" --devplug-driver-name example.com/widget',
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
    return settings.driver


@pytest.fixture(scope="session")
def devplug_dra_node(devplug_cluster: ClusterHandle) -> DRANodeHandle:
    """The node (a DRANodeHandle) the DRA driver runs on, with its kubelet's DRA side, for the whole session."""
    dra = dra_of(devplug_cluster.backend)
    name = devplug_cluster.backend.ensure_node(NodeSpec(NODE_NAME))
    return DRANodeHandle(
        devplug_cluster.backend,
        dra,
        name,
        timeout=devplug_cluster.timeout,
        reregistration_timeout=devplug_cluster.reregistration_timeout,
    )


class DriverDeployable:
    """The DRA driver under test as the session deploys it (a :class:`~pytest_devplug.deployment.Deployable`)."""

    what = "the DRA driver under test"

    def __init__(self, node: DRANodeHandle, spec: DriverSpec) -> None:
        self.node, self.spec = node, spec

    def deploy(self, changes: PluginChanges) -> DriverHandle:
        self.node.dra.deploy_driver(self.node.name, self.spec)
        return DriverHandle(self.node, self.spec, changes=changes)

    def wait_ready(self, handle: DriverHandle) -> None:
        assert_driver_registered(handle)
        assert_slices_published(handle)

    def observe(self, handle: DriverHandle) -> list[tuple[str, str]]:
        """The devices it publishes: a kubelet start deletes the node's slices."""
        return handle.devices()

    def came_up(self, handle: DriverHandle) -> None:
        pass

    def remove(self) -> None:
        self.node.dra.remove_driver(self.node.name)


def driver_deployment(node: DRANodeHandle, spec: DriverSpec) -> SessionDeployment[DriverHandle]:
    """The session's deployment of the driver ``spec`` on ``node``, as the DRA fixtures keep it."""
    return SessionDeployment(DriverDeployable(node, spec))


@pytest.fixture(scope="session")
def _devplug_driver_deployment(
    pytestconfig: pytest.Config,
    devplug_cluster: ClusterHandle,
    devplug_dra_node: DRANodeHandle,
    devplug_driver_spec: DriverSpec,
) -> SessionDeployment[DriverHandle]:
    if pytestconfig.stash.get(_HEADER_DRIVER_KEY, None) != devplug_driver_spec:  # unless the header showed exactly it
        say(
            pytestconfig,
            f"devplug: DRA driver under test: {_describe_driver(devplug_driver_spec, devplug_dra_node.backend.name)}",
        )
    kubernetes = node_kubernetes_version(pytestconfig, devplug_cluster, devplug_dra_node.name)
    note_driver(pytestconfig, get_settings(pytestconfig).backend, devplug_driver_spec, kubernetes)
    return driver_deployment(devplug_dra_node, devplug_driver_spec)


@pytest.fixture
def devplug_driver(
    request: pytest.FixtureRequest, _devplug_driver_deployment: SessionDeployment[DriverHandle]
) -> Iterator[DriverHandle]:
    """The DRA driver under test (a DriverHandle), registered with the kubelet and publishing its ResourceSlices.
    Deployed once per session; a test that stopped, killed or faulted it gets it started again (or redeployed)."""
    handle = _devplug_driver_deployment.get(request.node.nodeid)
    request.node.stash[_DRIVER_KEY] = (handle, None)
    yield handle
    if used_fixture(request, "devplug_dra_faults"):
        _devplug_driver_deployment.faults_handed_out()
    _devplug_driver_deployment.reset_if_needed(request.node.nodeid)


@pytest.fixture
def devplug_driver_started(
    request: pytest.FixtureRequest, _devplug_driver_deployment: SessionDeployment[DriverHandle]
) -> Iterator[DriverHandle]:
    """The DRA driver under test, deployed but not waited for: for checks that judge registration themselves."""
    handle = _devplug_driver_deployment.started()
    request.node.stash[_DRIVER_KEY] = (handle, None)
    yield handle
    _devplug_driver_deployment.reset_if_needed(request.node.nodeid)


@pytest.fixture(scope="session")
def devplug_dra_resync(
    devplug_cluster: ClusterHandle, devplug_dra_node: DRANodeHandle, devplug_driver_spec: DriverSpec
) -> Iterator[ResyncWatch]:
    """A second copy of the driver on a node of its own (a ResyncWatch), for the whole session: its kubelet restarts
    once, when the first DRA check begins; ``.verdict()`` judges the slices the driver published again since."""
    with ResyncWatch(devplug_cluster, devplug_driver_spec, devplug_dra_node.name) as watch:
        yield watch


@pytest.fixture(scope="session", autouse=True)
def _devplug_dra_resync_early(request: pytest.FixtureRequest) -> None:
    """Start the resync watch with the session's first test when its verdict is collected."""
    if any(i.get_closest_marker(RESYNC_MARKER) is not None for i in request.session.items):
        request.getfixturevalue("devplug_dra_resync")


@pytest.fixture
def devplug_claims(
    request: pytest.FixtureRequest, devplug_cluster: ClusterHandle, devplug_driver: DriverHandle
) -> Iterator[ClaimFactory]:
    """A ClaimFactory for the driver under test: ``.claim(count=1)``, ``.template()``, ``.device_class()``,
    ``.pod(claims=[...], wait=True)``; everything it made is deleted after the test (pods first)."""
    factory = ClaimFactory(
        devplug_cluster.backend, devplug_driver, timeout=devplug_cluster.timeout, prefix=request.node.name
    )
    request.node.stash[_DRIVER_KEY] = (devplug_driver, factory)
    yield factory
    errors = factory.cleanup()
    if errors:
        raise RuntimeError("devplug_claims could not delete: " + "; ".join(errors))


@pytest.fixture
def devplug_dra_faults(pytestconfig: pytest.Config, devplug_driver: DriverHandle) -> DRAFaultInjector:
    """How the DRA fault checks make the driver fail (a DRAFaultInjector), for one test; the driver is redeployed
    after it. Default: the mock NVML for a driver deployed with it (the included driver: a lost GPU, ``fail_allocate``;
    another driver: what NVML expresses, a critical Xid); otherwise override this fixture in your conftest.py.
    Without an injector a check needing it skips (``--devplug-missing-faults=fail``: fails)."""
    if devplug_driver.spec.mock:
        node, dra = devplug_driver.node.name, devplug_driver.dra
        kind = DRAMockNvmlFaults if get_dra_settings(pytestconfig).included else DRANvmlXidFaults
        return kind(
            devplug_driver, lambda: dra.read_driver_mock_state(node), lambda s: dra.write_driver_mock_state(node, s)
        )
    reason = (
        f"needs a fault injector: the DRA driver under test ({devplug_driver.name}) does not read the mock-NVML state "
        f"and no conftest overrides the devplug_dra_faults fixture to return a {DRA_CONTRACT}"
    )
    if get_settings(pytestconfig).missing_faults == "fail":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


# -- report evidence -------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A DRA check that failed with a plain assertion gets the driver's evidence (the helpers attach their own)."""
    report = yield
    found = item.stash.get(_DRIVER_KEY, None)
    if not report.failed or call.excinfo is None or call.when == "teardown" or found is None:
        return report
    if call.excinfo.errisinstance((DevplugAssertionError, UnsupportedOperationError)):
        return report
    driver, factory = found
    for ev in dra_evidence(driver, list(factory.pods) if factory is not None else []):
        report.sections.append((f"devplug: {ev.title}", ev.text))
    return report
