"""``--devplug-control-plane real`` from a user's side: kubectl reads the run's cluster through
``devplug_cluster.kubeconfig``, the fixtures work unchanged, nothing is left behind, bad values are named."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_devplug.kubeletmodel.releases import release

from pytest_devplug.controlplane.binaries import cache_root

from ..support import control_plane_bin_dir

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def real_cache() -> Path:
    """The cache the binaries are in, read before pytester gives each test run its own HOME."""
    return cache_root()


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    """The directory of the resolved kube-apiserver (the cache; built there when missing, as nox -s tests does)."""
    return control_plane_bin_dir()


def test_kubectl_sees_the_embedded_kubelets_node(
    real_cache: Path, bin_dir: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(real_cache))  # pytester gives the run its own HOME
    pytester.makepyfile(
        f"""
        import json, shutil, subprocess

        def kubectl(kubeconfig, *args):
            exe = {str(bin_dir / "kubectl")!r}
            exe = exe if shutil.os.path.exists(exe) else shutil.which("kubectl")
            out = subprocess.run([exe, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            return out.stdout

        def test_node_and_pod_through_kubectl(devplug_cluster, devplug_plugin, devplug_pod, devplug_node):
            kc = devplug_cluster.kubeconfig
            assert kc and kc.endswith("admin.kubeconfig")
            node = json.loads(kubectl(kc, "get", "node", devplug_node.name, "-o", "json"))
            assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
            pod = devplug_pod(gpus=2, wait=True)
            phase = kubectl(kc, "get", "pod", pod.name, "-o", "jsonpath={{.status.phase}} {{.spec.nodeName}}")
            assert phase == "Running " + devplug_node.name
            print("KUBECONFIG=" + kc)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-s", "--devplug-control-plane", "real", timeout=240
    )
    result.assert_outcomes(passed=1)
    header = result.stdout.str()
    pins = release()
    assert (
        f"kubernetes {pins.kubernetes[1:]}, control-plane=real (kubernetes {pins.kubernetes}, etcd {pins.etcd}"
        in header
    )
    assert "devplug: real control plane up; kubectl --kubeconfig " in header
    kubeconfig = next(line.split("=", 1)[1] for line in header.splitlines() if line.startswith("KUBECONFIG="))
    assert not Path(kubeconfig).parent.exists(), "the control plane's dir is removed at the end"
    left = subprocess.run(["pgrep", "-f", kubeconfig], capture_output=True, text=True).stdout
    assert left == "", f"control-plane processes left running: {left}"


def test_a_bad_ini_value_is_named(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ndevplug_control_plane = remote\n")
    pytester.makepyfile("def test_x(devplug_cluster):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(
        [
            "*--devplug-control-plane (ini devplug_control_plane) = 'remote': "
            "invalid choice; choose one of embedded, real*"
        ]
    )
