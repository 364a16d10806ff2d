"""Where the control plane's binaries come from: the order of the sources, envtest's layout, the cache of the
offline kind build, and release downloads checked against their SHA-256 (served here from 127.0.0.1)."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.controlplane import binaries
from pytest_devplug.controlplane.binaries import COMPONENTS, resolve
from pytest_devplug.errors import BinariesNotFoundError, ControlPlaneError
from pytest_devplug.kubeletmodel.releases import release as pinned
from pytest_devplug.kubeletmodel.releases import releases

#: The default release's pins: what resolve() looks for when no version is named.
KUBERNETES_VERSION, ETCD_VERSION = pinned().kubernetes, pinned().etcd

REPO = Path(__file__).resolve().parents[2]


def _exe(d: Path, name: str, body: str = "#!/bin/sh\necho fake\n") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_text(body)
    p.chmod(0o755)
    return p


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"DEVPLUG_CACHE_DIR": str(tmp_path / "cache"), **extra}


@pytest.mark.parametrize("minor", list(releases()))
def test_versions_are_the_offline_kind_builds(minor: str) -> None:
    """One build serves both: lib.sh reads the same releases.tsv row as resolve() does for each release."""
    out = subprocess.run(
        ["bash", "-c", '. kind-config/offline/lib.sh && echo "$KUBERNETES_VERSION $ETCD_VERSION $ETCD_IMAGE_TAG"'],
        cwd=REPO,
        env={**os.environ, "DEVPLUG_KUBERNETES_VERSION": minor, "DEVPLUG_CACHE_DIR": "/tmp/devplug-pins-test"},
        capture_output=True,
        text=True,
        check=True,
    )
    pins = pinned(minor)
    assert out.stdout.split() == [pins.kubernetes, pins.etcd, pins.etcd_image]


def test_each_release_resolves_its_own_cache_dirs(tmp_path: Path) -> None:
    """A cache holding 1.35's build does not serve a 1.37 run, and the other way round; a build of the control plane
    alone (1.35's here: ``build-k8s.sh --control-plane``) serves as well as a whole one."""
    for minor, marker in (("1.35", ".complete-control-plane"), ("1.37", ".complete")):
        pins = pinned(minor)
        for part, version, names in (("k8s", pins.kubernetes, COMPONENTS[1:]), ("etcd", pins.etcd, ("etcd",))):
            d = tmp_path / "cache/offline" / part / version / "bin"
            for c in names:
                _exe(d, c)
            (d / (marker if part == "k8s" else ".complete")).touch()
    for minor in ("1.35", "1.37"):
        found = resolve(version=minor, env=_env(tmp_path), download=False)
        assert f"/{pinned(minor).kubernetes}/" in str(found["kube-apiserver"])
        assert f"kubernetes {pinned(minor).kubernetes}" in found.describe()
    with pytest.raises(BinariesNotFoundError, match="--kubernetes-version 1.36"):
        resolve(version="1.36", env=_env(tmp_path), download=False)


def test_cache_root_follows_the_offline_build_rule(tmp_path: Path) -> None:
    """lib.sh: ${DEVPLUG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-devplug}."""
    assert binaries.cache_root({"DEVPLUG_CACHE_DIR": "/x"}) == Path("/x")
    assert binaries.cache_root({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/pytest-devplug")
    assert binaries.cache_root({"HOME": "/h"}) == Path("/h/.cache/pytest-devplug")


def test_bin_dir_first_then_envtest_then_cache(tmp_path: Path) -> None:
    bin_dir, assets = tmp_path / "bin", tmp_path / "envtest"
    _exe(bin_dir, "kube-apiserver")
    for c in ("etcd", "kube-apiserver", "kubectl"):  # setup-envtest's layout: no scheduler, no controller manager
        _exe(assets, c)
    k8s = tmp_path / "cache/offline/k8s" / KUBERNETES_VERSION / "bin"
    for c in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        _exe(k8s, c)
    (k8s / ".complete").touch()
    found = resolve(bin_dir, env=_env(tmp_path, KUBEBUILDER_ASSETS=str(assets)), download=False)
    assert found["kube-apiserver"] == bin_dir / "kube-apiserver"
    assert found["etcd"] == assets / "etcd" and found["kubectl"] == assets / "kubectl"
    assert found["kube-scheduler"] == k8s / "kube-scheduler"
    assert found["kube-controller-manager"] == k8s / "kube-controller-manager"
    assert found.sources["etcd"] == f"KUBEBUILDER_ASSETS={assets}"
    assert f"kubernetes {KUBERNETES_VERSION}" in found.describe()


def test_an_unfinished_cache_build_is_not_used(tmp_path: Path) -> None:
    k8s = tmp_path / "cache/offline/k8s" / KUBERNETES_VERSION / "bin"
    for c in COMPONENTS:
        _exe(k8s, c)  # no .complete: the build is still running (or died half-way)
    with pytest.raises(BinariesNotFoundError) as ei:
        resolve(env=_env(tmp_path), download=False)
    msg = str(ei.value)
    assert "no etcd, kube-apiserver, kube-scheduler, kube-controller-manager" in msg
    for way_out in ("--devplug-k8s-bin-dir", "KUBEBUILDER_ASSETS", "devplug control-plane build", "release download"):
        assert way_out in msg


def test_a_bin_dir_that_is_not_a_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(BinariesNotFoundError, match=r"--devplug-k8s-bin-dir '.*nope': not a directory"):
        resolve(tmp_path / "nope", env=_env(tmp_path), download=False)


class _Release:
    """A local stand-in for dl.k8s.io and etcd's GitHub release: files by path, from a dict."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        files, requests = self.files, self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                requests.append(self.path)
                body = files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's signature
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def publish(self, *, corrupt: str | None = None) -> None:
        arch = binaries._arch()
        for c in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
            data = f"#!/bin/sh\necho {c}\n".encode()
            self.files[f"/k8s/{KUBERNETES_VERSION}/bin/linux/{arch}/{c}"] = data + (b"x" if c == corrupt else b"")
            self.files[f"/k8s/{KUBERNETES_VERSION}/bin/linux/{arch}/{c}.sha256"] = (
                hashlib.sha256(data).hexdigest().encode() + b"\n"
            )
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            data = b"#!/bin/sh\necho etcd\n"
            info = tarfile.TarInfo(f"etcd-{ETCD_VERSION}-linux-{arch}/etcd")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tgz = buf.getvalue()
        name = f"etcd-{ETCD_VERSION}-linux-{arch}.tar.gz"
        self.files[f"/etcd/{ETCD_VERSION}/{name}"] = tgz
        sums = f"{'0' * 64}  etcd-{ETCD_VERSION}-darwin-{arch}.zip\n{hashlib.sha256(tgz).hexdigest()}  {name}\n"
        self.files[f"/etcd/{ETCD_VERSION}/SHA256SUMS"] = sums.encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def release() -> Iterator[_Release]:
    r = _Release()
    yield r
    r.close()


def test_release_download_is_checked_and_cached(tmp_path: Path, release: _Release) -> None:
    release.publish()
    env = _env(tmp_path)
    found = resolve(env=env, k8s_url=f"{release.url}/k8s", etcd_url=f"{release.url}/etcd")
    for c in COMPONENTS:
        assert found[c].read_text().startswith("#!/bin/sh")
        assert found.sources[c].startswith("release download ")
    assert found["etcd"].read_text() == "#!/bin/sh\necho etcd\n"
    # The next run finds them in the cache, without asking the server again.
    asked = len(release.requests)
    again = resolve(env=env, k8s_url=f"{release.url}/k8s", etcd_url=f"{release.url}/etcd")
    assert again.paths == found.paths and len(release.requests) == asked


def test_a_download_whose_sha256_does_not_match_is_refused(tmp_path: Path, release: _Release) -> None:
    release.publish(corrupt="kube-scheduler")
    with pytest.raises(ControlPlaneError, match=r"kube-scheduler: SHA-256 [0-9a-f]{64} does not match the published"):
        resolve(env=_env(tmp_path), k8s_url=f"{release.url}/k8s", etcd_url=f"{release.url}/etcd")
    cached = tmp_path / "cache" / "release"
    assert not [p for p in cached.rglob("kube-scheduler*")], "a refused download must not be left in the cache"


def test_an_unreachable_release_server_ends_in_the_ways_out(tmp_path: Path, release: _Release) -> None:
    with pytest.raises(BinariesNotFoundError) as ei:  # nothing published: 404
        resolve(env=_env(tmp_path), k8s_url=f"{release.url}/k8s", etcd_url=f"{release.url}/etcd")
    assert "the release downloads (HTTP Error 404" in str(ei.value) and "KUBEBUILDER_ASSETS" in str(ei.value)
