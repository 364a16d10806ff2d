"""Nothing left on a cluster: a run ended by SIGTERM (a cancelled CI job, ``timeout``) cleans up like a normal end.

A pytest run on the session's kind cluster (reused, never deleted by that run) deploys the included plugin
and holds; SIGTERM must leave no namespace, DaemonSet or node pod of it, and the node's resource unregistered.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .kind_helpers import KIND_RESOURCE, KindCluster

from pytest_devplug.backends.k8s.ownership import MANAGED_BY
from pytest_devplug.waiting import wait_for

pytestmark = pytest.mark.kind

#: Holds once the plugin is registered (its fixture waits for that). No test pod: the GPU worker's taint keeps
#: the fixtures' pods off it, and the plugin's DaemonSet is what kept a node's resource registered after a kill.
HOLDING_TEST = """
import pathlib, time

def test_hold(devplug_plugin):
    pathlib.Path("namespace").write_text(devplug_plugin.backend.namespace)
    time.sleep(1800)
"""
#: Image build (cached), load and DaemonSet rollout at a load of ~10 on 2 cores.
DEPLOY_TIMEOUT_S = 900
#: Removing the plugin (pods gone, allocatable 0 posted) and the namespace.
CLEANUP_TIMEOUT_S = 300


def _owned(kind_cluster: KindCluster, kind: str, namespace: str) -> list[str]:
    """Objects of ``kind`` labelled as pytest-devplug's in ``namespace`` (other runs may share the cluster)."""
    out = kind_cluster.kubectl_json("get", kind, "-n", namespace, "-l", f"{MANAGED_BY[0]}={MANAGED_BY[1]}")
    return [f"{namespace}/{i['metadata']['name']}" for i in out["items"]]


def test_sigterm_leaves_nothing_behind(kind_cluster: KindCluster, tmp_path: Path) -> None:
    (tmp_path / "test_hold.py").write_text(HOLDING_TEST)
    node = kind_cluster.node_container("devplug.io/gpu=true")
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "test_hold.py",
        "-p",
        "no:cacheprovider",
        "-q",
        "--devplug-backend",
        "kind",
        f"--cluster-name={kind_cluster.name}",
        "--devplug-timeout",
        "60",
        "--devplug-node",
        node,
        "--devplug-resource-name",
        KIND_RESOURCE,
    ]
    env = {**os.environ, "DEVPLUG_KIND_CLUSTER": kind_cluster.name}
    with open(tmp_path / "run.log", "w") as log:
        run = subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            marker = tmp_path / "namespace"
            wait_for(
                lambda: marker.exists() or run.poll() is not None,
                bool,
                timeout=DEPLOY_TIMEOUT_S,
                interval=1.0,
                what="the held run to deploy its plugin and see it registered",
            )
            assert run.poll() is None, (
                f"the held run ended by itself ({run.returncode}):\n{(tmp_path / 'run.log').read_text()[-4000:]}"
            )
            namespace = marker.read_text()
            assert _owned(kind_cluster, "daemonsets", namespace), "the run's plugin DaemonSet is labelled as ours"
            run.send_signal(signal.SIGTERM)
            rc = run.wait(timeout=CLEANUP_TIMEOUT_S)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(timeout=60)
    output = (tmp_path / "run.log").read_text()
    assert rc == pytest.ExitCode.INTERRUPTED, f"exit {rc}:\n{output[-4000:]}"
    assert "KeyboardInterrupt: SIGTERM received" in output and "backend teardown" not in output, output[-4000:]
    gone = kind_cluster.kubectl("get", "namespace", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, f"namespace {namespace} still there:\n{gone.stdout}"
    assert _owned(kind_cluster, "daemonsets", namespace) == [] and _owned(kind_cluster, "pods", namespace) == []
    allocatable = kind_cluster.kubectl_json("get", "node", node)["status"]["allocatable"]
    assert allocatable.get(KIND_RESOURCE) in (None, "0"), f"the plugin still registered on {node}: {allocatable}"
