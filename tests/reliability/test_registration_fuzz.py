"""Fuzzing the kubelet's Registration service: any request gets upstream's answer or is
connected, the service keeps serving, and a healthy plugin still registers afterwards."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .reliability_support import RELIABILITY, examples
from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pb_grpc
from pytest_devplug.sim.devicemanager import DeviceManager
from pytest_devplug.sim.names import is_extended_resource_name
from pytest_devplug.sim.registration import invalid_resource_name_message, unsupported_version_message


@pytest.fixture(scope="module")
def kubelet() -> Iterator[tuple[DeviceManager, Path]]:
    root = Path(tempfile.mkdtemp(prefix="rf", dir="/tmp"))  # short: socket paths are limited
    plugin_dir = root / "dp"
    plugin_dir.mkdir()
    dm = DeviceManager(plugin_dir)
    dm.dial_timeout = 0.05  # nothing serves the fuzzed endpoints
    dm.start()
    yield dm, plugin_dir
    dm.stop()
    shutil.rmtree(root, ignore_errors=True)


_names = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "example.com/gpu",
            "example.com/gpu\n",
            "EXAMPLE.com/gpu",
            "example.com/a/b",
            "kubernetes.io/x",
            "requests.example.com/x",
            "example.com/" + "g" * 64,
            "e" * 250 + ".com/gpu",
            "a.b/c_d.e-f",
        ]
    ),
)
_endpoints = st.one_of(st.text(max_size=20), st.sampled_from(["/abs.sock", "../../x.sock", "", ".", "a/../b.sock"]))
_versions = st.one_of(st.just("v1beta1"), st.text(max_size=10))


@settings(RELIABILITY, max_examples=examples(60))
@given(version=_versions, name=_names, endpoint=_endpoints)
def test_every_request_gets_an_upstream_answer(
    kubelet: tuple[DeviceManager, Path], version: str, name: str, endpoint: str
) -> None:
    dm, plugin_dir = kubelet
    with grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as ch:
        try:
            pb_grpc.RegistrationStub(ch).Register(
                pb.RegisterRequest(version=version, endpoint=endpoint, resource_name=name), timeout=10
            )
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNKNOWN, err
            if version != "v1beta1":
                expected = unsupported_version_message(version)
            elif not is_extended_resource_name(name):
                expected = invalid_resource_name_message(name)
            else:
                expected = "failed to dial device plugin: context deadline exceeded"
            assert err.details() == expected
        else:
            pytest.fail(f"registered {name!r} at {endpoint!r} with nothing serving it")
    assert dm.resources() == []
