"""Where the control plane's binaries come from, in a fixed order, each source filling what the earlier lacked.

1. ``--devplug-k8s-bin-dir`` (``bin_dir``): a directory holding the binaries under their usual names.
2. ``KUBEBUILDER_ASSETS``: envtest's convention, the directory ``setup-envtest use -p path`` prints (etcd,
   kube-apiserver, kubectl; it has no scheduler or controller manager, which come from the next source).
3. The cache ``devplug control-plane build`` fills (``gobuild.sh`` beside this module, which the offline kind build
   runs too): ``<cache>/offline/k8s/<version>/bin`` and ``<cache>/offline/etcd/<version>/bin``.
4. The official release binaries (``dl.k8s.io``, etcd's GitHub release), downloaded into the cache and
   checked against their published SHA-256 before they are made executable.

Each Kubernetes release has its own set (the run's ``--devplug-kubernetes-version``): the versions are those
``kubeletmodel/releases.tsv`` pins, which the offline kind build reads too.
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..kubeletmodel.releases import Release, release
from ..errors import BinariesNotFoundError, ControlPlaneError

__all__ = [
    "COMPONENTS",
    "ETCD_RELEASE_URL",
    "K8S_RELEASE_URL",
    "Binaries",
    "cache_root",
    "resolve",
]

#: What the control plane runs; kubectl is optional (only for people and tests).
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
K8S_RELEASE_URL = "https://dl.k8s.io/release"
ETCD_RELEASE_URL = "https://github.com/etcd-io/etcd/releases/download"
_DOWNLOAD_TIMEOUT = 60.0


@dataclass(frozen=True)
class Binaries:
    """One resolved set: the path of each component and the source it came from (for the report header)."""

    paths: Mapping[str, Path]
    sources: Mapping[str, str]
    kubernetes_version: str
    etcd_version: str

    def __getitem__(self, component: str) -> Path:
        return self.paths[component]

    def describe(self) -> str:
        where = sorted(set(self.sources.values()))
        return f"kubernetes {self.kubernetes_version}, etcd {self.etcd_version} (from {', '.join(where)})"


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """The cache the offline kind build uses (``lib.sh``'s ``CACHE_ROOT``): the same rule, so both find one build."""
    env = os.environ if env is None else env
    if env.get("DEVPLUG_CACHE_DIR"):
        return Path(env["DEVPLUG_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "pytest-devplug"


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _found(directory: Path, components: tuple[str, ...]) -> dict[str, Path]:
    out = {}
    for c in components:
        p = directory / c
        if p.is_file() and os.access(p, os.X_OK):
            out[c] = p
    return out


#: The offline build's markers of a finished build: the control plane alone (``build-k8s.sh --control-plane``), or
#: everything (the node's binaries too).
_COMPLETE = (".complete-control-plane", ".complete")


def _cache_dirs(root: Path, pins: Release) -> list[Path]:
    """The offline build's dirs, used only once complete (one of :data:`_COMPLETE`), then downloads."""
    offline = root / "offline"
    dirs = [offline / "k8s" / pins.kubernetes / "bin", offline / "etcd" / pins.etcd / "bin"]
    return [*(d for d in dirs if any((d / m).exists() for m in _COMPLETE)), _download_dir(root, pins)]


def _download_dir(root: Path, pins: Release) -> Path:
    return root / "release" / f"k8s-{pins.kubernetes}-etcd-{pins.etcd}-{_arch()}"


def resolve(
    bin_dir: str | Path | None = None,
    *,
    version: str | None = None,
    env: Mapping[str, str] | None = None,
    download: bool = True,
    k8s_url: str = K8S_RELEASE_URL,
    etcd_url: str = ETCD_RELEASE_URL,
) -> Binaries:
    """Find every component of release ``version`` (default: the default release; see the module docstring for
    the order); raise :class:`BinariesNotFoundError` naming the sources looked at and the ways out when one is
    still missing."""
    env = os.environ if env is None else env
    pins = release(version)
    wanted = (*COMPONENTS, "kubectl")
    paths: dict[str, Path] = {}
    sources: dict[str, str] = {}
    looked: list[str] = []

    def take(directory: Path, label: str) -> None:
        for c, p in _found(directory, tuple(w for w in wanted if w not in paths)).items():
            paths[c], sources[c] = p, label

    if bin_dir is not None:
        d = Path(bin_dir)
        if not d.is_dir():
            raise BinariesNotFoundError(f"--devplug-k8s-bin-dir {str(bin_dir)!r}: not a directory")
        take(d, f"--devplug-k8s-bin-dir {d}")
        looked.append(f"--devplug-k8s-bin-dir {d}")
    assets = env.get("KUBEBUILDER_ASSETS")
    if assets:
        take(Path(assets), f"KUBEBUILDER_ASSETS={assets}")
        looked.append(f"KUBEBUILDER_ASSETS={assets}")
    root = cache_root(env)
    for d in _cache_dirs(root, pins):
        take(d, f"cache {d}")
    looked.append(f"the cache {root}")
    missing = [c for c in COMPONENTS if c not in paths]
    if missing and download:
        try:
            fetched = _download(missing, _download_dir(root, pins), pins, k8s_url=k8s_url, etcd_url=etcd_url)
        except (OSError, urllib.error.URLError) as exc:
            looked.append(f"the release downloads ({exc})")
        else:
            for c, p in fetched.items():
                paths[c], sources[c] = p, f"release download {p.parent}"
            looked.append("the release downloads")
    missing = [c for c in COMPONENTS if c not in paths]
    if missing:
        raise BinariesNotFoundError(
            f"no {', '.join(missing)} for the real control plane (looked at: {'; '.join(looked)}). Either point "
            "--devplug-k8s-bin-dir (ini devplug_k8s_bin_dir) at a directory with them, set KUBEBUILDER_ASSETS "
            f"(setup-envtest use -p path {pins.kubernetes.lstrip('v')}), build them from Go modules into the cache "
            f"with `devplug control-plane build --kubernetes-version {pins.minor}`, or allow the release download "
            "(needs dl.k8s.io and github.com)"
        )
    return Binaries(paths, sources, pins.kubernetes, pins.etcd)


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT) as resp:  # noqa: S310 - https release URLs, or a test's server
        return bytes(resp.read())


def _sha256_field(text: str, name: str | None) -> str:
    """The digest from a ``.sha256`` file (a bare digest) or a ``SHA256SUMS`` list (``digest  name`` lines)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and (name is None or (len(parts) == 2 and parts[1].lstrip("*") == name)):
            return parts[0].lower()
    raise ControlPlaneError(f"no SHA-256 for {name or 'the file'} in the published checksum file")


def _checked(url: str, data: bytes, expected: str) -> bytes:
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise ControlPlaneError(f"{url}: SHA-256 {got} does not match the published {expected}; not using it")
    return data


def _install(dest: Path, name: str, data: bytes) -> Path:
    """Write atomically (temp file + rename), so a concurrent run never sees half a binary."""
    dest.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest / name


def _download(missing: list[str], dest: Path, pins: Release, *, k8s_url: str, etcd_url: str) -> dict[str, Path]:
    arch = _arch()
    out: dict[str, Path] = {}
    for c in missing:
        if c == "etcd":
            base = f"{etcd_url}/{pins.etcd}"
            tarball = f"etcd-{pins.etcd}-linux-{arch}.tar.gz"
            expected = _sha256_field(_fetch(f"{base}/SHA256SUMS").decode(), tarball)
            data = _checked(f"{base}/{tarball}", _fetch(f"{base}/{tarball}"), expected)
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                member = tar.extractfile(f"etcd-{pins.etcd}-linux-{arch}/etcd")
                if member is None:
                    raise ControlPlaneError(f"{base}/{tarball} has no etcd binary")
                out[c] = _install(dest, "etcd", member.read())
        else:
            url = f"{k8s_url}/{pins.kubernetes}/bin/linux/{arch}/{c}"
            expected = _sha256_field(_fetch(url + ".sha256").decode(), None)
            out[c] = _install(dest, c, _checked(url, _fetch(url), expected))
    return out


def build(env: Mapping[str, str] | None = None, *, version: str | None = None) -> Binaries:
    """``devplug control-plane build``: release ``version``'s control plane (default: the default release) built
    from Go modules into the cache (cached: instant), the build's progress on stderr."""
    pins = release(version)
    script = Path(__file__).with_name("gobuild.sh")
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
        raise BinariesNotFoundError("devplug control-plane build needs Go (go on PATH or /usr/local/go/bin/go)")
    run_env = {**os.environ, **(env or {}), "DEVPLUG_KUBERNETES_VERSION": pins.minor}
    rc = subprocess.run(["bash", str(script), "--control-plane"], env=run_env, check=False).returncode
    if rc != 0:
        raise ControlPlaneError(f"{script} failed with status {rc} (its log is above)")
    return resolve(version=pins.minor, env=env, download=False)
