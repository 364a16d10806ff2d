"""The root package's public names that were renamed or removed, so a project importing one learns what to write.

A conftest written against an earlier release should not fail with a bare "cannot import name": the package's
module ``__getattr__`` (in ``pytest_devplug/__init__.py``) asks :func:`successor` about every name it does not bind.

- A renamed name keeps working for one minor release: :data:`RENAMED` maps it to its successor and the release
  that drops it, and the old name gives the successor's object with a ``DeprecationWarning`` naming the successor.
- A removed name (or a renamed one past its release) is in :data:`REMOVED`: importing it raises an ``ImportError``
  naming it and saying what to write instead. ``ImportError`` rather than ``AttributeError``: for
  ``from pytest_devplug import X`` Python replaces an ``AttributeError`` by its own "cannot import name" message and
  this one would be lost; ``pytest_devplug.X`` raises the same ``ImportError``.

``CHANGELOG.md`` lists the same names; ``tests/pytest_plugin/test_public_names.py`` holds every public name of
0.1.0 to still importing or to one of these tables.
"""

from __future__ import annotations

import warnings

PACKAGE = "pytest_devplug"

#: Old name -> (its successor in the root package, the release that removes the old name). Empty while no rename
#: is in its deprecation period.
RENAMED: dict[str, tuple[str, str]] = {}

#: Removed name -> what to write instead (naming its successor).
REMOVED: dict[str, str] = {
    # An alias kept when the function got its resource-neutral name; removed with the other aliases.
    "assert_gpu_limit_rules": (
        "write assert_limit_rules instead, the same function under the name that says its rules hold for any "
        "extended resource (from pytest_devplug import assert_limit_rules)"
    ),
}


def successor(name: str) -> str:
    """The root package's name that ``name`` was renamed to, with a ``DeprecationWarning`` saying so.

    Raises ``ImportError`` for a removed name, naming it and its successor, and ``AttributeError`` for a name the
    package never had (so ``getattr(pytest_devplug, name, default)`` and ``hasattr`` work for those).
    """
    if name in RENAMED:
        new, removed_in = RENAMED[name]
        warnings.warn(
            f"{PACKAGE}.{name} is deprecated: it is renamed {new} (from {PACKAGE} import {new}); "
            f"the old name goes in {removed_in}",
            DeprecationWarning,
            stacklevel=3,  # the importing line: past this function and the package's __getattr__
        )
        return new
    if name in REMOVED:
        raise ImportError(f"{PACKAGE}.{name} was removed: {REMOVED[name]}", name=PACKAGE)
    raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}", name=name)
