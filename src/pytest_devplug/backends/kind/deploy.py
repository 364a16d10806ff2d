"""The plugin under test's image on kind (built here for the included plugin); its DaemonSet is :mod:`..k8s.manifests`.

The included plugin's image (its device plugin and, with the ``dra`` extra installed, its DRA driver) is built
from ``plugin_under_test/`` on the standard ``python:3.12-slim``,
or on the local Python base where the offline scripts made one (no registry); it is tagged by a hash of
its inputs, so a second session does not rebuild it. A user's plugin comes as ``--devplug-plugin-image``
(present locally or pullable) and ``--devplug-plugin-manifest`` (a DaemonSet).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from ..base import PluginSpec
from ...errors import BackendError, BackendUnavailableError
from ..k8s.manifests import PLUGIN_SRC
from .lifecycle import image_prefix, python_base_image
from .proc import run

__all__ = ["PluginImage"]

STANDARD_BASE = "python:3.12-slim"


def _inputs_hash(base: str) -> str:
    assert PLUGIN_SRC is not None
    h = hashlib.sha256(base.encode())
    for path in sorted([PLUGIN_SRC / "Dockerfile", PLUGIN_SRC / "pyproject.toml", *(PLUGIN_SRC / "src").rglob("*.py")]):
        h.update(str(path.relative_to(PLUGIN_SRC)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _pip() -> list[str]:
    """A pip to make the wheels with: this interpreter's, else the system Python's (a uv-made venv has none)."""
    for python in (sys.executable, getattr(sys, "_base_executable", None), shutil.which("python3"), "/usr/bin/python3"):
        if python and run([python, "-m", "pip", "--version"], check=False, timeout=120).returncode == 0:
            return [python, "-m", "pip"]
    raise BackendUnavailableError(
        f"no pip to build the included plugin's wheels with (tried {sys.executable} and python3)"
    )


def _image_present(image: str) -> bool:
    return run(["docker", "image", "inspect", image], check=False, timeout=60).returncode == 0


class PluginImage:
    """Resolves (and builds, for the included plugin) the image to load into the cluster."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.built: str | None = None

    def resolve(self, spec: PluginSpec) -> str:
        if spec.image:
            if not _image_present(spec.image):
                pulled = run(["docker", "pull", spec.image], check=False, timeout=600)
                if pulled.returncode != 0:
                    raise BackendError(
                        f"plugin image {spec.image} is neither local nor pullable: {pulled.stderr[-1500:]}"
                    )
            return spec.image
        return self.included()

    def included(self) -> str:
        """The included GPU plugin's image, built once per inputs (Dockerfile, sources, base)."""
        if self.built:
            return self.built
        if PLUGIN_SRC is None:
            raise BackendUnavailableError(
                "the included GPU plugin's image is built from a pytest-devplug checkout (plugin_under_test/); "
                "pass --devplug-plugin-image and --devplug-plugin-manifest for your own plugin"
            )
        base = python_base_image() or STANDARD_BASE
        tag = f"{image_prefix()}/gpu-plugin:{_inputs_hash(base)}"
        if not _image_present(tag):
            ctx = self.workdir / "plugin-image"
            shutil.rmtree(ctx, ignore_errors=True)
            (ctx / "dist").mkdir(parents=True)
            shutil.copy(PLUGIN_SRC / "Dockerfile", ctx / "Dockerfile")
            # The local base (no registry) cannot reach PyPI from inside `docker build`: bake every wheel in
            # (the base's Python is Debian's, the same minor as the offline tooling's). The standard base
            # installs the dependencies from PyPI itself.
            deps = [] if base != STANDARD_BASE else ["--no-deps"]
            run([*_pip(), "wheel", *deps, "-q", "-w", str(ctx / "dist"), f"{PLUGIN_SRC}[dra]"], timeout=900)
            offline = ["--build-arg", "PIP_NO_INDEX=1"] if base != STANDARD_BASE else []
            run(
                ["docker", "build", "-q", "--build-arg", f"BASE_IMAGE={base}", *offline, "-t", tag, str(ctx)],
                timeout=1800,
            )
            shutil.rmtree(ctx, ignore_errors=True)
        self.built = tag
        return tag
