"""Plugins as they ship: a plugin that hard-codes ``/var/lib/kubelet/device-plugins`` runs in a private
mount namespace per node with that node's directories at the kubelet's standard paths."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.backends.base import BackendOptions, PluginSpec
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.procs import launcher
from pytest_devplug.sim.embeddedplane import EmbeddedPlane

from ._helpers import allocatable, wait_for

WIDGET = Path(__file__).resolve().parents[1] / "fixture_plugins" / "widget.py"
LAUNCHER = [sys.executable, "-I", "-S", launcher.__file__]
KUBELET_DIR = "/var/lib/kubelet"


def host_view() -> dict[str, bool]:
    """Whether the host has what a namespace would make at the standard paths (it must make none of it).

    Only these paths: other jobs on this machine may change the rest of ``/var/lib/kubelet``."""
    paths = [
        *launcher.KUBELET_PATHS.values(),
        "/run/cdi",
        f"{KUBELET_DIR}/device-plugins/made-inside",
        f"{KUBELET_DIR}/device-plugins/widget.sock",
    ]
    return {p: os.path.lexists(p) for p in paths}


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A temp dir under /tmp that other users may enter (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="devplug-nstest-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_launcher_binds_node_dirs_at_the_standard_paths_and_leaves_the_host_alone(tmp_path: Path) -> None:
    if launcher_problem := _problem():
        pytest.skip(f"this machine allows no private mount namespace: {launcher_problem}")
    before = host_view()
    binds = []
    for name in launcher.KUBELET_PATHS:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"in-{name}").write_text(name)
        binds += ["--bind", str(tmp_path / name), launcher.KUBELET_PATHS[name]]
    (tmp_path / "scratch").mkdir()
    script = "; ".join(f"cat {p}/in-{n}; echo" for n, p in launcher.KUBELET_PATHS.items())
    script += f"; ls {KUBELET_DIR}; touch {KUBELET_DIR}/device-plugins/made-inside"
    done = subprocess.run(
        [*LAUNCHER, "--scratch", str(tmp_path / "scratch"), *binds, "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    # Each node dir shows at its standard path; /var/lib/kubelet holds only the node's dirs.
    under_kubelet = sorted(
        p.rsplit("/", 1)[1] for p in launcher.KUBELET_PATHS.values() if p.startswith(KUBELET_DIR + "/")
    )
    assert under_kubelet == ["device-plugins", "plugins", "plugins_registry", "pod-resources"]
    assert done.stdout.split() == [*launcher.KUBELET_PATHS, *under_kubelet]
    assert (tmp_path / "device-plugins" / "made-inside").exists()
    assert host_view() == before


def test_a_new_top_level_directory_and_a_file_in_a_host_directory(tmp_path: Path) -> None:
    """What a driver's image has and a host lacks: ``/driver-root`` (a new directory at the top: the layer holding it
    becomes the process's root) and ``/usr/bin/nvidia-cdi-hook`` (a file beside the host's own); the host sees
    neither, and the host's files stay visible inside."""
    if launcher_problem := _problem():
        pytest.skip(f"this machine allows no private mount namespace: {launcher_problem}")
    top, tool = "/devplug-test-root", "/usr/bin/devplug-test-tool"
    assert not os.path.lexists(top) and not os.path.lexists(tool)
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "marker").write_text("driver root")
    (tmp_path / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (tmp_path / "tool").chmod(0o755)
    (tmp_path / "dp").mkdir()
    (tmp_path / "scratch").mkdir()
    binds = [
        "--bind",
        str(tmp_path / "dp"),
        f"{KUBELET_DIR}/device-plugins",
        "--bind",
        str(tmp_path / "root"),
        top,
        "--bind",
        str(tmp_path / "tool"),
        tool,
    ]
    script = f"cat {top}/marker; echo; {tool}; test -x /bin/sh && ls {KUBELET_DIR} && cat {tmp_path}/root/marker"
    done = subprocess.run(
        [*LAUNCHER, "--scratch", str(tmp_path / "scratch"), *binds, "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["driver root", "tool ran", "device-plugins", "driver root"], done.stdout
    assert not os.path.lexists(top) and not os.path.lexists(tool)


def test_a_failed_bind_names_the_mount_not_the_permissions(tmp_path: Path) -> None:
    """Root may unshare, so a mount that fails (its source gone) is said as it is, without advice about root or user
    namespaces."""
    if launcher_problem := _problem():
        pytest.skip(f"this machine allows no private mount namespace: {launcher_problem}")
    (tmp_path / "scratch").mkdir()
    done = subprocess.run(
        [
            *LAUNCHER,
            "--scratch",
            str(tmp_path / "scratch"),
            "--bind",
            str(tmp_path / "gone"),
            "/var/lib/kubelet/device-plugins",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 126
    assert f"mount {tmp_path / 'gone'} on /var/lib/kubelet/device-plugins: No such file or directory" in done.stderr
    assert "user namespaces" not in done.stderr, done.stderr


def test_unprivileged_user_gets_the_namespace_through_a_user_namespace(shared_tmp: Path) -> None:
    """As nobody, through an unprivileged user namespace (uid and gid mapped to themselves)."""
    setpriv, python = shutil.which("setpriv"), shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or not setpriv or not python:
        pytest.skip("needs root to become nobody, setpriv and a system python3 nobody can run")
    nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    if subprocess.run([*nobody, python, "-c", "pass"], capture_output=True).returncode != 0:
        pytest.skip(f"nobody cannot run {python}")
    script = shared_tmp / "launcher.py"
    shutil.copy(launcher.__file__, script)
    script.chmod(0o644)
    node = shared_tmp / "dp"
    scratch = shared_tmp / "scratch"
    for d in (node, scratch):
        d.mkdir()
        d.chmod(0o777)
    (node / "kubelet.sock.stand-in").write_text("x")
    cmd = [*nobody, python, "-I", "-S", str(script), "--probe"]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        pytest.skip("unprivileged user namespaces are disabled on this machine (the error path is tested below)")
    done = subprocess.run(
        [
            *nobody,
            python,
            "-I",
            "-S",
            str(script),
            "--scratch",
            str(scratch),
            "--bind",
            str(node),
            launcher.KUBELET_PATHS["device-plugins"],
            "--",
            "sh",
            "-c",
            f"id -u; ls {launcher.KUBELET_PATHS['device-plugins']}; "
            f"touch {launcher.KUBELET_PATHS['device-plugins']}/mine",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["65534", "kubelet.sock.stand-in"]
    assert (node / "mine").stat().st_uid == 65534  # the plugin keeps its own identity


RESTRICTED = 'echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --bounding-set=-all --inh-caps=-all "$@"'


def restricted(argv: list[str]) -> list[str]:
    """Run ``argv`` where neither way works: no CAP_SYS_ADMIN and no user namespaces (like a default
    Docker container)."""
    return ["unshare", "--user", "--map-root-user", "sh", "-c", RESTRICTED, "sh", *argv]


def _restrictable() -> bool:
    if not shutil.which("unshare") or not shutil.which("setpriv"):
        return False
    return subprocess.run(restricted(["true"]), capture_output=True).returncode == 0


def test_no_root_and_no_user_namespaces_is_one_clear_error(tmp_path: Path) -> None:
    if not _restrictable():
        pytest.skip("cannot build a user namespace without caps here to reproduce the refusal")
    probe = subprocess.run(restricted([*LAUNCHER, "--probe"]), capture_output=True, text=True, timeout=30)
    assert probe.returncode == 126
    assert "Operation not permitted" in probe.stderr and "No space left on device" in probe.stderr
    # Through the process layer: a specific exception naming both ways out, before anything runs.
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from pytest_devplug.errors import NamespaceUnavailableError
        from pytest_devplug.procs.process import PluginProcess
        d = Path({str(tmp_path)!r})
        p = PluginProcess(["true"], log_path=d / "p.log", binds=[(d / "dp", "/var/lib/kubelet/device-plugins")])
        try:
            p.start()
        except NamespaceUnavailableError as exc:
            print("REFUSED", exc)
        else:
            print("STARTED")
    """)
    done = subprocess.run(restricted([sys.executable, "-c", code]), capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("REFUSED"), done.stdout + done.stderr
    for needle in ("root", "unprivileged user namespaces", "put {plugin_dir} in the plugin command"):
        assert needle in done.stdout


def _problem() -> str | None:
    from pytest_devplug.procs.process import namespace_problem

    return namespace_problem()


def test_two_nodes_run_the_hard_coded_plugin_in_isolation(tmp_path: Path) -> None:
    if problem := _problem():
        pytest.skip(f"this machine allows no private mount namespace: {problem}")
    before = host_view()
    with EmbeddedPlane(Path(tempfile.mkdtemp(prefix="devplug-ns-", dir="/tmp"))) as cluster:
        try:
            nodes = [cluster.add_node(n) for n in ("node-a", "node-b")]
            for i, node in enumerate(nodes):
                node.start_plugin([sys.executable, str(WIDGET), "--count", str(2 + i)], standard_paths=True)
            for i, node in enumerate(nodes):
                want = (str(2 + i), str(2 + i))
                wait_for(
                    lambda node=node: allocatable(cluster, node.name, "example.com/widget"),
                    lambda v, want=want: v == want,
                    f"{want} widgets on {node.name}",
                    timeout=20,
                )
            for node in nodes:
                # Each plugin saw only its own node's directory (its kubelet.sock, nobody else's socket).
                log = node.plugin("plugin").log()
                assert "widget: plugin dir holds ['kubelet.sock']" in log, log
                assert (node.plugin_dir / "widget.sock").is_socket()
                assert node.kubelet_log().count("Got registration request") == 1
        finally:
            shutil.rmtree(cluster.workdir, ignore_errors=True)
    assert host_view() == before


def test_plugin_spec_fills_its_placeholders_in_one_pass() -> None:
    spec = PluginSpec(
        argv=["{python}", "p.py", "--dir={plugin_dir}", "--state", "{mock_state}", "{other}"],
        env={"DP_PLUGIN_DIR": "{plugin_dir}/x", "KEEP": "plain"},
    )
    argv, env = spec.command(plugin_dir="/n/{mock_state}", mock_state=Path("/m/state.json"))
    # a value holding a placeholder's text is not filled again; an unknown placeholder is left as it is
    assert argv == [sys.executable, "p.py", "--dir=/n/{mock_state}", "--state", "/m/state.json", "{other}"]
    assert env == {"DP_PLUGIN_DIR": "/n/{mock_state}/x", "KEEP": "plain"}
    assert spec.command(plugin_dir="/d", mock_state=None)[0][4] == ""  # no mock: {mock_state} is empty
    assert spec.argv[2] == "--dir={plugin_dir}"  # the spec itself keeps them


def test_sim_backend_picks_the_standard_paths_when_the_command_has_no_plugin_dir() -> None:
    assert PluginSpec(argv=["plugin"]).uses_standard_paths()
    assert not PluginSpec(argv=["plugin", "--plugin-dir", "{plugin_dir}"]).uses_standard_paths()
    assert not PluginSpec(argv=["plugin"], env={"DP_PLUGIN_DIR": "{plugin_dir}"}).uses_standard_paths()
    assert PluginSpec(argv=["plugin", "--dir={plugin_dir}"], standard_paths=True).uses_standard_paths()
    assert not PluginSpec(argv=["plugin"], standard_paths=False).uses_standard_paths()
    if problem := _problem():
        pytest.skip(f"this machine allows no private mount namespace: {problem}")
    backend = SimBackend(BackendOptions(timeout=20))
    backend.start()
    try:
        from pytest_devplug.backends.base import NodeSpec

        node = backend.ensure_node(NodeSpec("n1"))
        backend.deploy_plugin(node, PluginSpec(resource_name="example.com/widget", argv=[sys.executable, str(WIDGET)]))
        wait_for(
            lambda: backend.get_node(node)["status"]["allocatable"].get("example.com/widget"),
            lambda v: v == "3",
            "3 widgets allocatable",
            timeout=20,
        )
        assert "/var/lib/kubelet/device-plugins is " in backend.plugin_log(node)
    finally:
        backend.close()


def test_conformance_suite_passes_a_plugin_with_the_hard_coded_path(tmp_path: Path) -> None:
    """The whole shipped suite, through ``devplug conformance``, on a command without ``{plugin_dir}``."""
    if problem := _problem():
        pytest.skip(f"this machine allows no private mount namespace: {problem}")
    devplug = os.path.join(os.path.dirname(sys.executable), "devplug")
    done = subprocess.run(
        [
            devplug,
            "conformance",
            "--plugin-cmd",
            f"{{python}} {WIDGET}",
            "--resource-name",
            "example.com/widget",
            "--timeout",
            "10",
            "--",
            "-q",
            "-p",
            "no:randomly",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = [ln for ln in done.stdout.splitlines() if " passed" in ln][-1]
    assert "failed" not in summary and "error" not in summary, summary
