"""Developer and CI entry points: `nox -s tests` (the test suite), `nox -s conformance` (the main job)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests", "conformance"]
nox.options.error_on_missing_interpreters = False

PYTHON = ["3.11", "3.12", "3.13", "3.10"]
LOWEST_PYTHON = "3.10"  # requires-python's floor
GRPC_TOOLS = "grpcio-tools==1.85.1"  # pinned: tools/genproto.py generates the .pyi stubs with exactly it
HYPOTHESIS = "hypothesis>=6.100"  # tests/reliability: bounded fuzzing of the adversarial paths
#: The tests run in three processes (pytest-xdist): they mostly wait on gRPC streams, plugin processes, real
#: control planes and the kubelet's own real-time bounds (a whole suite run keeps about a fifth of a core busy),
#: so three workers finish in about two thirds of the time on two cores, where more only raise the load and so
#: every wait. Every test keeps to its own temp dirs, sockets, ports and processes.
XDIST = ("pytest-xdist>=3.5", "-n", "3")
E2E_CLUSTER = "devplug-e2e"  # the e2e session creates and deletes this one


def _interpreter(version: str) -> str:
    """``version`` when ``python<version>`` runs; else a pyenv build of it (never a download)."""
    exe = shutil.which(f"python{version}")
    if exe and subprocess.run([exe, "-c", ""], capture_output=True, check=False).returncode == 0:
        return version
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    builds = sorted(root.glob(f"versions/{version}.*/bin/python{version}"))
    return str(builds[-1]) if builds else version


def _install(session: nox.Session, *extra: str) -> None:
    # the plugin's dra extra: its DRA driver (--dra) needs the kubernetes client
    session.install("-e", ".[kind]", "-e", "./plugin_under_test[dra]", *extra)


#: Pinned: ``ruff format --check`` is part of lint, and the formatter's layout changes between ruff releases.
RUFF = "ruff==0.17.6"
#: Every Python file of the repository (the generated gRPC stubs are excluded in pyproject.toml).
PYTHON_PATHS = ("src", "tests", "plugin_under_test/src", "bench", "tools", "kind-config", "noxfile.py", "docs/hooks.py")


@nox.session(python=PYTHON[0])
def lint(session: nox.Session) -> None:
    """ruff's checks and formatting on every Python file (pyproject's [tool.ruff]: lines of 120) and mypy --strict
    on both distributions' sources."""
    _install(session, RUFF, "mypy>=1.10", "types-protobuf", "types-PyYAML")
    session.run("ruff", "check", *PYTHON_PATHS)
    session.run("ruff", "format", "--check", *PYTHON_PATHS)
    session.run("mypy")  # strict = true in pyproject's [tool.mypy]


#: The docs site's tools: mkdocs 1.6 for `validation:` (links and anchors checked), mkdocstrings 0.26 with the
#: python handler for the reference pages rendered from docstrings.
DOCS_TOOLS = ("mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26")


@nox.session(python=PYTHON[0])
def docs(session: nox.Session) -> None:
    """Build the docs site (mkdocs.yml) with warnings as errors: a broken link or anchor, a page missing from the
    nav, a docstring mkdocstrings cannot read fail the session. No network after the install (font: false)."""
    session.install("-e", ".", *DOCS_TOOLS)
    site = Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), env={"NO_MKDOCS_2_WARNING": "1"})
    session.log(f"site: {site / 'index.html'}")


def _put_pyenv_builds_on_path(versions: list[str]) -> list[str]:
    """Put the pyenv build of each version whose ``python<version>`` does not run (a pyenv shim without that
    version selected) first on PATH, so sessions are named ``tests-3.12`` whatever the machine; returns the
    versions this machine can run."""
    found = []
    for version in versions:
        exe = _interpreter(version)
        if os.sep in exe:
            os.environ["PATH"] = f"{Path(exe).parent}{os.pathsep}{os.environ.get('PATH', '')}"
            found.append(version)
        elif shutil.which(exe := f"python{version}"):
            if subprocess.run([exe, "-c", ""], capture_output=True, check=False).returncode == 0:
                found.append(version)
    return found


#: pyproject's classifiers (3.10-3.13) that this machine has, in PYTHON's order.
TEST_PYTHONS = _put_pyenv_builds_on_path(PYTHON) or [PYTHON[0]]


def _tests(session: nox.Session) -> None:
    _install(session, GRPC_TOOLS, "build", "twine", HYPOTHESIS, XDIST[0])
    # The real control plane's binaries for the embedded-vs-real differential: the offline kind build's cache
    # (the same dirs CI caches for it), built from Go modules when cold; instant when cached.
    session.run("devplug", "control-plane", "build")
    session.run("pytest", "-m", "not kind", *XDIST[1:], *session.posargs)


@nox.session(python=None)
def tests(session: nox.Session) -> None:
    """Unit and integration tests on the embedded kubelet (no Docker needed), on the Python running nox: one suite's
    time once the Kubernetes build is cached (``tests_matrix`` runs them on every supported Python)."""
    _tests(session)


@nox.session(python=TEST_PYTHONS)
def tests_matrix(session: nox.Session) -> None:
    """The same tests on every supported Python this machine has (``nox -s "tests_matrix-3.12"``: one of them)."""
    _tests(session)


@nox.session(python=_interpreter(LOWEST_PYTHON), venv_backend="uv")
def tests_lowest(session: nox.Session) -> None:
    """The tests on the oldest supported Python and the oldest release of every dependency (pyproject's floors).

    ``--resolution lowest-direct`` installs exactly the floors (pytest 8.0, grpcio, protobuf, kubernetes, ...), so a
    floor that stops working fails here. The kubernetes client has two: the harness's own (the ``[kind]`` and
    ``[cluster]`` extras), under which one cheap test sends the real control plane every kind of request the harness
    makes, and the included driver's ``[dra]`` extra, installed after it for the rest.
    """
    session.install("--resolution", "lowest-direct", "-e", ".[kind]", "-e", "./plugin_under_test")
    session.install(HYPOTHESIS, XDIST[0])  # test tools, not dependencies: any release of them will do
    floors = (
        "import sys, grpc, google.protobuf, kubernetes, pytest; print('lowest:', sys.version.split()[0], 'grpcio', "
        "grpc.__version__, 'protobuf', google.protobuf.__version__, 'kubernetes', kubernetes.__version__, "
        "'pytest', pytest.__version__)"
    )
    session.run("python", "-c", floors)
    session.run("devplug", "control-plane", "build")  # the binaries (cached by nox -s tests; built when cold)
    session.run("pytest", "tests/controlplane/test_kube_client.py")
    session.install("--resolution", "lowest-direct", "-e", "./plugin_under_test[dra]")
    session.run("python", "-c", floors)
    # Left out: the stub drift test (needs the pinned generator, i.e. the newest grpcio), the distribution
    # tests (they build wheels and install them beside older pins themselves, in `nox -s tests`), and what
    # judges other programs rather than our floors: the peers' suite runs and the real control plane's tests
    # (about 20 minutes, the same verdicts as in `nox -s tests`; the requests they make are the cheap test's above).
    session.run(
        "pytest",
        "-m",
        "not kind",
        "--ignore=tests/test_proto_stubs.py",
        "--ignore=tests/distribution",
        "--ignore=tests/peers",
        "--ignore=tests/controlplane",
        "--ignore=tests/sim/test_embedded_vs_real.py",
        "--ignore=tests/dra",
        *XDIST[1:],
        *session.posargs,
    )


@nox.session(python=PYTHON[0])
def conformance(session: nox.Session) -> None:
    """The shipped conformance suite against the included GPU plugin on the embedded kubelet."""
    session.install(".", "./plugin_under_test")
    # From an empty directory: the suite must need nothing of this repo.
    with tempfile.TemporaryDirectory(prefix="devplug-conformance-") as empty:
        session.chdir(empty)
        session.run("devplug", "conformance", "--backend", "sim", *session.posargs)


def _releases() -> tuple[list[str], str]:
    """The supported Kubernetes releases (kubeletmodel/releases.tsv) and the default one."""
    rows = [
        r.split("\t")
        for r in (ROOT / "src/pytest_devplug/kubeletmodel/releases.tsv").read_text().splitlines()
        if r.strip() and not r.startswith("#")
    ]
    return [r[0] for r in rows], next(r[0] for r in rows if r[7] == "default")


@nox.session(python=PYTHON[0])
def versions(session: nox.Session) -> None:
    """The conformance suite against the included plugin on every supported Kubernetes release besides the default
    one (``nox -s tests`` and ``nox -s conformance`` run that): on the embedded control plane, two releases at a time
    (the runs mostly wait), then, one release after the other, on that release's real control plane (its binaries
    built from Go modules into the cache once per release, ~8 min cold each) with the DRA suite there.
    ``nox -s versions -- 1.36`` runs the releases named; ``-- --embedded`` only the embedded control plane (no build:
    what CI runs)."""
    session.install("-e", ".[cluster]", "-e", "./plugin_under_test[dra]")
    supported, default = _releases()
    embedded_only = "--embedded" in session.posargs
    chosen = [a for a in session.posargs if a != "--embedded"] or [r for r in supported if r != default]
    unknown = [r for r in chosen if r not in supported]
    if unknown:
        session.error(f"unknown release(s) {', '.join(unknown)}; supported: {', '.join(supported)}")
    clock = _Clock(session)
    devplug = str(Path(session.bin) / "devplug")
    with tempfile.TemporaryDirectory(prefix="devplug-versions-") as work:
        failed = []
        for pair in (chosen[i : i + 2] for i in range(0, len(chosen), 2)):
            runs = {}
            for minor in pair:
                cwd = Path(work) / minor
                cwd.mkdir()
                log = (cwd / "conformance.log").open("w")
                runs[minor] = (
                    subprocess.Popen(
                        [devplug, "conformance", "--kubernetes-version", minor],
                        cwd=cwd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    ),
                    log,
                )
            for minor, (proc, log) in runs.items():
                rc = proc.wait()
                log.close()
                text = Path(log.name).read_text()
                session.log(f"kubernetes {minor}, embedded control plane: exit {rc}; {text.strip().splitlines()[-1]}")
                if rc != 0:
                    print(text[-6000:])
                    failed.append(f"{minor} (embedded)")
            clock.lap(f"{', '.join(pair)}: conformance, embedded control plane")
        if failed:
            session.error(f"the conformance suite failed on: {', '.join(failed)}")
        if embedded_only:
            return
        for minor in chosen:
            session.chdir(ROOT)
            session.run("devplug", "control-plane", "build", "--kubernetes-version", minor)
            clock.lap(f"{minor}: control plane binaries")
            session.chdir(work)
            session.run("devplug", "conformance", "--kubernetes-version", minor, "--control-plane", "real")
            session.run("devplug", "conformance", "--kubernetes-version", minor, "--dra")
            clock.lap(f"{minor}: conformance and DRA suite, real control plane")


@nox.session(python=PYTHON[0])
def proto(session: nox.Session) -> None:
    """Regenerate the gRPC stubs of both distributions from proto/."""
    session.install(GRPC_TOOLS)
    session.run("python", "tools/genproto.py")


@nox.session(python=PYTHON[0])
def bench(session: nox.Session) -> None:
    """Benchmarks of the embedded kubelet, of failing a broken plugin fast and of reliability under hostile
    input (results go to bench/RESULTS.md by hand)."""
    _install(session, HYPOTHESIS)
    session.run("python", "bench/bench_sim.py", *session.posargs)
    session.run("python", "bench/bench_fail_fast.py")
    session.run("python", "bench/bench_reliability.py")


@nox.session(python=PYTHON[0])
def e2e(session: nox.Session) -> None:
    """The kind tier on one shared multi-node kind cluster (kind-config/e2e.yaml), made with kind's CLI.

    The images first (the included plugin's, NVIDIA's; cached by their inputs); then every lane at once, each on
    nodes of its own (tools/e2e-lanes.sh): tests/kind (on a resource of its own, so its cluster-wide checks hold
    meanwhile), the conformance suite through the cluster backend (kubeconfig only, the plugin image loaded as a
    user pushes a release) and its grace-period test, NVIDIA's plugin under the suite in three configurations,
    the sim-vs-kind differentials and the checks only the kind backend runs, the DRA suite's checks split between
    the included driver and dra-example-driver (each check on a real kubelet once) and the DRA differential. Every
    backend run works in a namespace of its own.

    Where no container registry answers, kind-config/offline/build-all.sh builds the node and Python base
    images first (cached; seconds when warm); elsewhere kind pulls its standard images. Under CI a kind test
    that cannot get its cluster fails instead of skipping. ``DEVPLUG_E2E_CLUSTER`` names the cluster.
    """
    clock = _Clock(session)
    _install(session, "pip")  # the plugin image bakes wheels made by `python -m pip wheel` (uv venvs have no pip)
    ensure = ROOT.parent / "shared" / "ci" / "ensure-docker"
    if ensure.exists():
        session.run("bash", str(ensure), external=True)
    built = session.run("bash", "kind-config/offline/build-all.sh", "--auto", external=True, silent=True)
    offline = dict(line.split("=", 1) for line in str(built or "").splitlines() if line.startswith("DEVPLUG_"))
    kind = offline.get("DEVPLUG_KIND_BIN") or _last_line(
        session.run("bash", "kind-config/offline/ensure-kind.sh", external=True, silent=True)
    )
    name = os.environ.get("DEVPLUG_E2E_CLUSTER") or E2E_CLUSTER
    _ensure_inotify(session)
    # The kind backend and tests/kind reuse the cluster of this name (and leave it: --keep-cluster).
    env = {"DEVPLUG_KIND_REQUIRED": os.environ.get("CI", ""), **offline, "DEVPLUG_KIND_CLUSTER": name}
    python_base = offline.get("DEVPLUG_PYTHON_BASE")
    clock.lap("install, offline images, kind")
    with tempfile.TemporaryDirectory(prefix="devplug-e2e-") as tmp:
        image = _last_line(session.run("python", "tools/plugin-image.py", tmp, silent=True))
        session.run("bash", "peers/nvidia/build-image.sh", env=env, external=True, silent=True)  # cached for its lanes
        session.run("bash", "peers/dra-example/build-image.sh", env=env, external=True, silent=True)  # likewise
        session.run("bash", "peers/nvidia-dra/build-image.sh", env=env, external=True, silent=True)  # likewise
        clock.lap("images")
        try:
            kubeconfig = _create_kind_cluster(session, kind, name, Path(tmp), offline.get("DEVPLUG_KIND_NODE_IMAGE"))
            clock.lap("cluster")
            # Test pods on any node run the Python base (no registry). The offline node image has it preloaded, so
            # kind finds it on every node and loads nothing; a node image without it gets it here, into every node
            # once, first: the plugin image is built on it, so its load below adds only its own layers. The cluster
            # backend's lanes run the plugin image on worker2 and worker3: there it is loaded as a user pushes a
            # release. The kind backend's runs load what they use into their own nodes.
            if python_base:
                session.run(kind, "load", "docker-image", "--name", name, python_base, external=True)
            session.run(
                kind,
                "load",
                "docker-image",
                "--name",
                name,
                "--nodes",
                f"{name}-worker2,{name}-worker3",
                image,
                external=True,
            )
            clock.lap("image loads")
            session.run(
                "bash", "tools/e2e-lanes.sh", name, kubeconfig, image, python_base or "", env=env, external=True
            )
            clock.lap("lanes")
        finally:
            session.run(kind, "delete", "cluster", "--name", name, external=True)
            clock.lap("cluster delete")


#: inotify instances one kind node holds (systemd 4, kubelet 7, containerd 2, dbus 1; the control plane ~13 more).
_INOTIFY_PER_NODE = 14


#: kind's advice for hosts that run several nodes (its known-issues page).
_INOTIFY_ADVISED = 512


def _ensure_inotify(session: nox.Session) -> None:
    """Before the cluster starts, make sure the host user's inotify instances will do for e2e.yaml's nodes (a node
    short of them fails in odd places: a plugin's ``inotify_init1: Too many open files``): raise the limit to kind's
    advice where this session may (root), else say what to do."""
    limit_file = Path("/proc/sys/fs/inotify/max_user_instances")
    try:
        limit = int(limit_file.read_text())
    except (OSError, ValueError):
        return
    uid, used = os.getuid(), 0
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if fd_dir.stat().st_uid == uid:
                used += sum(1 for fd in fd_dir.iterdir() if os.readlink(fd) == "anon_inode:inotify")
        except OSError:
            continue
    nodes = (ROOT / "kind-config" / "e2e.yaml").read_text().count("- role: ")
    need = nodes * _INOTIFY_PER_NODE + 13
    if limit - used >= need:
        return
    if limit < _INOTIFY_ADVISED and os.geteuid() == 0:
        try:
            limit_file.write_text(f"{_INOTIFY_ADVISED}\n")
        except OSError as exc:
            session.warn(f"could not raise fs.inotify.max_user_instances from {limit}: {exc}")
        else:
            session.log(
                f"raised fs.inotify.max_user_instances from {limit} to {_INOTIFY_ADVISED} (kind's advice) "
                f"for {nodes} nodes"
            )
            limit = _INOTIFY_ADVISED
    if limit - used < need:
        session.warn(
            f"fs.inotify.max_user_instances is {limit} with {used} in use; the {nodes}-node e2e cluster needs about "
            f"{need}: raise it (kind's advice: sysctl -w fs.inotify.max_user_instances=512) or stop other kind clusters"
        )


class _Clock:
    """Logs how long each step of a session took, so a slow run says where its time went."""

    def __init__(self, session: nox.Session) -> None:
        self._session, self._start = session, time.monotonic()
        self._last = self._start

    def lap(self, step: str) -> None:
        now = time.monotonic()
        self._session.log(f"{step}: {now - self._last:.0f} s (since the session began: {now - self._start:.0f} s)")
        self._last = now


def _last_line(out: object) -> str:
    return str(out).strip().splitlines()[-1]


def _create_kind_cluster(session: nox.Session, kind: str, name: str, tmp: Path, node_image: str | None) -> str:
    """``kind create cluster`` from kind-config/e2e.yaml (offline settings added for the offline image)."""
    config = ROOT / "kind-config" / "e2e.yaml"
    image: list[str] = []
    if node_image:
        patched = tmp / "kind.yaml"
        session.run("python", "kind-config/offline/patch-config.py", str(config), str(patched), silent=True)
        config, image = patched, ["--image", node_image]
    kubeconfig = str(tmp / "kubeconfig")
    session.run(
        kind,
        "create",
        "cluster",
        "--name",
        name,
        "--config",
        str(config),
        "--kubeconfig",
        kubeconfig,
        *image,
        "--wait",
        "5m",
        external=True,
    )
    return kubeconfig
