"""One home for the exceptions: every exception class is defined in ``pytest_devplug.errors`` (the public ones are
``DevplugError``s), imported from there (or the package root) everywhere in the repository and re-exported by no
other module; "not found" is a type, never a message test."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

import pytest_devplug
from pytest_devplug import PodHandle, errors

SRC = Path(pytest_devplug.__file__).parent


def _public_exceptions() -> list[type[BaseException]]:
    objs = (getattr(pytest_devplug, n) for n in pytest_devplug.__all__)
    return [o for o in objs if isinstance(o, type) and issubclass(o, BaseException)]


@pytest.mark.parametrize("exc", _public_exceptions(), ids=lambda e: e.__name__)
def test_public_exception_is_a_devplug_error_from_the_errors_module(exc: type[BaseException]) -> None:
    assert issubclass(exc, errors.DevplugError)
    assert exc.__module__ == "pytest_devplug.errors"


#: Modules run by path with the standard library only (``python -I -S file``), so they cannot import ``errors``:
#: the mount-namespace launcher and the ``nvidia-smi`` stand-in. Their exceptions never leave their process.
STANDALONE = {"procs/launcher.py", "nvml/smi.py"}
REPO = SRC.parents[1]
#: Where code importing pytest-devplug lives in this repository (markdown: the code samples of the docs).
IMPORTERS = [REPO / d for d in ("src", "tests", "bench", "plugin_under_test", "tools", "docs")] + [REPO / "README.md"]
#: Warning categories are classes of a different kind (``warnings.warn``'s argument), not raised errors.
BUILTIN_EXCEPTIONS = {
    n
    for n, o in vars(builtins).items()
    if isinstance(o, type) and issubclass(o, BaseException) and not issubclass(o, Warning)
}
ERROR_NAMES = {n for n, o in vars(errors).items() if isinstance(o, type) and issubclass(o, BaseException)}


def _exception_classes(tree: ast.Module) -> list[str]:
    """Public classes of a module deriving from a builtin exception, an ``errors`` one or one defined before."""
    known = BUILTIN_EXCEPTIONS | ERROR_NAMES
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {
                b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases
            }
            if bases & (known | set(found)) and not node.name.startswith("_"):
                found.append(node.name)
    return found


def stray_exceptions(root: Path = SRC) -> dict[str, list[str]]:
    """Exception classes defined outside ``errors.py`` (the standalone scripts aside), by module."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel != "errors.py" and rel not in STANDALONE and (names := _exception_classes(ast.parse(path.read_text()))):
            found[rel] = names
    return found


def _module_of(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names; relative ones resolve only inside ``src``."""
    if node.level == 0 or SRC not in path.parents and path.parent != SRC:
        return node.module or "" if node.level == 0 else ""
    parts = ["pytest_devplug", *path.relative_to(SRC).with_suffix("").parts]
    base = parts[: len(parts) - node.level]
    return ".".join(base + ([node.module] if node.module else []))


def _import_trees(paths: list[Path]) -> list[tuple[Path, ast.Module]]:
    trees = []
    for top in paths:
        for path in [top] if top.is_file() else sorted(top.rglob("*.py")) + sorted(top.rglob("*.md")):
            if path.suffix == ".md":  # the code samples: their import lines, one statement each
                text = "\n".join(
                    line for line in path.read_text().splitlines() if line.startswith("from pytest_devplug")
                )
            elif ".venv" in path.parts or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            else:
                text = path.read_text()
            try:
                trees.append((path, ast.parse(text)))
            except SyntaxError:  # a markdown line continued on the next one: not a sample to check
                continue
    return trees


def exceptions_imported_elsewhere(paths: list[Path]) -> list[str]:
    """``path: from module import Name`` for every exception imported from a module other than ``errors`` or the
    root."""
    bad = []
    for path, tree in _import_trees(paths):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = _module_of(path, node)
                names = sorted(a.name for a in node.names if a.name in ERROR_NAMES)
                if module.startswith("pytest_devplug.") and module != "pytest_devplug.errors" and names:
                    where = path.relative_to(REPO) if REPO in path.parents else path.name
                    bad.append(f"{where}:{node.lineno}: from {module} import {', '.join(names)}")
    return bad


def exceptions_reexported(root: Path = SRC) -> dict[str, list[str]]:
    """Modules other than ``errors`` and the package root whose ``__all__`` lists an exception."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, (ast.Assign, ast.AugAssign)) or rel in ("errors.py", "__init__.py"):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                listed = [
                    e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and e.value in ERROR_NAMES
                ]
                if listed:
                    found.setdefault(rel, []).extend(listed)
    return found


def test_every_exception_class_is_defined_in_the_errors_module() -> None:
    assert len(ERROR_NAMES) > 30, "errors.py lost its exceptions?"
    assert stray_exceptions() == {}, "move these to pytest_devplug/errors.py (keep name and bases)"


def test_the_standalone_scripts_import_nothing_of_the_package() -> None:
    """Their exemption above holds only while they cannot import ``errors``."""
    for rel in STANDALONE:
        tree = ast.parse((SRC / rel).read_text())
        imports = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.level or "pytest_devplug" in (n.module or ""))
        ]
        assert imports == [], f"{rel} imports the package: define its exceptions in errors.py instead"


def test_exceptions_are_imported_from_the_errors_module_only() -> None:
    assert exceptions_imported_elsewhere(IMPORTERS) == []


def test_no_other_module_reexports_an_exception() -> None:
    assert exceptions_reexported() == {}


def test_the_checks_see_a_stray_exception_and_an_old_import_path(tmp_path: Path) -> None:
    """The three checks fail on what they are about: a class, an import and an ``__all__`` entry of another module."""
    pkg = tmp_path / "pytest_devplug"
    (pkg / "sim").mkdir(parents=True)
    (pkg / "waiting.py").write_text(
        "from .errors import WaitTimeout\n__all__ = ['WaitTimeout', 'wait_for']\n"
        "class Late(WaitTimeout):\n    pass\nclass Local(ValueError):\n    pass\n"
    )
    (pkg / "sim" / "user.py").write_text("from ..waiting import WaitTimeout, wait_for\n")
    assert stray_exceptions(pkg) == {"waiting.py": ["Late", "Local"]}
    assert exceptions_reexported(pkg) == {"waiting.py": ["WaitTimeout"]}
    sample = tmp_path / "guide.md"
    sample.write_text("```python\nfrom pytest_devplug.backends.base import BackendError\n```\n")
    assert exceptions_imported_elsewhere([sample]) == [
        "guide.md:1: from pytest_devplug.backends.base import BackendError"
    ]


def test_compatible_builtin_bases_are_kept() -> None:
    """Callers that caught the old bases keep working."""
    assert issubclass(errors.FaultNotSupportedError, NotImplementedError)
    assert issubclass(errors.MockControlsUnavailableError, RuntimeError)
    assert issubclass(errors.MockBuildError, RuntimeError)
    assert issubclass(errors.DevplugAssertionError, AssertionError)
    assert issubclass(errors.ContainerStatusMissingError, KeyError)


def test_a_container_without_status_yet_is_a_type_with_a_plain_message() -> None:
    class Backend:
        def get_pod(self, name: str, namespace: str) -> dict[str, object]:
            return {"metadata": {"name": name}, "status": {"phase": "Pending"}}

    pod = PodHandle(Backend(), "p", "ns", container="c", resource_name="nvidia.com/gpu", timeout=1.0)  # type: ignore[arg-type]
    with pytest.raises(errors.ContainerStatusMissingError) as info:
        pod.container_status()
    assert str(info.value) == "pod ns/p has no status for container 'c' yet"


def test_no_code_tells_not_found_by_its_message() -> None:
    pattern = re.compile(r"""["']not found["']\s+(not\s+)?in\b""", re.I)
    hits = [
        f"{p.relative_to(SRC)}:{n}"
        for p in SRC.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []
