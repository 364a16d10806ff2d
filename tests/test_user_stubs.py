"""A plugin project's own stubs, generated from upstream's api.proto the usual way (protobuf's default
descriptor pool), import in the same process as pytest-devplug's fixtures and the included plugin's stubs.

Before the stubs moved to private pools this failed at import: ``Couldn't build proto file into descriptor
pool: duplicate symbol 'v1beta1.DevicePluginOptions'``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

protoc = pytest.importorskip("grpc_tools.protoc", reason="generating a project's stubs needs grpcio-tools (dev extra)")

pytest_plugins = ["pytester"]

PROTO = Path(__file__).resolve().parent.parent / "proto"


def _generate_user_stubs(dest: Path) -> None:
    """What a plugin project does: upstream's file names (``api.proto``), upstream's packages, plain
    grpcio-tools output; pod resources in a folder of its own as upstream has it."""
    (dest / "podresources").mkdir()
    shutil.copy(PROTO / "deviceplugin" / "v1beta1.proto", dest / "api.proto")
    shutil.copy(PROTO / "podresources" / "v1.proto", dest / "podresources" / "api.proto")
    for proto in ("api.proto", "podresources/api.proto"):
        args = ["protoc", f"-I{dest}", f"--python_out={dest}", f"--grpc_python_out={dest}", str(dest / proto)]
        assert protoc.main(args) == 0, f"grpcio-tools could not compile {proto}"


USER_TEST = """
import api_pb2
from podresources import api_pb2 as podresources_pb2

from google.protobuf import descriptor_pool


def test_user_stubs_and_fixtures_in_one_process(devplug_plugin, devplug_pod, devplug_node):
    import devplug_gpu_plugin.api.deviceplugin.v1beta1_pb2  # the included plugin's stubs too
    import pytest_devplug.api.deviceplugin.v1beta1_pb2 as ours

    # the user's symbols are the ones in the default pool, under upstream's names
    assert descriptor_pool.Default().FindMessageTypeByName("v1beta1.DevicePluginOptions").file.name == "api.proto"
    assert podresources_pb2.ListPodResourcesRequest.DESCRIPTOR.full_name == "v1.ListPodResourcesRequest"
    assert ours.DevicePluginOptions.DESCRIPTOR.full_name == "v1beta1.DevicePluginOptions"

    pod = devplug_pod(gpus=2, wait=True)
    (entry,) = devplug_node.checkpoint().entries_for(pod.uid)
    # the plugin's Allocate answer, as the kubelet stored it, decodes with the user's stubs
    resp = api_pb2.ContainerAllocateResponse.FromString(entry.alloc_resp)
    assert dict(resp.envs) == {k: v for k, v in pod.env.items() if k in resp.envs} and resp.envs
    assert len(entry.all_device_ids) == 2
"""


def test_user_stubs_next_to_the_fixtures(pytester: pytest.Pytester) -> None:
    _generate_user_stubs(pytester.path)
    # the conftest imports the user's stubs before any fixture runs, as a project's conftest would
    pytester.makeconftest("import api_pb2, api_pb2_grpc  # noqa: F401\n")
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", timeout=120)
    result.assert_outcomes(passed=1)


def test_user_stubs_imported_first(tmp_path: Path) -> None:
    """The other order: the user's stubs first, then ours and the included plugin's."""
    _generate_user_stubs(tmp_path)
    code = (
        "import api_pb2, api_pb2_grpc\n"
        "from podresources import api_pb2 as pr\n"
        "from pytest_devplug.api.deviceplugin import v1beta1_pb2, v1beta1_pb2_grpc\n"
        "from pytest_devplug.api.podresources import v1_pb2, v1_pb2_grpc\n"
        "from devplug_gpu_plugin.api.deviceplugin import v1beta1_pb2 as plugin_pb2\n"
        "msg = api_pb2.RegisterRequest(version='v1beta1', resource_name='example.com/widget')\n"
        "assert v1beta1_pb2.RegisterRequest.FromString(msg.SerializeToString()).resource_name == 'example.com/widget'\n"
        "assert plugin_pb2.RegisterRequest.FromString(msg.SerializeToString()).version == 'v1beta1'\n"
        "print('imported')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "imported", run.stderr
