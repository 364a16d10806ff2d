"""Developer and CI entry points: `nox -s tests` (the test suite), `nox -s conformance` (the main job)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["tests", "conformance"]
nox.options.error_on_missing_interpreters = False

PYTHON = ["3.11", "3.12", "3.13", "3.10"]
GRPC_TOOLS = "grpcio-tools==1.85.1"  # pinned: tools/genproto.py generates the .pyi stubs with exactly it
E2E_CLUSTER = "devplug-e2e"  # the e2e session creates and deletes this one


def _install(session: nox.Session, *extra: str) -> None:
    session.install("-e", ".[kind]", "-e", "./plugin_under_test", *extra)


@nox.session(python=PYTHON[0])
def tests(session: nox.Session) -> None:
    """Unit and integration tests on the embedded kubelet (no Docker needed)."""
    _install(session, GRPC_TOOLS, "mypy>=1.10", "types-protobuf", "build", "twine")
    session.run("mypy")
    session.run("pytest", "-m", "not kind", *session.posargs)


@nox.session(python=PYTHON[0])
def conformance(session: nox.Session) -> None:
    """The shipped conformance suite against the included GPU plugin on the embedded kubelet."""
    session.install(".", "./plugin_under_test")
    # From an empty directory: the suite must need nothing of this repo.
    with tempfile.TemporaryDirectory(prefix="devplug-conformance-") as empty:
        session.chdir(empty)
        session.run("devplug", "conformance", "--backend", "sim", *session.posargs)


@nox.session(python=PYTHON[0])
def proto(session: nox.Session) -> None:
    """Regenerate the gRPC stubs of both distributions from proto/."""
    session.install(GRPC_TOOLS)
    session.run("python", "tools/genproto.py")


@nox.session(python=PYTHON[0])
def bench(session: nox.Session) -> None:
    """Benchmarks of the embedded kubelet and of failing a broken plugin fast (results go to bench/RESULTS.md by hand)."""
    _install(session)
    session.run("python", "bench/bench_sim.py", *session.posargs)
    session.run("python", "bench/bench_fail_fast.py")


@nox.session(python=PYTHON[0])
def e2e(session: nox.Session) -> None:
    """The kind tier: smoke and multi-node tests, the conformance suite on kind, sim-vs-kind differentials.

    Where no container registry answers, kind-config/offline/build-all.sh builds the node and Python base
    images first (cached; seconds when warm); elsewhere kind pulls its standard images. Under CI a kind test
    that cannot get its cluster fails instead of skipping.
    """
    _install(session)
    ensure = ROOT.parent / "shared" / "ci" / "ensure-docker"
    if ensure.exists():
        session.run("bash", str(ensure), external=True)
    session.run("bash", "kind-config/offline/build-all.sh", "--auto", external=True)
    env = {"DEVPLUG_KIND_REQUIRED": os.environ.get("CI", "")}
    session.run("pytest", "-m", "kind", "tests/kind", *session.posargs, env=env)
    kind_args = ["--devplug-backend", "kind", "--devplug-timeout", "60", f"--cluster-name={E2E_CLUSTER}"]
    try:
        # One cluster for both runs: the conformance run keeps it, the differential run reuses it.
        session.run("pytest", "--pyargs", "pytest_devplug.conformance", *kind_args, "--keep-cluster", env=env)
        session.run("pytest", "-m", "kind", "tests/differential", *kind_args, env=env)
    finally:
        kind = session.run("bash", "kind-config/offline/ensure-kind.sh", external=True, silent=True)
        session.run(str(kind).strip().splitlines()[-1], "delete", "cluster", "--name", E2E_CLUSTER, external=True)
