"""Peer device plugins built from their Go modules by ``peers/build.sh`` (cached once per machine).

``peer_binary(name)`` answers the path of a built peer (``sample-device-plugin``, ``stub-plugin``,
``nvidia-device-plugin``, the DRA peers ``dra-example-kubeletplugin`` (v0.2.1),
``dra-example-kubeletplugin-patched`` (v0.2.1 + peers/dra-example/recreate-cdi-spec-on-restored-claim.patch,
kubernetes/kubernetes#141433) and ``dra-example-kubeletplugin-v040`` (v0.4.0 as released), and ``sriovdp`` and
``gpu-kubelet-plugin`` and ``compute-domain-kubelet-plugin`` (NVIDIA's DRA driver) from a source tarball:
``peers/build-source.sh``), building it on first use; the build is the script's, so ``nox -s tests``, CI and a
developer running ``peers/build.sh``
(DRA peers: ``peers/build-dra.sh``) share one cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from ..support import in_ci

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "peers" / "build.sh"
#: Peers built by another script (same cache layout): the DRA kubelet plugins.
BUILD_SCRIPTS = {
    **{
        name: BUILD_SCRIPT.with_name("build-dra.sh")
        for name in (
            "dra-example-kubeletplugin",
            "dra-example-kubeletplugin-patched",
            "dra-example-kubeletplugin-v040",
            "dra-example-kubeletplugin-v040-lib038",
        )
    },
    # from a source tarball or checkout (the Go module proxy refuses the module): DEVPLUG_SRIOV_SOURCE or ../shared
    "sriovdp": BUILD_SCRIPT.with_name("build-source.sh"),
    # NVIDIA's DRA driver, likewise: DEVPLUG_NVIDIA_DRA_SOURCE or ../shared
    "gpu-kubelet-plugin": BUILD_SCRIPT.with_name("build-source.sh"),
    # its ComputeDomain kubelet plugin (same source), the chart's CRDs kept beside it: <binary>/../../crds
    "compute-domain-kubelet-plugin": BUILD_SCRIPT.with_name("build-source.sh"),
}
#: A cold build downloads k8s.io/kubernetes' dependencies and compiles them: minutes on 2 cores.
BUILD_TIMEOUT_S = 1800.0


class PeerBuildError(Exception):
    """``peers/build.sh`` failed or printed no binary for the peer."""


class PeerSourceMissing(Exception):
    """A source-built peer has no source here (``peers/build-source.sh`` printed ``NAME -``); the text says why."""


def _go_available() -> bool:
    go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    return os.access(go, os.X_OK)


def build_peer(name: str) -> Path:
    """The binary of peer ``name``, built (or found cached) by peers/build.sh (DRA peers: peers/build-dra.sh)."""
    script = BUILD_SCRIPTS.get(name, BUILD_SCRIPT)
    try:
        done = subprocess.run(
            ["bash", str(script), name], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        log = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        raise PeerBuildError(
            f"{script.relative_to(script.parents[1])} {name} ran past {BUILD_TIMEOUT_S:.0f}s; its log:\n{log[-4000:]}"
        ) from None
    for line in done.stdout.splitlines():
        peer, _, path = line.partition(" ")
        if peer == name and done.returncode == 0 and path == "-":
            raise PeerSourceMissing(f"no source to build the peer {name} from: {done.stderr.strip().splitlines()[-1]}")
        if peer == name and done.returncode == 0 and os.access(path, os.X_OK):
            return Path(path)
    raise PeerBuildError(
        f"{script.relative_to(script.parents[1])} {name} exited {done.returncode} without a binary for {name}; "
        f"stdout: {done.stdout.strip()!r}; its log (last 4000 chars):\n{done.stderr[-4000:]}"
    )


@pytest.fixture(scope="session")
def peer_binary() -> Callable[[str], Path]:
    """Session-wide: ``peer_binary(name)`` builds or finds the peer once per run (once per machine, cached).

    Without a Go toolchain the test skips saying so, except under ``CI=true``, where it fails: CI must
    run the peers, not report them skipped.
    """
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            if not _go_available():
                reason = f"no Go toolchain (`go` not on PATH): cannot build the peer {name} from its Go module"
                if in_ci():
                    pytest.fail(reason + " (CI=true: peers must run there)", pytrace=False)
                pytest.skip(reason)
            try:
                built[name] = build_peer(name)
            except PeerSourceMissing as exc:
                if in_ci():
                    pytest.fail(f"{exc} (CI=true: peers must run there)", pytrace=False)
                pytest.skip(str(exc))
        return built[name]

    return get


@pytest.fixture
def docker_available() -> None:
    """Skips without a ``docker`` CLI (the kind peers build images and run kind), failing instead under CI."""
    if shutil.which("docker") is None:
        reason = "no `docker` on PATH: cannot build a peer's image or run kind"
        if in_ci():
            pytest.fail(reason + " (CI=true: the kind tier must run there)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def same_verdicts() -> Callable[[str, str, dict[str, str]], None]:
    """Record a suite run's verdicts (test -> passed/skipped) by peer and control plane; once a peer ran on both
    the embedded and the real control plane, the two must agree test for test."""
    seen: dict[str, dict[str, dict[str, str]]] = {}

    def record(peer: str, control_plane: str, verdicts: dict[str, str]) -> None:
        runs = seen.setdefault(peer, {})
        runs[control_plane] = verdicts
        if len(runs) == 2:
            emb, real = runs["embedded"], runs["real"]
            differ = {t: (emb.get(t), real.get(t)) for t in sorted(set(emb) | set(real)) if emb.get(t) != real.get(t)}
            assert not differ, (
                f"{peer}: verdicts differ between the embedded and the real control plane (embedded, real): {differ}"
            )

    return record
