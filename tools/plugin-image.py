"""Build the included GPU plugin's image (cached by its inputs) and print its tag: what `nox -s e2e` loads into
its kind cluster for the cluster backend, as a user pushes a release image to a registry.

Usage: python tools/plugin-image.py WORKDIR   (the build context goes under WORKDIR and is removed after)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from pytest_devplug.backends.kind.deploy import PluginImage


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(f"usage: plugin-image.py WORKDIR (an existing directory); got {argv}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="devplug-img-", dir=argv[0]) as work:
        print(PluginImage(Path(work)).included())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
