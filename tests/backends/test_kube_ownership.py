"""Nothing left on a user's cluster: the run's namespace is owned, removed at the end (also after SIGTERM), a
later run removes what a SIGKILLed one left, and a node pod past its deadline is made again. Against a fake
Kubernetes API (no cluster); the kind tier runs the SIGTERM case on a real cluster (tests/kind/test_leftovers.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from pytest_devplug.backends.base import BackendOptions, ExecResult, NodeSpec, PluginSpec
from pytest_devplug.errors import BackendError, ObjectNotFoundError
from pytest_devplug.backends.k8s import backend as kube_backend
from pytest_devplug.backends.k8s.api import KubeApi
from pytest_devplug.backends.k8s.backend import KubeBackend
from pytest_devplug.backends.k8s.hostpod import HostPodTransport
from pytest_devplug.backends.k8s.nodeops import NodeTransport
from pytest_devplug.backends.k8s.ownership import MANAGED_BY, Owner, SignalGuard, sweep_orphans

pytest_plugins = ["pytester"]

JSONDict = dict[str, Any]


class FakeApi:
    """The namespace and DaemonSet calls of :class:`KubeApi`, on dicts; a deleted namespace is gone at once."""

    def __init__(self, namespaces: list[JSONDict] | None = None) -> None:
        self.namespaces: dict[str, JSONDict] = {ns["metadata"]["name"]: ns for ns in namespaces or []}
        self.daemonsets: dict[tuple[str, str], JSONDict] = {}
        self.deleted: list[str] = []
        self.closed = False

    def list_namespaces(self, *, label_selector: str = "") -> list[JSONDict]:
        key, _, value = label_selector.partition("=")
        return [ns for ns in self.namespaces.values() if (ns["metadata"].get("labels") or {}).get(key) == value]

    def create_namespace(self, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> None:
        self.namespaces[name] = {"metadata": {"name": name, "labels": labels, "annotations": dict(annotations or {})}}

    def namespace_exists(self, name: str) -> bool:
        return name in self.namespaces

    def delete_namespace(self, name: str) -> None:
        self.deleted.append(name)
        self.namespaces.pop(name, None)
        for key in [k for k in self.daemonsets if k[0] == name]:
            del self.daemonsets[key]

    def service_account_exists(self, name: str, namespace: str) -> bool:
        return namespace in self.namespaces

    def list_nodes(self) -> list[JSONDict]:
        return [self.get_node("gpu-1")]

    def get_node(self, name: str) -> JSONDict:
        """gpu-1: a GPU node tainted as GPU nodes usually are, and (its kubelet late) not ready."""
        taints = [
            {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
        ]
        return {
            "metadata": {"name": name, "labels": {"devplug.io/gpu": "true"}},
            "spec": {"taints": taints},
            "status": {},
        }

    def apply_daemonset(self, ds: JSONDict) -> None:
        self.daemonsets[(ds["metadata"]["namespace"], ds["metadata"]["name"])] = ds

    def close(self) -> None:
        self.closed = True


class QuietTransport:
    """A node transport where every command succeeds and prints nothing."""

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def run(self, node: str, script: str, *, timeout: float) -> ExecResult:
        self.scripts.append(script)
        return ExecResult(0, "", "")

    def grpc_call(
        self, node: str, socket: str, method: str, request: bytes, *, timeout: float, stream: bool = False
    ) -> bytes:
        return b""

    def close(self) -> None:
        pass


class FakeProvider:
    """A provider of an existing cluster (never disposed of) whose client is a :class:`FakeApi`."""

    name = "cluster"

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.transports: list[QuietTransport] = []
        self.closed = False

    def start(self) -> Any:
        return self.api

    def transport(self, api: KubeApi, namespace: str, node_image: Callable[[], str]) -> NodeTransport:
        self.transports.append(QuietTransport())
        return self.transports[-1]

    def plugin_image(self, spec: PluginSpec, node: str) -> str:
        return "plugin:1"

    def workload_image(self, image: str, node: str | None) -> str | None:
        return None

    def disposes_cluster(self) -> bool:
        return False

    def describe(self) -> str:
        return "a fake cluster"

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    """A :class:`FakeApi` that :class:`KubeBackend` takes for the client its provider returns."""
    api = FakeApi()
    monkeypatch.setattr(kube_backend, "KubeApi", lambda client, timeout: client)
    return api


def _namespace(name: str, annotations: dict[str, str]) -> JSONDict:
    return {"metadata": {"name": name, "labels": {MANAGED_BY[0]: MANAGED_BY[1]}, "annotations": annotations}}


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait(timeout=60)
    return proc.pid


def test_the_owner_is_this_process_and_a_finished_one_is_gone() -> None:
    me = Owner.current()
    assert (me.host, me.pid) == (socket.gethostname(), os.getpid())
    assert me.gone() is False
    assert Owner.from_annotations(me.annotations()) == me
    assert Owner(me.host, _dead_pid(), "").gone() is True
    assert Owner("another-host.example", os.getpid(), me.start).gone() is None, "another host's runs cannot be checked"


def test_a_reused_pid_is_not_taken_for_the_owner() -> None:
    me = Owner.current()
    if not me.start:
        pytest.skip("no /proc/<pid>/stat here: the owner's start time is not recorded")
    assert Owner(me.host, me.pid, str(int(me.start) + 1)).gone() is True


def test_sweep_removes_only_namespaces_whose_owner_process_is_gone() -> None:
    me = Owner.current()
    dead = Owner(me.host, _dead_pid(), "")
    other_host = Owner("another-host.example", 1, "")
    api = FakeApi(
        [
            _namespace("devplug-dead", dead.annotations()),
            _namespace("devplug-alive", me.annotations()),
            _namespace("devplug-elsewhere", other_host.annotations()),
            _namespace("devplug-unowned", {}),
        ]
    )
    api.namespaces["somebody-elses"] = {"metadata": {"name": "somebody-elses", "labels": {}}}
    assert sweep_orphans(api, timeout=5) == ["devplug-dead"]  # type: ignore[arg-type]
    assert sorted(api.namespaces) == ["devplug-alive", "devplug-elsewhere", "devplug-unowned", "somebody-elses"]


def test_a_sweep_the_cluster_refuses_does_not_stop_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    class Forbidden(FakeApi):
        def list_namespaces(self, *, label_selector: str = "") -> list[JSONDict]:
            raise BackendError("listing namespaces: 403 namespaces is forbidden")

    assert sweep_orphans(Forbidden(), timeout=5) == []  # type: ignore[arg-type]
    assert "cannot look for namespaces left by killed runs: listing namespaces: 403" in capsys.readouterr().err


def test_a_run_owns_its_namespace_and_removes_it_at_the_end(fake_api: FakeApi) -> None:
    dead = Owner(socket.gethostname(), _dead_pid(), "")
    fake_api.namespaces["devplug-killed"] = _namespace("devplug-killed", dead.annotations())
    provider = FakeProvider(fake_api)
    backend = KubeBackend(BackendOptions(timeout=5), provider)
    backend.start()
    try:
        assert "devplug-killed" not in fake_api.namespaces, "what a SIGKILLed run left is removed at start"
        meta = fake_api.namespaces[backend.namespace]["metadata"]
        assert meta["labels"][MANAGED_BY[0]] == MANAGED_BY[1]
        assert Owner.from_annotations(meta["annotations"]) == Owner.current()
        assert backend.pod_namespace == backend.namespace
    finally:
        backend.close()
    assert backend.namespace not in fake_api.namespaces and fake_api.deleted[-1] == backend.namespace
    assert fake_api.closed and provider.closed


def test_the_plugin_daemonset_lives_in_the_run_namespace_pinned_to_its_node(fake_api: FakeApi) -> None:
    backend = KubeBackend(BackendOptions(timeout=5), FakeProvider(fake_api))
    backend.start()
    try:
        node = backend.ensure_node(NodeSpec("gpu"))
        backend.deploy_plugin(node, PluginSpec())
        ((ns, _), ds), *more = fake_api.daemonsets.items()
        assert not more and ns == backend.namespace
        assert ds["metadata"]["labels"][MANAGED_BY[0]] == MANAGED_BY[1]
        assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-1"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in ds["spec"]["template"][
            "spec"
        ]["tolerations"]
        assert not any(
            t.get("key") == "node.kubernetes.io/not-ready" for t in ds["spec"]["template"]["spec"]["tolerations"]
        )
        backend._plugins.clear()  # the fake API has no pods to wait for: the namespace takes the DaemonSet along
    finally:
        backend.close()
    assert not fake_api.daemonsets


def test_signal_guard_turns_sigterm_into_keyboard_interrupt_and_shields_the_teardown() -> None:
    guard = SignalGuard()
    before = signal.getsignal(signal.SIGTERM)
    guard.install()
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            signal.raise_signal(signal.SIGTERM)  # its handler runs before raise_signal returns
        with guard.shielded():
            signal.raise_signal(signal.SIGTERM)  # ignored (a message says so): the teardown goes on
            signal.raise_signal(signal.SIGINT)
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before


def test_signal_guard_leaves_an_ignored_signal_ignored_and_a_later_handler_in_place() -> None:
    guard = SignalGuard()
    term_before = signal.getsignal(signal.SIGTERM)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        guard.install()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == guard._handle

        def later(signum: int, frame: object) -> None:
            pass

        signal.signal(signal.SIGTERM, later)  # e.g. the embedded kubelet's, chaining to ours
        guard.uninstall()
        assert signal.getsignal(signal.SIGTERM) is later
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, term_before)


def test_sigterm_ends_a_pytest_run_like_ctrl_c_and_the_namespace_goes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a cancelled CI job or ``timeout`` sends: pytest stops, tears the session down, the namespace is deleted."""
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__))  # the fakes above, for the pytest subprocess
    pytester.makepyfile(
        """
        import os, signal
        import pytest
        from pytest_devplug.backends.base import BackendOptions
        from pytest_devplug.backends.k8s import backend as kube_backend
        from test_kube_ownership import FakeApi, FakeProvider

        API = FakeApi()

        @pytest.fixture(scope="session")
        def backend():
            kube_backend.KubeApi = lambda client, timeout: client
            b = kube_backend.KubeBackend(BackendOptions(timeout=5), FakeProvider(API))
            b.start()
            yield b
            b.close()
            print("namespaces left:", sorted(API.namespaces), "deleted:", API.deleted)

        def test_terminated(backend):
            assert backend.namespace in API.namespaces
            signal.raise_signal(signal.SIGTERM)

        def test_never_runs():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.re_match_lines(
        [r".*namespaces left: \[\] deleted: \['devplug-[0-9a-f]+'\]", r".*KeyboardInterrupt: SIGTERM received"]
    )
    assert "test_never_runs PASSED" not in result.stdout.str()


class NodePodApi:
    """The pod calls of :class:`KubeApi` the host-pod transport makes; ``deadline()`` ends every pod as
    ``activeDeadlineSeconds`` does (phase Failed, reason DeadlineExceeded)."""

    def __init__(self) -> None:
        self.pods: dict[str, JSONDict] = {}
        self.created: list[str] = []

    def create_pod(self, manifest: JSONDict) -> JSONDict:
        name = manifest["metadata"]["name"]
        self.pods[name] = {**manifest, "status": {"phase": "Running"}}
        self.created.append(name)
        return self.pods[name]

    def get_pod(self, name: str, namespace: str) -> JSONDict:
        if name not in self.pods:
            raise ObjectNotFoundError(f'pods "{name}" not found')
        return self.pods[name]

    def delete_pod(self, name: str, namespace: str, *, grace: int | None = None) -> None:
        if self.pods.pop(name, None) is None:
            raise ObjectNotFoundError(f'pods "{name}" not found')

    def exec(self, name: str, namespace: str, container: str, argv: list[str]) -> ExecResult:
        if self.pods[name]["status"]["phase"] != "Running":
            raise BackendError(f"exec in {namespace}/{name}: 400 Bad Request: container not running")
        return ExecResult(0, "ok\n", "")

    def deadline(self) -> None:
        for pod in self.pods.values():
            pod["status"] = {"phase": "Failed", "reason": "DeadlineExceeded"}


def test_a_node_pod_past_its_deadline_is_made_again() -> None:
    api = NodePodApi()
    transport = HostPodTransport(api, "devplug-ab", lambda: "img:1", timeout=5)  # type: ignore[arg-type]
    assert transport.run("gpu-1", "true", timeout=5).stdout == "ok\n"
    api.deadline()
    assert transport.run("gpu-1", "true", timeout=5).stdout == "ok\n", "a session longer than the deadline goes on"
    assert len(api.created) == 2 and len(api.pods) == 1
    transport.close()
    assert not api.pods


def test_an_exec_failure_of_a_running_node_pod_is_reported_not_retried() -> None:
    api = NodePodApi()
    transport = HostPodTransport(api, "devplug-ab", lambda: "img:1", timeout=5)  # type: ignore[arg-type]
    transport.run("gpu-1", "true", timeout=5)

    def broken(*args: object) -> ExecResult:
        raise BackendError("exec: 500 the kubelet is restarting")

    api.exec = broken  # type: ignore[method-assign]
    with pytest.raises(BackendError, match="kubelet is restarting"):
        transport.run("gpu-1", "true", timeout=5)
    assert len(api.created) == 1
    transport.close()
