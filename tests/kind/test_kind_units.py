"""Units of the kind backend that need no cluster (run in the sim tier): choices, manifests, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_devplug.backends import create_backend
from pytest_devplug.backends.base import BackendOptions, PluginRestarts, PluginSpec
from pytest_devplug.errors import BackendUnavailableError, UnsupportedOperationError
from pytest_devplug.backends.k8s.backend import KubeBackend
from pytest_devplug.backends.k8s.manifests import render_daemonsets
from pytest_devplug.backends.kind import kind_backend
from pytest_devplug.backends.kind.lifecycle import ClusterManager

pytest_plugins = ["pytester"]


def test_cluster_name_defaults_to_devplug_not_pytest_kinds_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEVPLUG_KIND_CLUSTER", raising=False)
    assert ClusterManager(BackendOptions(cluster_name="pytest-kind")).name == "devplug"
    assert ClusterManager(BackendOptions(cluster_name="mine")).name == "mine"


def test_without_docker_the_backend_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker, no kind
    backend = create_backend("kind", BackendOptions())
    assert isinstance(backend, KubeBackend) and backend.name == "kind"
    try:
        with pytest.raises(BackendUnavailableError, match="working Docker engine"):
            backend.start()
    finally:
        backend.close()  # its work dir


def test_grace_period_is_the_kubelets_constant() -> None:
    backend = kind_backend(BackendOptions())
    try:
        assert backend.grace_period == 300.0
        with pytest.raises(UnsupportedOperationError, match="endpointStopGracePeriod"):
            backend.set_grace_period(1)
    finally:
        backend.close()


def test_included_manifest_gets_image_resource_and_prestart() -> None:
    spec = PluginSpec(resource_name="example.com/gpu", pre_start_required=True, env={"DP_LOG_LEVEL": "debug"})
    (ds,) = render_daemonsets(spec, "devplug/gpu-plugin:test")
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert c["image"] == "devplug/gpu-plugin:test" and c["imagePullPolicy"] == "IfNotPresent"
    assert env["DP_RESOURCE_NAME"] == "example.com/gpu"
    assert env["DP_PRE_START_REQUIRED"] == "true"
    assert env["DP_LOG_LEVEL"] == "debug"
    assert env["DP_MOCK_STATE"] == "/var/lib/devplug/mock-state.json"


def test_mock_spec_hands_any_plugin_the_mock_nvml(tmp_path: Path) -> None:
    """A user's DaemonSet gets the node's /var/lib/devplug (library + state) and the loader's path."""
    m = tmp_path / "m.yaml"
    m.write_text(
        yaml.safe_dump(
            {
                "kind": "DaemonSet",
                "metadata": {"name": "nvidia"},
                "spec": {"template": {"spec": {"containers": [{"name": "p", "image": "x"}]}}},
            }
        )
    )
    (ds,) = render_daemonsets(PluginSpec(manifest=str(m), mock=True), "img")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env == {"LD_LIBRARY_PATH": "/var/lib/devplug/lib", "DEVPLUG_NVML_STATE": "/var/lib/devplug/mock-state.json"}
    assert c["volumeMounts"] == [{"name": "devplug-mock-nvml", "mountPath": "/var/lib/devplug"}]
    assert pod["volumes"] == [
        {"name": "devplug-mock-nvml", "hostPath": {"path": "/var/lib/devplug", "type": "DirectoryOrCreate"}}
    ]
    (plain,) = render_daemonsets(PluginSpec(manifest=str(m)), "img")
    assert "env" not in plain["spec"]["template"]["spec"]["containers"][0], "no mock: nothing added"


def test_user_manifest_must_be_daemonsets(tmp_path: Path) -> None:
    m = tmp_path / "m.yaml"
    m.write_text(yaml.safe_dump_all([{"kind": "Deployment", "metadata": {"name": "x"}}]))
    with pytest.raises(Exception, match="DaemonSets only"):
        render_daemonsets(PluginSpec(manifest=str(m)), "img")


def test_kind_config_option_then_env_then_default(monkeypatch: pytest.MonkeyPatch, pytester: pytest.Pytester) -> None:
    """--devplug-kind-config / ini devplug_kind_config beat $DEVPLUG_KIND_CONFIG; an explicit config beats both."""
    from pytest_devplug.settings import settings_from_config

    monkeypatch.setenv("DEVPLUG_KIND_CONFIG", "from-env.yaml")
    assert ClusterManager(BackendOptions()).config_choice == "from-env.yaml"
    config = pytester.parseconfig("--devplug-kind-config", "multi-node.yaml")
    opts = settings_from_config(config).backend_options
    assert opts.kind_config == "multi-node.yaml"
    assert ClusterManager(opts).config_choice == "multi-node.yaml"
    assert ClusterManager(opts, config="other.yaml").config_choice == "other.yaml"
    pytester.makeini("[pytest]\ndevplug_kind_config = single-node.yaml\n")
    assert settings_from_config(pytester.parseconfig()).backend_options.kind_config == "single-node.yaml"
    monkeypatch.delenv("DEVPLUG_KIND_CONFIG")
    assert ClusterManager(BackendOptions()).config_choice == "single-node.yaml"


def test_kind_config_name_is_looked_up_in_kind_config_dir_and_missing_ones_are_named() -> None:
    src, config = ClusterManager(BackendOptions(kind_config="multi-node.yaml"))._config_source()
    assert src.endswith("kind-config/multi-node.yaml") and len(config["nodes"]) == 3
    with pytest.raises(BackendUnavailableError, match="--devplug-kind-config"):
        ClusterManager(BackendOptions(kind_config="no-such.yaml"))._config_source()


def test_image_names_follow_the_offline_scripts_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_devplug.backends.kind import lifecycle

    monkeypatch.delenv("DEVPLUG_PYTHON_BASE", raising=False)
    monkeypatch.setenv("DEVPLUG_IMAGE_PREFIX", "acme")
    assert (lifecycle.offline_node_image_name() or "").startswith("acme/kind-node:")
    seen: list[str] = []

    def labels(image: str) -> dict[str, str]:
        seen.append(image)
        return {}

    monkeypatch.setattr(lifecycle, "image_labels", labels)
    assert (lifecycle.python_base_image() or "").startswith("acme/python-base:")
    assert seen and seen[0].startswith("acme/python-base:")


def test_plugin_exit_reports_a_container_that_cannot_come_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits stop on CrashLoopBackOff (or an image that cannot be pulled), not on a pod still starting."""
    backend = kind_backend(BackendOptions())
    try:
        backend._plugins["n1"] = object()  # type: ignore[assignment]
        pods: list[dict[str, object]] = []
        monkeypatch.setattr(backend, "_plugin_pods", lambda node: pods)

        def pod(state: dict[str, object], last: dict[str, object] | None = None) -> dict[str, object]:
            status = {"name": "plugin", "state": state, "lastState": {"terminated": last} if last else {}}
            return {"metadata": {"name": "dp-x"}, "status": {"containerStatuses": [status]}}

        assert backend.plugin_exit("n1") is None  # no pod yet
        pods[:] = [pod({"waiting": {"reason": "ContainerCreating"}})]
        assert backend.plugin_exit("n1") is None
        pods[:] = [pod({"waiting": {"reason": "CrashLoopBackOff"}}, {"exitCode": 3})]
        assert backend.plugin_exit("n1") == "container plugin of pod dp-x is CrashLoopBackOff, last exit code 3"
        pods[:] = [pod({"waiting": {"reason": "ImagePullBackOff"}})]
        assert backend.plugin_exit("n1") == "container plugin of pod dp-x is ImagePullBackOff"
        assert backend.plugin_exit("other-node") is None
    finally:
        backend.close()  # its work dir


def test_plugin_restarts_are_the_plugin_containers_restart_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = kind_backend(BackendOptions())
    try:
        assert backend.plugin_restarts("n1") == PluginRestarts()  # nothing deployed
        backend._plugins["n1"] = object()  # type: ignore[assignment]
        waiting = {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=plugin"}
        pods = [
            {
                "metadata": {"name": "dp-a"},
                "status": {"containerStatuses": [{"name": "plugin", "restartCount": 2, "state": {"running": {}}}]},
            },
            {
                "metadata": {"name": "dp-b"},
                "status": {"containerStatuses": [{"name": "plugin", "restartCount": 3, "state": {"waiting": waiting}}]},
            },
        ]
        monkeypatch.setattr(backend, "_plugin_pods", lambda node: pods)
        assert backend.plugin_restarts("n1") == PluginRestarts(
            5, "container plugin of pod dp-b is crash-looping: back-off 40s restarting failed container=plugin"
        )
        pods[1]["status"]["containerStatuses"][0]["state"] = {"running": {}}  # type: ignore[index]
        assert backend.plugin_restarts("n1") == PluginRestarts(5, None)
    finally:
        backend.close()


@pytest.mark.parametrize("cid", ["abc; touch /pwned", "$(reboot)", "a" * 63, "A" * 64, "-s", "0" * 64 + "\n"])
def test_container_ids_from_pod_status_never_reach_a_shell(cid: str) -> None:
    """Issue 11: the containerID went unquoted into ``sh -c`` as root on the node."""
    from pytest_devplug.backends.base import ExecResult
    from pytest_devplug.errors import BackendError
    from pytest_devplug.backends.k8s.nodeops import NodeOps

    scripts: list[str] = []

    class Transport:
        def run(self, node: str, script: str, *, timeout: float) -> ExecResult:
            scripts.append(script)
            return ExecResult(0, "", "")

    ops = NodeOps(Transport(), 5.0)  # type: ignore[arg-type]
    with pytest.raises(BackendError, match="not a containerd container ID"):
        ops.kill_container("kind-worker", cid)
    assert scripts == []
    good = "0123456789abcdef" * 4
    ops.kill_container("kind-worker", good)
    assert scripts == [f"ctr -n k8s.io task kill -s SIGKILL {good}"]
