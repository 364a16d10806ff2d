"""The GPU plugin as a DRA driver over its real sockets, on the mock NVML, with no API server: registration with
the harness's plugin watcher, sockets served again, the health stream on mock faults, unprepare, and prepare
failing the way a driver that must read the claim from the API fails (as the Go helper does)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from pytest_devplug.api.dra import v1_pb2 as pb
from pytest_devplug.api.dra import v1_pb2_grpc as pb_grpc
from pytest_devplug.api.dra import v1beta1_pb2 as pb_beta
from pytest_devplug.api.dra import v1beta1_pb2_grpc as pb_beta_grpc
from pytest_devplug.api.pluginregistration import v1_pb2 as rpb
from pytest_devplug.api.pluginregistration import v1_pb2_grpc as rpb_grpc
from pytest_devplug.nvml import mock_env
from pytest_devplug.errors import DRAPluginCallError

from ..support import wait_until
from .dra_helpers import DRIVER, UNREACHABLE_KUBECONFIG, DriverDirs, HealthReader, KubeletSide, driver_dirs
from .gpu_plugin_helpers import UUIDS, MockStateFile, PluginProcess

CLAIM = pb.Claim(namespace="default", uid="8e1b6a3c-0000-4000-8000-000000000001", name="gpu-claim")


@dataclass
class Node:
    """A driver with an API server that refuses connections (nothing here needs one), and the kubelet's side."""

    dirs: DriverDirs
    mock_state: MockStateFile
    driver: PluginProcess
    kubelet: KubeletSide


@contextmanager
def _node(log: Path) -> Iterator[Node]:
    with driver_dirs() as dirs:
        state = MockStateFile(dirs.root / "mock-state.json")
        kubeconfig = dirs.root / "kubeconfig"
        kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DP_")}
        env.update(mock_env(str(state.path)))
        proc = PluginProcess([*dirs.args(kubeconfig), "--nvml", "mock", "--mock-state", str(state.path)], log, env)
        kubelet = KubeletSide(dirs)
        try:
            yield Node(dirs, state, proc, kubelet)
        finally:
            kubelet.stop()
            proc.cleanup()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """For the tests that change nothing the others look at (a driver start costs seconds on a busy machine)."""
    with _node(tmp_path_factory.mktemp("dra") / "driver.log") as node:
        node.kubelet.wait_usable(_alive(node.driver))
        yield node


@pytest.fixture
def own(tmp_path: Path) -> Iterator[Node]:
    """For a test that removes sockets, injects faults or stops the driver."""
    with _node(tmp_path / "driver.log") as node:
        yield node


def _alive(driver: PluginProcess) -> Callable[[], str | None]:
    return lambda: (
        None if driver.proc.poll() is None else f"the driver exited {driver.proc.returncode}:\n{driver.log()[-3000:]}"
    )


def test_registers_as_a_dra_plugin_with_the_kubelets_plugin_watcher(shared: Node) -> None:
    dirs, kubelet, driver = shared.dirs, shared.kubelet, shared.driver
    assert kubelet.plugins.registered() == {DRIVER: [str(dirs.dra_socket)]}
    assert kubelet.plugins.get_plugin(DRIVER).chosen_service == "v1.DRAPlugin"
    driver.wait_log(f"registered with the kubelet as {DRIVER} (endpoint {dirs.dra_socket})")
    with grpc.insecure_channel(f"unix://{dirs.reg_socket}") as channel:
        stub = rpb_grpc.RegistrationStub(channel)
        info = stub.GetInfo(rpb.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(dirs.dra_socket))
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        # a refusal is logged with the kubelet's reason and answered with an error, as the Go helper does
        with pytest.raises(grpc.RpcError) as err:
            stub.NotifyRegistrationStatus(
                rpb.RegistrationStatus(plugin_registered=False, error="bad driver"), timeout=5
            )
    assert (
        err.value.code() == grpc.StatusCode.UNKNOWN and err.value.details() == "failed registration process: bad driver"
    )
    driver.wait_log("registration refused by the kubelet: bad driver")


def test_prepare_needs_the_api_server_and_fails_the_whole_call(shared: Node) -> None:
    with pytest.raises(DRAPluginCallError) as err:
        shared.kubelet.plugins.get_plugin(DRIVER).node_prepare_resources([CLAIM])
    assert str(err.value).startswith(
        "rpc error: code = Unknown desc = get resource claims: retrieve claim default/gpu-claim: "
    ), err.value
    assert "127.0.0.1" in str(err.value)
    with grpc.insecure_channel(f"unix://{shared.dirs.dra_socket}") as channel:  # v1beta1: the same answer
        with pytest.raises(grpc.RpcError) as beta:
            pb_beta_grpc.DRAPluginStub(channel).NodePrepareResources(
                pb_beta.NodePrepareResourcesRequest(
                    claims=[pb_beta.Claim(namespace="default", uid=CLAIM.uid, name="gpu-claim")]
                ),
                timeout=30,
            )
    assert beta.value.details().startswith("get resource claims: retrieve claim default/gpu-claim: ")


def test_unprepare_answers_every_claim_and_refuses_a_uid_that_is_not_one(shared: Node) -> None:
    stray = shared.dirs.cdi / f"{DRIVER}-gpu_{CLAIM.uid}.json"
    stray.write_text("{}")  # a spec left by an earlier run of the driver: unprepare removes it
    bad = pb.Claim(namespace="default", uid="../../etc/x", name="bad")
    with grpc.insecure_channel(f"unix://{shared.dirs.dra_socket}") as channel:
        stub = pb_grpc.DRAPluginStub(channel)
        for _ in range(2):  # idempotent
            resp = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[CLAIM, bad]), timeout=10)
            assert set(resp.claims) == {CLAIM.uid, bad.uid}
            assert resp.claims[CLAIM.uid].error == ""
            assert "is not a UID" in resp.claims[bad.uid].error and "default/bad" in resp.claims[bad.uid].error
            assert not stray.exists()
        empty = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=10)  # a liveness probe's call
        assert dict(empty.claims) == {}


def test_the_kubelets_health_cache_follows_the_stream(shared: Node) -> None:
    health = shared.kubelet.health
    wait_until(
        "gpu-3 Healthy in the kubelet's cache",
        lambda: health.get(DRIVER, "node-1", "gpu-3").health,
        lambda h: h == "Healthy",
    )
    shared.mock_state.xid(UUIDS[3], 48)
    seen = wait_until(
        "gpu-3 Unhealthy in the kubelet's cache",
        lambda: health.get(DRIVER, "node-1", "gpu-3"),
        lambda d: d.health == "Unhealthy",
    )
    assert seen.message == "Xid 48"


def test_a_vanished_socket_is_served_again_and_the_driver_registers_again(own: Node) -> None:
    dirs, kubelet, driver = own.dirs, own.kubelet, own.driver
    kubelet.wait_usable(_alive(driver))
    os.unlink(dirs.reg_socket)
    driver.wait_log("registration served again in")  # (the new socket may well get the old inode)
    assert dirs.reg_socket.is_socket()
    wait_until(
        "deregistered, then registered again",
        lambda: [e.kind for e in kubelet.watcher.events_for(dirs.reg_socket)],
        lambda kinds: kinds[-2:] == ["deregistered", "registered"],
    )
    os.unlink(dirs.dra_socket)
    driver.wait_log("DRA served again in")
    assert dirs.dra_socket.is_socket()
    # the kubelet's channel finds the new socket by itself: calls work again
    response = wait_until(
        "NodeUnprepareResources answered on the new dra.sock",
        lambda: kubelet.plugins.get_plugin(DRIVER).node_unprepare_resources([CLAIM]),
        retry_on=(DRAPluginCallError,),
    )
    assert response.claims[CLAIM.uid].error == ""


def test_health_stream_follows_xids_lost_and_removed_gpus(own: Node) -> None:
    dirs, driver, mock_state = own.dirs, own.driver, own.mock_state
    wait_until("dra.sock", dirs.dra_socket.exists)
    reader = HealthReader(dirs.dra_socket)
    try:
        first = reader.wait_for(lambda h: len(h) == 4, "four GPUs")
        assert first == {f"gpu-{i}": ("HEALTHY", "") for i in range(4)}
        assert {d.device.pool_name for d in reader.last.devices} == {"node-1"}  # type: ignore[union-attr]
        assert all(d.last_updated_time > 0 for d in reader.last.devices)  # type: ignore[union-attr]
        mock_state.xid(UUIDS[0], 13)  # an application error: ignored by default
        driver.wait_log(f"Xid 13 on {UUIDS[0]} is in the ignored list")
        mock_state.xid(UUIDS[1], 79)
        assert reader.wait_for(lambda h: h["gpu-1"][0] == "UNHEALTHY", "gpu-1 unhealthy after Xid 79")["gpu-1"] == (
            "UNHEALTHY",
            "Xid 79",
        )
        assert reader.health()["gpu-0"] == ("HEALTHY", "")
        mock_state.set(UUIDS[2], lost=True)
        assert reader.wait_for(lambda h: h["gpu-2"][0] == "UNHEALTHY", "gpu-2 lost")["gpu-2"] == ("UNHEALTHY", "lost")
        mock_state.set(UUIDS[2], lost=False)
        reader.wait_for(lambda h: h["gpu-2"] == ("HEALTHY", ""), "gpu-2 back")
        mock_state.gpus = mock_state.gpus[:3]
        mock_state.write()
        health = reader.wait_for(lambda h: "gpu-3" not in h, "gpu-3 removed")
        assert health == {"gpu-0": ("HEALTHY", ""), "gpu-1": ("UNHEALTHY", "Xid 79"), "gpu-2": ("HEALTHY", "")}
    finally:
        reader.close()


def test_sigterm_removes_both_sockets_and_exits_0(own: Node) -> None:
    own.kubelet.wait_usable(_alive(own.driver))
    own.driver.signal(signal.SIGTERM)
    assert own.driver.wait_exit() == 0
    assert not own.dirs.reg_socket.exists() and not own.dirs.dra_socket.exists()
    assert "stopped (exit 0)" in own.driver.log()


def test_without_a_way_to_the_api_server_it_exits_2(
    start_plugin: Callable[..., PluginProcess], mock_state: MockStateFile, tmp_path: Path
) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": "", "KUBECONFIG": ""}
    proc = start_plugin(
        "--dra", "--node-name", "n1", "--nvml", "mock", "--mock-state", str(mock_state.path), base=False, env=env
    )
    assert proc.wait_exit() == 2
    assert "cannot reach the API server through the in-cluster config" in proc.log()
    missing = start_plugin(
        "--dra",
        "--node-name",
        "n1",
        "--kubeconfig",
        str(tmp_path / "none"),
        "--nvml",
        "mock",
        "--mock-state",
        str(mock_state.path),
        base=False,
    )
    assert missing.wait_exit() == 2
    assert f"cannot reach the API server through kubeconfig {tmp_path / 'none'}" in missing.log()
