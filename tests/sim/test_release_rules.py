"""Every release-dependent rule of the embedded kubelet, judged on both sides of the release that brought it.

Each rule of ``kubeletmodel.releases.RULES`` (and each feature gate the embedded kubelet follows) has a test here
that runs the behaviour at releases written as literals (:func:`boundary`: the last release without the rule, the
first with it, the default) and asserts what differs; switching the rule to the other release's behaviour
(``KubeVersion.of(..., rule=False)``) fails the test. The last test checks that no rule is left without one and
that the tests' releases are the table's. ``tools/rule_mutants.py`` moves each rule and lists what catches it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from .dm_helpers import GPU, DmWaiter, FakePlugin, dm_capacity_probe
from ._helpers import GPU as PLUGIN_GPU
from ._helpers import pod, start_gpu_node, wait_for
from .dra.dra_fakes import FakeDriver, remove_root, short_root
from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.api.podresources import v1_pb2 as pr
from pytest_devplug.api.podresources import v1_pb2_grpc as pr_grpc
from pytest_devplug.kubeletmodel.releases import DEFAULT_VERSION, RULES, KubeVersion
from pytest_devplug.sim.embeddedplane import EmbeddedPlane
from pytest_devplug.sim.devicemanager import DeviceManager
from pytest_devplug.sim.dra.health import HealthInfoCache
from pytest_devplug.sim.dra.plugins import DRAPluginManager
from pytest_devplug.errors import DRAPluginError
from pytest_devplug.sim.pluginwatcher import DRA_PLUGIN_TYPE, PluginWatcher

T = 10.0
#: test name -> (the rule it judges, the first release with it as the test states it).
COVERED: dict[str, tuple[str, str]] = {}


def boundary(rule: str, first: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Judge ``rule`` on both sides of ``first``, the first release tag that has it (``1.37.0``), written here rather
    than read from ``RULES``: moving the rule in the table by one release then fails the test on one side.

    The test runs as the last release without the rule (``has`` False: the patch before, or the previous minor's
    pinned release), the first with it, the default release (so switching the rule off there fails too), and the
    default release with the rule switched off by hand, which must behave as the older releases: the test can tell
    the two apart."""
    minor, patch = first.rsplit(".", 1)
    before = f"{minor}.{int(patch) - 1}" if int(patch) else f"1.{int(minor.split('.')[1]) - 1}"
    cases = [
        pytest.param(KubeVersion.of(before), False, id=before),
        pytest.param(KubeVersion.of(first), True, id=first),
        pytest.param(KubeVersion.of(DEFAULT_VERSION), True, id=f"{DEFAULT_VERSION}-default"),
        pytest.param(
            KubeVersion.of(DEFAULT_VERSION, **{rule.replace("-", "_"): False}),
            False,
            id=f"{DEFAULT_VERSION}-switched-off",
        ),
    ]

    def mark(fn: Callable[..., None]) -> Callable[..., None]:
        COVERED[fn.__name__] = (rule, first)
        return pytest.mark.parametrize(("kube", "has"), cases)(fn)

    return mark


# --- device manager -------------------------------------------------------------------------------------------


def _counts(dm: DeviceManager, w: DmWaiter, want: tuple[int | None, int | None]) -> None:
    w.until(f"capacity/allocatable {want}", dm_capacity_probe(dm), lambda s: s == want, T)


def _a_then_b(
    dm_make: Callable[..., tuple[DeviceManager, DmWaiter]], dm_fake: Callable[..., FakePlugin], kube: KubeVersion
) -> tuple[DeviceManager, DmWaiter, FakePlugin, FakePlugin]:
    """Plugin a (2 devices) registered, then b (3 devices) on a socket of its own: the resource lists b's."""
    dm, w = dm_make(kube=kube)
    a = dm_fake("a.sock")
    a.register()
    _counts(dm, w, (2, 2))
    b = dm_fake("b.sock", devices=[pb.Device(ID=f"b-{i}", health="Healthy") for i in range(3)])
    b.register()
    _counts(dm, w, (3, 3))
    return dm, w, a, b


@boundary("endpoint-per-socket", "1.37.0")
def test_register_on_a_held_socket(
    dm_make: Callable[..., tuple[DeviceManager, DmWaiter]],
    dm_fake: Callable[..., FakePlugin],
    kube: KubeVersion,
    has: bool,
) -> None:
    """1.37 refuses a Register naming a socket whose stream the kubelet still holds (after dialling it and asking
    its options); before, the kubelet takes it as the resource's plugin again."""
    dm, w = dm_make(kube=kube)
    a = dm_fake("a.sock")
    a.register()
    _counts(dm, w, (2, 2))
    if has:
        with pytest.raises(grpc.RpcError) as exc:
            a.register()
        assert exc.value.code() == grpc.StatusCode.UNKNOWN
        assert exc.value.details() == f"device plugin already connected: {a.sock}"
    else:
        a.register()
        w.until("a second ListAndWatch", lambda: a.law_calls, lambda n: n == 2, T)
    assert dm.capacity()[:2] == ({GPU: 2}, {GPU: 2})


@boundary("endpoint-per-socket", "1.37.0")
def test_a_refused_register_leaves_its_socket_held(
    dm_make: Callable[..., tuple[DeviceManager, DmWaiter]],
    dm_fake: Callable[..., FakePlugin],
    kube: KubeVersion,
    has: bool,
) -> None:
    """1.37's registration server drops the incumbent's client along with the refused one, so the incumbent's exit
    disconnects nothing: its devices stay as listed and every Register on that socket is refused until the kubelet
    restarts (kubernetes/kubernetes#139338 documents the indefinite refusals). Before 1.37 the second Register
    replaces the first and the exit disconnects it."""
    dm, w = dm_make(kube=kube)
    a = dm_fake("a.sock")
    a.register()
    _counts(dm, w, (2, 2))
    if not has:
        a.register()
        w.until("a second ListAndWatch", lambda: a.law_calls, lambda n: n == 2, T)
        a.stop()
        _counts(dm, w, (2, 0))
        return
    with pytest.raises(grpc.RpcError):
        a.register()
    a.stop()
    again = dm_fake("a.sock")  # the plugin restarted on the same socket
    with pytest.raises(grpc.RpcError) as exc:
        again.register()
    assert exc.value.details() == f"device plugin already connected: {again.sock}"
    assert dm.capacity()[:2] == ({GPU: 2}, {GPU: 2})  # never disconnected: nothing turned unhealthy
    dm.stop()
    dm2, w2 = dm_make(kube=kube)  # a kubelet restart forgets the endpoint (and removes the plugin's socket)
    dm_fake("a.sock").register()
    _counts(dm2, w2, (2, 2))


@boundary("endpoint-per-socket", "1.37.0")
def test_earlier_plugins_exit_after_a_newer_one_registered(
    dm_make: Callable[..., tuple[DeviceManager, DmWaiter]],
    dm_fake: Callable[..., FakePlugin],
    kube: KubeVersion,
    has: bool,
) -> None:
    """A rollout with maxSurge: b registers beside a, then a exits. 1.37 keeps b (another endpoint of the resource
    is still connected: nothing turns unhealthy); before, the registration server disconnects the resource's current
    client, b, when a's stream ends, and every device is unhealthy until b registers again."""
    dm, w, a, b = _a_then_b(dm_make, dm_fake, kube)
    a.stop()
    if has:
        changes = w.changes
        b.set_devices([pb.Device(ID=f"b-{i}", health="Healthy") for i in range(3)])
        w.until("b's next ListAndWatch message counted", lambda: w.changes, lambda c: c > changes, T)
        assert dm.capacity()[:2] == ({GPU: 3}, {GPU: 3})
        assert dm.plugin_socket(GPU) == b.sock
    else:
        _counts(dm, w, (3, 0))
        assert dm.plugin_socket(GPU) is None
        b.register()  # b's own recovery: a new Register
        _counts(dm, w, (3, 3))


@boundary("endpoint-per-socket", "1.37.0")
def test_last_endpoint_of_a_resource_going(
    dm_make: Callable[..., tuple[DeviceManager, DmWaiter]],
    dm_fake: Callable[..., FakePlugin],
    kube: KubeVersion,
    has: bool,
) -> None:
    """The newer plugin exits first: 1.37 makes the earlier one, still connected, the resource's again (its next
    list counts); before, the earlier one is no client of the kubelet's any more, so the resource goes unhealthy."""
    dm, w, a, b = _a_then_b(dm_make, dm_fake, kube)
    b.stop()
    if has:
        # b's stream end first (a's next list alone would already make the counts 2/2)
        w.until(
            "the earlier plugin the resource's again", lambda: dm.plugin_socket(GPU), lambda sock: sock == a.sock, T
        )
        a.set_devices([pb.Device(ID=f"dev-{i}", health="Healthy") for i in range(2)])
        _counts(dm, w, (2, 2))
        a.stop()
    _counts(dm, w, (3, 0) if not has else (2, 0))


# --- scheduler ---------------------------------------------------------------------------------------------------


@boundary("scheduler-dra-postfilter-silent", "1.37.0")
def test_fit_error_of_a_pod_without_claims(kube: KubeVersion, has: bool) -> None:
    """The FailedScheduling text of a pod no node fits: DRA's PostFilter note goes from 1.37."""
    from pytest_devplug.sim.apiserver import admit_pod
    from pytest_devplug.sim.scheduler import NodeView, schedule

    full = NodeView(
        "n", {}, [], False, {"cpu": 8000, "memory": 2**35, "pods": 110, PLUGIN_GPU: 1}, {"pods": 1, PLUGIN_GPU: 1}
    )
    note = "no new claims to deallocate, " if not has else ""
    assert schedule(admit_pod(pod("p", 1)), [full], kube).message == (
        f"0/1 nodes are available: 1 Insufficient {PLUGIN_GPU}. {note}preemption: 0/1 nodes are available: "
        "1 No preemption victims found for incoming pod."
    )


# --- pod resources ----------------------------------------------------------------------------------------------


@boundary("podresources-get-terminal-not-found", "1.35.4")
def test_podresources_get_of_a_terminated_pod(tmp_path: Path, kube: KubeVersion, has: bool) -> None:
    """A pod whose containers all ended (restartPolicy Never): from 1.35 Get answers "not found" like for a pod
    the kubelet never had; before, it answers with the pod (its devices freed)."""
    with EmbeddedPlane(kube=kube) as cluster:
        node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
        cluster.create_pod(pod("done", 1, restart_policy="Never"))
        assert cluster.finish_container("done", "main", 0)["status"]["phase"] == "Succeeded"
        with grpc.insecure_channel(f"unix://{node.pod_resources_socket}") as ch:
            stub = pr_grpc.PodResourcesListerStub(ch)  # type: ignore[no-untyped-call]
            assert [p.name for p in stub.List(pr.ListPodResourcesRequest(), timeout=5).pod_resources] == []
            request = pr.GetPodResourcesRequest(pod_name="done", pod_namespace="default")
            if has:
                with pytest.raises(grpc.RpcError) as exc:
                    stub.Get(request, timeout=5)
                assert (exc.value.code(), exc.value.details()) == (
                    grpc.StatusCode.UNKNOWN,
                    "pod done in namespace default not found",
                )
            else:
                got = stub.Get(request, timeout=5).pod_resources
                assert (got.name, [c.name for c in got.containers]) == ("done", ["main"])


# --- DRA checkpoint ------------------------------------------------------------------------------------------


@boundary("dra-checkpoint-share-id", "1.35.0")
def test_dra_checkpoint_device_layout(kube: KubeVersion, has: bool) -> None:
    """From 1.35 every prepared device in dra_manager_state has ``"ShareID"``, null without one (upstream's
    checkpointer_test.go of each release has the bytes)."""
    from pytest_devplug.kubeletmodel import dracheckpoint as cp

    entry = cp.ClaimInfoState("uid", "c", "default", {"pod"}, {"d": [cp.PreparedDevice("pool", "dev", ["r"], ["x=y"])]})
    data = cp.encode_data([entry], kube)
    assert ('"DeviceName":"dev","ShareID":null,"RequestNames"' in data) is has, data
    assert cp.decode_data(data) == [entry]


# --- plugin watcher ---------------------------------------------------------------------------------------------


class _FailingOnce:
    """A handler whose first RegisterPlugin fails (as the device manager's does for a socket it holds)."""

    def __init__(self) -> None:
        self.registered: list[str] = []
        self.deregistered: list[str] = []
        self.attempts = 0

    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        return None

    def register_plugin(self, name: str, endpoint: str, versions: Sequence[str], timeout: float | None) -> None:
        self.attempts += 1
        if self.attempts == 1:
            raise DRAPluginError("not now")
        self.registered.append(name)

    def deregister_plugin(self, name: str, endpoint: str) -> None:
        self.deregistered.append(name)


@pytest.fixture
def registry() -> Iterator[Path]:
    root = short_root()
    yield root
    remove_root(root)


@boundary("pluginwatcher-retry", "1.36.0")
def test_failed_register_plugin_is_retried(registry: Path, kube: KubeVersion, has: bool) -> None:
    """From 1.36 a plugin whose RegisterPlugin failed leaves the watcher's actual state and is tried again (after
    its back-off); before, it stays there and is never tried again while its socket stays."""
    handler = _FailingOnce()
    driver = FakeDriver(registry, "retry.example.com").start()
    watcher = PluginWatcher(registry / "plugins_registry", {DRA_PLUGIN_TYPE: handler}, poll_interval=0.02, kube=kube)
    watcher.start()
    try:
        first = wait_for(lambda: driver.calls.statuses, bool, "the first verdict")
        assert (
            first[0][0] is False
            and first[0][1] == "RegisterPlugin error -- plugin registration failed with err: not now"
        )
        if has:
            wait_for(lambda: handler.registered, bool, "the registration tried again")
            assert wait_for(lambda: driver.calls.statuses, lambda s: len(s) == 2, "the second verdict")[1] == (True, "")
        else:
            gone = threading.Event()
            gone.wait(1.5)  # three back-offs' worth (0.5 s, 1 s): a retry would have come
            assert handler.attempts == 1 and len(driver.calls.statuses) == 1
    finally:
        watcher.stop()
        driver.stop()


@boundary("pluginwatcher-retry", "1.36.0")
def test_failed_notify_registration_status(registry: Path, kube: KubeVersion, has: bool) -> None:
    """The plugin fails NotifyRegistrationStatus(true): from 1.36 the kubelet deregisters it and registers it
    again; before, the registration stands."""
    handler = _FailingOnce()
    handler.attempts = 1  # RegisterPlugin succeeds from the start
    driver = FakeDriver(registry, "notify.example.com")
    driver.notify_failures = 1
    driver.start()
    watcher = PluginWatcher(registry / "plugins_registry", {DRA_PLUGIN_TYPE: handler}, poll_interval=0.02, kube=kube)
    watcher.start()
    try:
        wait_for(lambda: handler.registered, bool, "the first registration")
        if has:
            wait_for(lambda: handler.registered, lambda r: len(r) == 2, "registered again after the failed notify")
            assert handler.deregistered == ["notify.example.com"]
        else:
            threading.Event().wait(1.5)
            assert handler.registered == ["notify.example.com"] and handler.deregistered == []
    finally:
        watcher.stop()
        driver.stop()


# --- DRA health ---------------------------------------------------------------------------------------------


@pytest.fixture
def health_plugins(registry: Path) -> Iterator[Callable[[KubeVersion], tuple[DRAPluginManager, PluginWatcher]]]:
    made: list[tuple[DRAPluginManager, PluginWatcher]] = []

    def make(kube: KubeVersion) -> tuple[DRAPluginManager, PluginWatcher]:
        plugins = DRAPluginManager("node-1", health_cache=HealthInfoCache(), health_retry_period=0.1, kube=kube)
        watcher = PluginWatcher(
            registry / "plugins_registry", {DRA_PLUGIN_TYPE: plugins}, poll_interval=0.02, kube=kube
        )
        watcher.start()
        made.append((plugins, watcher))
        return plugins, watcher

    yield make
    for plugins, watcher in made:
        watcher.stop()
        plugins.stop()


@boundary("dra-health-v1", "1.37.0")
@pytest.mark.parametrize(
    ("serves", "lists", "want_from", "want_before"),
    [
        pytest.param(("v1", "v1alpha1"), True, "v1", "v1alpha1", id="lists-both"),
        pytest.param(("v1alpha1",), True, "v1alpha1", "v1alpha1", id="lists-v1alpha1"),
        pytest.param(("v1alpha1",), False, None, "v1alpha1", id="lists-none"),
    ],
)
def test_health_service_watched(
    registry: Path,
    health_plugins: Callable[[KubeVersion], tuple[DRAPluginManager, PluginWatcher]],
    kube: KubeVersion,
    has: bool,
    serves: tuple[str, ...],
    lists: bool,
    want_from: str | None,
    want_before: str,
) -> None:
    """1.37 watches the first of v1, v1alpha1 that the driver lists in GetInfo, and none where it lists none;
    before, v1alpha1 on every driver."""
    health_plugins(kube)
    driver = FakeDriver(registry, "health.example.com", health=True, health_versions=serves, list_health=lists).start()
    try:
        wait_for(lambda: driver.registered.is_set(), bool, "registered")
        want = want_from if has else want_before
        if want is None:
            threading.Event().wait(0.5)
            assert driver.calls.health_services == []
        else:
            assert wait_for(lambda: driver.calls.health_services, bool, "a health stream")[0] == want
    finally:
        driver.stop()


@boundary("dra-health-v1", "1.37.0")
def test_unimplemented_health_service(
    registry: Path,
    health_plugins: Callable[[KubeVersion], tuple[DRAPluginManager, PluginWatcher]],
    kube: KubeVersion,
    has: bool,
) -> None:
    """A driver that lists v1alpha1.DRAResourceHealth but does not serve it (Unimplemented): 1.37 stops asking;
    before, the kubelet opens a new stream every period."""
    plugins, _ = health_plugins(kube)
    driver = FakeDriver(
        registry, "nohealth.example.com", versions=("v1.DRAPlugin", "v1alpha1.DRAResourceHealth")
    ).start()
    try:
        wait_for(lambda: driver.registered.is_set(), bool, "registered")
        stream = wait_for(
            lambda: next(iter(plugins._streams.values()), None), lambda s: s is not None, "the health stream"
        )
        assert stream is not None
        if has:
            wait_for(lambda: stream._stop.is_set(), bool, "the stream given up after Unimplemented")
            assert stream.attempts == 1
        else:
            wait_for(lambda: stream.attempts, lambda n: n >= 3, "the stream opened again and again")
    finally:
        driver.stop()


# --- feature gates the embedded kubelet follows -------------------------------------------------------------


@pytest.mark.parametrize(
    ("kube", "reported"),
    [
        pytest.param(KubeVersion.of("1.35"), False, id="1.35"),
        pytest.param(KubeVersion.of("1.36"), True, id="1.36"),
        pytest.param(KubeVersion.of("1.35", "ResourceHealthStatus=true"), True, id="1.35-gate-on"),
        pytest.param(
            KubeVersion.of("1.37", "ResourceHealthStatus=false,ResourceHealthStatusMessage=false"),
            False,
            id="1.37-gate-off",
        ),
    ],
)
def test_allocated_resources_status_follows_resource_health_status(
    tmp_path: Path, kube: KubeVersion, reported: bool
) -> None:
    """The kubelet fills ``allocatedResourcesStatus`` only with ResourceHealthStatus on (default from 1.36)."""
    with EmbeddedPlane(kube=kube) as cluster:
        start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
        status = cluster.create_pod(pod("p", 1))["status"]["containerStatuses"][0]
        assert ("allocatedResourcesStatus" in status) is reported, status


def test_device_health_in_pod_status_is_the_plugins_last_list(tmp_path: Path) -> None:
    """``UpdateAllocatedResourcesStatus`` reads the devices as the plugin last listed them: its exit (every device
    unhealthy for allocation) leaves the running pod's device Healthy in its status (every release)."""
    with EmbeddedPlane() as cluster:
        node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
        created = cluster.create_pod(pod("p", 1))
        (entry,) = created["status"]["containerStatuses"][0]["allocatedResourcesStatus"]
        node.plugin().stop()
        wait_for(
            lambda: cluster.get_node("node-1")["status"]["allocatable"][PLUGIN_GPU], lambda v: v == "0", "allocatable 0"
        )
        (after,) = cluster.get_pod("p")["status"]["containerStatuses"][0]["allocatedResourcesStatus"]
        assert after == entry and entry["resources"][0]["health"] == "Healthy"


@pytest.mark.parametrize(
    ("kube", "prepared"),
    [
        pytest.param(KubeVersion.of("1.35"), False, id="1.35"),
        pytest.param(KubeVersion.of("1.36"), True, id="1.36"),
        pytest.param(KubeVersion.of("1.36", "DRAExtendedResource=false"), False, id="1.36-gate-off"),
    ],
)
def test_the_schedulers_extended_resource_claim_follows_dra_extended_resource(
    kube: KubeVersion, prepared: bool
) -> None:
    """With DRAExtendedResource (on from 1.36) the kubelet prepares the claim the scheduler made for a pod's extended
    resources (``status.extendedResourceClaimStatus``) and gives the mapped container its devices."""
    from pytest_devplug.kubeletmodel import dracheckpoint as cp
    from pytest_devplug.sim.dra.manager import DRAManager, container_cdi_devices, pod_claims

    pod_obj = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"containers": [{"name": "main"}]},
        "status": {
            "extendedResourceClaimStatus": {
                "resourceClaimName": "p-extended-resources-x",
                "requestMappings": [
                    {"containerName": "main", "resourceName": "example.com/gpu", "requestName": "container-0-request-0"}
                ],
            }
        },
    }
    extended = DRAManager.__new__(DRAManager)  # only the gate's reading is judged here, not a started manager
    extended.extended_resources = kube.gate("DRAExtendedResource")
    state = cp.ClaimInfoState(
        "cu",
        "p-extended-resources-x",
        "ns",
        {"u"},
        {"d": [cp.PreparedDevice("pool", "gpu-0", ["container-0-request-0"], ["d.example/gpu=gpu-0"])]},
    )
    claims = pod_claims(pod_obj, extended=extended.extended_resources)
    assert [c.get("resourceClaimName") for c in claims] == (["p-extended-resources-x"] if prepared else [])
    devices = container_cdi_devices(pod_obj, "main", lambda ns, name: state, extended=extended.extended_resources)
    assert devices == (["d.example/gpu=gpu-0"] if prepared else [])


def test_every_rule_is_judged_here_at_its_release() -> None:
    """Every rule has a boundary test, and the release each test states is the table's: a rule moved in the table
    fails its behaviour tests and, naming the move, this one."""
    stated = {rule: first for rule, first in COVERED.values()}
    missing = sorted(set(RULES) - set(stated))
    assert not missing, f"rules without a test on both sides of their release: {missing}"
    table = {name: rule.first_in[0].removeprefix("v") for name, rule in RULES.items()}
    moved = {name: (stated[name], table[name]) for name in RULES if stated[name] != table[name]}
    assert not moved, f"rules whose first release in RULES is not the one their tests judge (tests, table): {moved}"
