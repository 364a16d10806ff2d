"""One home for the public surface: ``pytest_devplug.__all__`` and ``pytest_devplug.dra.__all__`` are each the
whole of what their package binds (a name imported there and left out of ``__all__``, or listed and not imported,
is a mistake), every name in them imports, and every one is in the docs reference.

The reference pages render modules with mkdocstrings (``::: module`` blocks). A name counts as documented when its
defining module is rendered there with it as a member (the block's ``members:``, else the module's ``__all__``)
and it has a docstring the page can show, or when the page's text names it in a code span (`` `DriverSpec` ``).
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import pytest_devplug
import pytest_devplug.dra

ROOT = Path(__file__).resolve().parents[2]
#: The reference pages the public names belong in.
REFERENCE = [ROOT / "docs" / "reference" / "fixtures.md", ROOT / "docs" / "reference" / "helpers.md"]
PACKAGES = [pytest_devplug, pytest_devplug.dra]

#: ``::: module`` and the indented options under it.
BLOCK = re.compile(r"^::: *([\w.]+)[ \t]*\n((?:[ \t]+.*\n?|[ \t]*\n)*)", re.M)
#: A ``members:`` list entry in a block's options.
MEMBER = re.compile(r"^\s*-\s*([\w]+)\s*$")


def rendered(page: str) -> dict[str, set[str] | None]:
    """Each module a page renders, with its ``members:`` list, or ``None`` when the block lists none (all shown)."""
    blocks: dict[str, set[str] | None] = {}
    for match in BLOCK.finditer(page):
        module, options = match.group(1), textwrap.dedent(match.group(2))
        members: set[str] | None = None
        if re.search(r"^\s*members:\s*$", options, re.M):
            listed = options.split("members:", 1)[1]
            members = {m.group(1) for line in listed.splitlines() if (m := MEMBER.match(line))}
        blocks[module] = members
    return blocks


def _has_docstring(obj: object) -> bool:
    """Whether the source gives ``obj`` a docstring (a dataclass's generated ``__doc__`` is not one the site shows)."""
    try:
        source = textwrap.dedent(inspect.getsource(obj))  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    node = ast.parse(source).body[0]
    return isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and bool(ast.get_docstring(node))


def _shown_by_block(name: str, obj: object, blocks: dict[str, set[str] | None], modules: dict[str, ModuleType]) -> bool:
    home = getattr(obj, "__module__", None)
    if home not in blocks or home not in modules:
        return False
    members = blocks[home]
    listed = members if members is not None else set(getattr(modules[home], "__all__", ()))
    return name in listed and _has_docstring(obj)


def _named(name: str, page: str) -> bool:
    """The page's text names ``name`` in a code span: `` `Name` ``, `` `Name(...)` ``, `` `pkg.Name` ``."""
    prose = BLOCK.sub("", page)
    return re.search(rf"`(?:[\w.]+\.)?{re.escape(name)}\b", prose) is not None


def undocumented(package: ModuleType, pages: list[str], modules: dict[str, ModuleType]) -> list[str]:
    """The names of ``package.__all__`` that no page renders as a member or names."""
    blocks: dict[str, set[str] | None] = {}
    for page in pages:
        blocks.update(rendered(page))
    return [
        name
        for name in package.__all__
        if not _shown_by_block(name, getattr(package, name), blocks, modules)
        and not any(_named(name, page) for page in pages)
    ]


def _public_bindings(package: ModuleType) -> set[str]:
    """What the package binds for its users: no private names, no submodules (the import system binds those)."""
    return {n for n, v in vars(package).items() if not n.startswith("_") and not isinstance(v, ModuleType)}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_is_exactly_what_the_package_binds(package: ModuleType) -> None:
    names = list(package.__all__)
    assert len(names) == len(set(names)), (
        f"listed twice in {package.__name__}.__all__: {sorted({n for n in names if names.count(n) > 1})}"
    )
    bound = _public_bindings(package)
    assert not bound - set(names), (
        f"{package.__name__} imports {sorted(bound - set(names))} but leaves them out of __all__"
    )
    assert not set(names) - bound, (
        f"{package.__name__}.__all__ lists {sorted(set(names) - bound)}, which it does not bind"
    )


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_public_name_imports(package: ModuleType) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {package.__name__} import *", namespace)  # the star import a user would write
    missing = [n for n in package.__all__ if n not in namespace]
    assert not missing, f"`from {package.__name__} import *` does not bind {missing}"


def _modules() -> dict[str, ModuleType]:
    """The loaded modules of the package, by name: where a rendered block's members are looked up."""
    return {name: mod for name, mod in sys.modules.items() if name.startswith("pytest_devplug") and mod is not None}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_public_name_is_in_the_docs_reference(package: ModuleType) -> None:
    pages = [p.read_text(encoding="utf-8") for p in REFERENCE]
    missing = undocumented(package, pages, _modules())
    assert not missing, (
        f"{package.__name__}.__all__ names {missing}, which neither docs/reference/fixtures.md nor helpers.md "
        "renders (a `::: module` block with it as a member) or names in a code span"
    )


# The checker itself: each way of being documented counts, and a name in neither way is reported.
PAGE_RENDERS_HANDLES = "# H\n\n::: pytest_devplug.dra.handles\n"
PAGE_LISTS_MEMBERS = "::: pytest_devplug.dra.handles\n    options:\n      members:\n        - ClaimFactory\n\nAfter.\n"


def test_checker_counts_a_rendered_member_and_a_named_one_and_reports_the_rest() -> None:
    modules = _modules()
    dra = pytest_devplug.dra
    missing = set(undocumented(dra, [PAGE_RENDERS_HANDLES], modules))
    assert "DriverHandle" not in missing and "ClaimFactory" not in missing  # rendered: in dra.handles.__all__
    assert {"DriverSpec", "assert_claim_prepared", "SliceView"} <= missing
    missing = set(
        undocumented(dra, [PAGE_LISTS_MEMBERS, "the `DriverSpec(...)` and `pytest_devplug.dra.SliceView`"], modules)
    )
    assert "ClaimFactory" not in missing and "DriverSpec" not in missing and "SliceView" not in missing
    assert "DriverHandle" in missing, "a block's members: list limits what it renders"
    # A name only inside a ::: block's options is not prose; one outside a code span is not a mention.
    assert "DRANodeHandle" in undocumented(
        dra, ["::: x.y\n    options:\n      `DRANodeHandle`\nDRANodeHandle\n"], modules
    )
