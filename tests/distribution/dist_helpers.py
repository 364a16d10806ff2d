"""Helpers of the distribution tests: run a command, find the oldest supported Python, the built dists."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOWEST_PYTHON = "3.10"  # requires-python's floor


def run(argv: list[str], *, cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """Run ``argv``; on a non-zero exit fail with its output."""
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    assert proc.returncode == 0, (
        f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc.stdout + proc.stderr


def lowest_python() -> str:
    """The oldest supported interpreter on this machine (PATH or pyenv; never a download), else this one."""
    exe = shutil.which(f"python{LOWEST_PYTHON}")
    if exe and subprocess.run([exe, "-c", ""], capture_output=True, check=False).returncode == 0:
        return exe
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    builds = sorted(root.glob(f"versions/{LOWEST_PYTHON}.*/bin/python{LOWEST_PYTHON}"))
    return str(builds[-1]) if builds else sys.executable


@dataclass(frozen=True)
class Dists:
    dir: Path
    wheel: Path
    sdist: Path
    plugin_wheel: Path
    plugin_sdist: Path


def build(uv: str, project: Path, dist: Path) -> tuple[Path, Path]:
    """``python -m build`` (uv as installer) of ``project`` into ``dist``: its wheel and sdist."""
    env = dict(os.environ, PATH=f"{Path(uv).parent}{os.pathsep}{os.environ['PATH']}")
    run([sys.executable, "-m", "build", "--installer", "uv", "--outdir", str(dist), str(project)], env=env)
    name = project.joinpath("pyproject.toml").read_text().split('name = "', 1)[1].split('"', 1)[0].replace("-", "_")
    (wheel,) = dist.glob(f"{name}-*.whl")
    (sdist,) = dist.glob(f"{name}-*.tar.gz")
    return wheel, sdist
