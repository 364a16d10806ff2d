"""Built once per session for the distribution tests: sdist and wheel of both distributions, and uv."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
from .dist_helpers import ROOT, Dists, build


@pytest.fixture(scope="session")
def uv() -> str:
    """uv, and the build tools; without them the tests skip saying so, except under CI (``nox -s tests`` has them)."""
    missing = [m for m in ("build", "twine") if importlib.util.find_spec(m) is None]
    exe = shutil.which("uv")
    if exe is None:
        missing.append("uv")
    if missing:
        why = (
            f"the distribution tests need {', '.join(missing)} "
            f"(pip install {' '.join(missing)}; nox -s tests installs them)"
        )
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    assert exe is not None
    return exe


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory, uv: str) -> Dists:
    """``python -m build`` of both distributions (sdist and wheel), as a release would make them."""
    out = tmp_path_factory.mktemp("dist")
    wheel, sdist = build(uv, ROOT, out)
    plugin_wheel, plugin_sdist = build(uv, ROOT / "plugin_under_test", out)
    return Dists(out, wheel, sdist, plugin_wheel, plugin_sdist)
