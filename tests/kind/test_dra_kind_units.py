"""The kube backend's DRA side without a cluster: the kubelet journal read into registrations and calls (lines as a
kubelet 1.34.4 on kind wrote them), the driver's manifest owned by the run, Go durations."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_devplug.dra import DriverSpec
from pytest_devplug.backends.k8s.dra import go_duration_s
from pytest_devplug.backends.k8s.dralog import KubeletDRAState, parse_line, read_into, read_script
from pytest_devplug.backends.k8s.dramanifests import DRA_MOCK_STATE_PATH, render_driver
from pytest_devplug.backends.k8s.manifests import MOCK_LIB_DIR

REPO = Path(__file__).resolve().parents[2]
EP = "/var/lib/kubelet/plugins/gpu.example.com/dra.sock"
UID = "b326acaf-d35a-4484-a771-a4e299cd8cc0"


def _line(at: float, pid: int, rest: str) -> str:
    return f"{at:.6f} kind-worker kubelet[{pid}]: I1202 02:53:54.675767     {pid} dra_plugin_manager.go:418] {rest}"


REGISTERED = (
    '"Registered DRA plugin" logger="DRA registration handler" driverName="gpu.example.com" endpoint="'
    + EP
    + '" chosenService="v1.DRAPlugin" numPlugins=1'
)
CONNECTED = (
    '"Connection changed" logger="DRA registration handler" driverName="gpu.example.com" endpoint="'
    + EP
    + '" connected=true'
)
DISCONNECTED = CONNECTED.replace("connected=true", "connected=false")
UNREGISTERED = (
    '"Unregistered DRA plugin" logger="DRA registration handler" driverName="gpu.example.com" endpoint="'
    + EP
    + '" numPlugins=0'
)
PREPARE = (
    '"Calling NodePrepareResources rpc" driverName="gpu.example.com" endpoint="' + EP + '" '
    'request="&NodePrepareResourcesRequest{Claims:[]*Claim{&Claim{Namespace:default,UID:' + UID + ',Name:c1,},},}"'
)
PREPARED = (
    '"Done calling NodePrepareResources rpc" driverName="gpu.example.com" endpoint="' + EP + '" '
    'response="&NodePrepareResourcesResponse{Claims:map[string]*NodePrepareResourceResponse{'
    + UID
    + ": &NodePrepareResourceResponse"
    "{Devices:[]*Device{&Device{RequestNames:[gpu],PoolName:kind-worker,DeviceName:gpu-0,CDIDeviceIDs:[k8s.gpu.example.com/gpu=common],},},"
    'Error:,},},}" err=null'
)
# 1.34's unprepare "Calling" line carries no driver
UNPREPARE = (
    '"Calling NodeUnprepareResource rpc" '
    'request="&NodeUnprepareResourcesRequest{Claims:[]*Claim{&Claim{Namespace:default,UID:' + UID + ',Name:c1,},},}"'
)
UNPREPARE_FAILED = (
    '"Done calling NodeUnprepareResources rpc" driverName="gpu.example.com" endpoint="' + EP + '" '
    'response="&NodeUnprepareResourcesResponse{Claims:map[string]*NodeUnprepareResourceResponse{' + UID + ": "
    '&NodeUnprepareResourceResponse{Error:device busy, try again,},},}" err=null'
)


def test_a_kubelet_line_is_read_with_its_fields() -> None:
    line = parse_line(_line(1796180034.675767, 189, REGISTERED))
    assert line is not None
    assert (line.at, line.pid, line.message) == (1796180034.675767, 189, "Registered DRA plugin")
    assert (
        line.fields["endpoint"] == EP
        and line.fields["chosenService"] == "v1.DRAPlugin"
        and line.fields["numPlugins"] == "1"
    )
    assert parse_line("-- cursor: s=abc") is None
    assert parse_line("1.0 host systemd[1]: Started kubelet.service") is None


def test_registration_connection_and_the_kubelet_process_decide_what_is_usable() -> None:
    state = KubeletDRAState(since=100.0)
    for at, text in [(101.0, REGISTERED), (101.1, CONNECTED)]:
        state.feed(parse_line(_line(at, 189, text)))  # type: ignore[arg-type]
    assert state.registered(189) == {"gpu.example.com": [EP]}
    assert state.usable(189, "gpu.example.com") and state.chosen_service(189, "gpu.example.com") == "v1.DRAPlugin"
    assert state.registered(5859) == {} and not state.usable(5859, "gpu.example.com")  # a new kubelet: nothing yet
    state.feed(parse_line(_line(102.0, 189, DISCONNECTED)))  # type: ignore[arg-type]
    assert state.registered(189) and not state.usable(189, "gpu.example.com")
    state.feed(parse_line(_line(102.5, 189, UNREGISTERED)))  # type: ignore[arg-type]
    assert state.registered(189) == {}
    assert [(e.kind, e.name) for e in state.events] == [
        ("registered", "gpu.example.com"),
        ("deregistered", "gpu.example.com"),
    ]


def test_events_before_the_first_read_mark_are_state_only() -> None:
    state = KubeletDRAState(since=200.0)
    state.feed(parse_line(_line(101.0, 189, REGISTERED)))  # type: ignore[arg-type]
    assert state.registered(189) and state.events == []


def test_calls_are_paired_with_their_answers_and_claim_errors_count() -> None:
    state = KubeletDRAState()
    for at, text in [(1.0, PREPARE), (1.1, PREPARED), (2.0, UNPREPARE), (2.1, UNPREPARE_FAILED)]:
        state.feed(parse_line(_line(at, 189, text)))  # type: ignore[arg-type]
    (prepare, unprepare) = state.calls
    assert (prepare.driver, prepare.method, prepare.claim_uids, prepare.error, prepare.at) == (
        "gpu.example.com",
        "NodePrepareResources",
        (UID,),
        "",
        1.0,
    )
    assert (unprepare.driver, unprepare.method, unprepare.claim_uids) == (
        "gpu.example.com",
        "NodeUnprepareResources",
        (UID,),
    )
    assert unprepare.error == f"claim {UID}: device busy, try again"


#: The same calls as a kubelet of 1.35+ logs them: its DRA API is google.golang.org/protobuf, whose String() is the
#: text format, with spaces put in at random.
PREPARE_TEXT = (
    '"Calling NodePrepareResources rpc" driverName="gpu.example.com" endpoint="' + EP + '" '
    'request="claims:{namespace:\\"default\\"  uid:\\"' + UID + '\\" name:\\"c1\\"}"'
)
PREPARED_TEXT = (
    '"Done calling NodePrepareResources rpc" driverName="gpu.example.com" endpoint="' + EP + '" '
    'response="claims:{key:\\"' + UID + '\\"  value:{devices:{request_names:\\"gpu\\" pool_name:\\"kind-worker\\" '
    'device_name:\\"gpu-0\\" cdi_device_ids:\\"k8s.gpu.example.com/gpu=common\\"}}}" err=null'
)
UNPREPARE_TEXT = PREPARE_TEXT.replace("Calling NodePrepareResources rpc", "Calling NodeUnprepareResource rpc")
UNPREPARE_FAILED_TEXT = (
    '"Done calling NodeUnprepareResources rpc" driverName="gpu.example.com" endpoint="' + EP + '" '
    'response="claims:{key:\\"' + UID + '\\" value:{error:\\"device \\\\\\"busy\\\\\\", try again\\"}}" err=null'
)


def test_calls_logged_in_protobufs_text_format_are_read_too() -> None:
    state = KubeletDRAState()
    for at, text in [(1.0, PREPARE_TEXT), (1.1, PREPARED_TEXT), (2.0, UNPREPARE_TEXT), (2.1, UNPREPARE_FAILED_TEXT)]:
        line = parse_line(_line(at, 189, text))
        assert line is not None, text
        state.feed(line)
    (prepare, unprepare) = state.calls
    assert (prepare.method, prepare.claim_uids, prepare.error) == ("NodePrepareResources", (UID,), "")
    assert (unprepare.method, unprepare.claim_uids) == ("NodeUnprepareResources", (UID,))
    assert unprepare.error == f'claim {UID}: device "busy", try again'


def test_a_grpc_error_of_the_call_is_its_error() -> None:
    state = KubeletDRAState()
    failed = (
        PREPARED.split(" response=")[0] + ' response=null err="rpc error: code = Unavailable desc = connection refused"'
    )
    for at, text in [(1.0, PREPARE), (1.1, failed)]:
        state.feed(parse_line(_line(at, 189, text)))  # type: ignore[arg-type]
    assert [c.error for c in state.calls] == ["rpc error: code = Unavailable desc = connection refused"]


def test_a_refused_registration_names_its_socket() -> None:
    text = (
        '"OperationExecutor.RegisterPlugin failed" '
        'err="RegisterPlugin error -- plugin registration failed with err: x" '
        'plugin="&{SocketPath:/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock '
        'Timestamp:2026-12-02 UUID:1 Handler:<nil> Name:}"'
    )
    state = KubeletDRAState()
    state.feed(parse_line(_line(1.0, 189, text).replace("I1202", "E1202")))  # type: ignore[arg-type]
    (event,) = state.events
    assert (event.kind, event.socket) == ("failed", "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock")
    assert "plugin registration failed with err: x" in event.detail


def test_a_read_gives_the_kubelet_pid_and_the_cursor_and_forgets_ended_processes() -> None:
    state = KubeletDRAState()
    state.feed(parse_line(_line(1.0, 189, REGISTERED)))  # type: ignore[arg-type]
    cursors: list[str] = []
    pid = read_into(state, f"PID 5859\n{_line(5.0, 5859, REGISTERED)}\n-- cursor: s=1;i=2\n", cursors.append)
    assert pid == 5859 and cursors == ["s=1;i=2"] and state.registered(5859) and state.registered(189) == {}
    assert read_into(state, "PID 0\n", cursors.append) == 0  # the kubelet is down


def test_the_read_script_quotes_the_cursor() -> None:
    script = read_script("s=1;i=2", "unit-start")
    assert "--after-cursor 's=1;i=2'" in script and "ExecMainStartTimestamp" not in script
    assert "ExecMainStartTimestamp" in read_script(None, "unit-start")


@pytest.mark.parametrize(
    ("text", "seconds"), [("1m0s", 60.0), ("10s", 10.0), ("1.5s", 1.5), ("1h2m3s", 3723.0), ("500ms", 0.5)]
)
def test_go_durations(text: str, seconds: float) -> None:
    assert go_duration_s(text) == seconds


def test_a_bad_go_duration_is_named() -> None:
    with pytest.raises(ValueError, match="not a Go duration: '10 seconds'"):
        go_duration_s("10 seconds")


def _render(
    spec: DriverSpec, image: str | None = "img:1", **kw: object
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    objs = render_driver(
        spec, image, namespace="devplug-1", namespace_uid="u-1", node="kind-worker2", labels={"o": "me"}, **kw
    )  # type: ignore[arg-type]
    return objs.rbac, objs.daemonsets


def test_the_included_driver_is_owned_by_the_run_and_pinned() -> None:
    rbac, (ds,) = _render(DriverSpec(driver_name="gpu.acme.io", mock=True), api_endpoint=("172.18.0.3", 6443))
    kinds = {str(o["kind"]): o for o in rbac}
    assert set(kinds) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    assert kinds["ServiceAccount"]["metadata"]["namespace"] == "devplug-1"  # type: ignore[index]
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        meta = kinds[kind]["metadata"]
        assert meta["name"] == "devplug-1-devplug-gpu-dra-driver" and "namespace" not in meta  # type: ignore[index, operator]
        assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Namespace", "name": "devplug-1", "uid": "u-1"}]  # type: ignore[index]
    binding = kinds["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == "devplug-1-devplug-gpu-dra-driver"  # type: ignore[index]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "devplug-gpu-dra-driver", "namespace": "devplug-1"}
    ]
    pod = ds["spec"]["template"]["spec"]  # type: ignore[index]
    assert (
        pod["nodeSelector"] == {"kubernetes.io/hostname": "kind-worker2"} and ds["metadata"]["namespace"] == "devplug-1"
    )  # type: ignore[index]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (
        c["image"] == "img:1" and env["DP_DRIVER_NAME"] == "gpu.acme.io" and env["DP_MOCK_STATE"] == DRA_MOCK_STATE_PATH
    )
    assert env["DEVPLUG_NVML_STATE"] == DRA_MOCK_STATE_PATH and env["LD_LIBRARY_PATH"] == MOCK_LIB_DIR
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("172.18.0.3", "6443")


def test_a_manifest_as_it_ships_keeps_its_images_unless_one_is_given() -> None:
    manifest = str(REPO / "peers" / "dra-example" / "kubeletplugin.yaml")
    _, (ds,) = _render(DriverSpec(driver_name="gpu.example.com", manifest=manifest), image=None)
    (c,) = ds["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
    assert c["image"].startswith("registry.k8s.io/") and not any(e["name"].startswith("DP_") for e in c["env"])
    assert not any(e["name"] == "KUBERNETES_SERVICE_HOST" for e in c["env"])  # a cluster whose Services route


def test_a_manifest_with_other_objects_is_refused_naming_them(tmp_path: Path) -> None:
    manifest = tmp_path / "driver.yaml"
    manifest.write_text(
        "kind: DaemonSet\nmetadata: {name: d}\nspec: {}\n---\nkind: Deployment\nmetadata: {name: webhook}\n"
    )
    with pytest.raises(Exception, match="Deployment/webhook"):
        _render(DriverSpec(manifest=str(manifest)))
