"""Every reference the docs make to the code names something that exists, so none can go stale unnoticed.

- **Docstrings.** Each Sphinx role (``:class:``, ``:func:``, ``:meth:``, ``:mod:``, ``:data:``, ``:attr:``,
  ``:exc:``) in a docstring or comment (``#:`` documents an attribute) of ``pytest_devplug`` or the included plugin
  resolves as Sphinx reads it: a dotted path from its package; ``.x.y`` / ``..x`` relative to the module's package,
  as a relative import is (a single dot also finds a name of the module itself, Sphinx's search); a bare name in
  the enclosing classes (their bases too), then the module's own namespace (its definitions and imports), then
  builtins. Our modules are read from their AST, not imported (the optional extras need not be installed); another
  project's path (``pytest.UsageError``, ``subprocess.Popen``) is looked up by importing it, and skipped only where
  that project is not installed. A package docstring's module list (``- ``nodeops``: ...``) names its modules.
- **Docs pages** (``docs/**/*.md``, README.md, the included plugin's README, a page too). A path whose first part
  is one of our top-level folders (``tests/sim/test_kubelet.py``, ``peers/build.sh``), ``pytest_devplug/`` or one of
  its subpackages (``sim/daemon.py``, ``backends/k8s/nodeops.py``) must exist, and a test it names
  (``path.py::test_x``) too; a bare ``x.py`` is ours only in a section that names one of our folders, and must be
  in one of them or above. Other projects' paths (``pkg/kubelet/cm/dra/manager.go``) start elsewhere, and code
  blocks (commands, a user's own ``# tests/test_conformance.py``, outputs) are not read for paths. A dotted
  ``pytest_devplug.x.y`` resolves anywhere on a page, code blocks included. A layout block (a bare fence whose
  lines are ``path   what it is``, indented as a tree) is read as one: each entry exists, and a file its
  description names exists beside or above it.
- **design.md's layout** lists every module of both packages: by name, or by a folder entry that describes its
  folder as a whole.
"""

from __future__ import annotations

import ast
import copy
import importlib
import io
import re
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Our packages by name: their folders.
PACKAGES = {
    "pytest_devplug": ROOT / "src" / "pytest_devplug",
    "devplug_gpu_plugin": ROOT / "plugin_under_test" / "src" / "devplug_gpu_plugin",
}
#: The repository's top-level folders a docs path may start with.
TOP_DIRS = ("src", "plugin_under_test", "tests", "tools", "peers", "kind-config", "bench", "docs", "proto", ".ci")
#: A cross-reference role and its content: ``:class:`~.base.Backend```.
ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj|const):`([^`]*)`")
#: A path with a folder in it, and the test it may name: ``tests/sim/x.py::test_y``. Not the tail of a longer
#: path (``/var/lib/...``, ``$DIR/peers/``, ``../shared``).
SLASH_PATH = re.compile(r"(?<![\w./$~:@<>{}-])(\.?[\w-]+(?:/[\w.*<>-]+)+/?)(?:::([\w:]+))?")
#: A module's file name alone: ``kubelet.py`` (not a suffix: ``_pb2.py``).
BARE_FILE = re.compile(r"(?<![\w./$~:@<>{}*-])([A-Za-z][\w-]*\.py)\b(?![/\w-])")
#: A dotted name in one of our packages: ``pytest_devplug.options.options_markdown``.
DOTTED = re.compile(r"(?<![\w./-])((?:pytest_devplug|devplug_gpu_plugin)(?:\.\w+)+)")
#: A package docstring's entry for some of its modules: ``- ``dra``, ``dralog``: the DRA side``.
MODULE_ENTRY = re.compile(r"^[ \t]*- ((?:``\w+``(?:, )?)+):", re.M)
#: A Markdown heading (outside code blocks).
HEADING = re.compile(r"^#{1,6} ")
#: A fence: ``` or ```lang.
FENCE = re.compile(r"^ *```(\S*)")
#: An entry of a layout block: its indentation, its paths, its description (after two spaces, or one after a
#: folder too long for the column).
LAYOUT_ENTRY = re.compile(r"^( *)(\S+(?:, \S+)*)(?:(?: {2,}|(?<=/) )(.*))?$")


# --- docstring cross-references ---------------------------------------------------------------------------------

#: What a name is bound to: a class or function definition, an import (the dotted path it names) or a value (None).
Binding = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | str | None


@dataclass
class Namespace:
    """The names a module or class body binds, and the modules it star-imports."""

    names: dict[str, Binding] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)


@dataclass
class Module:
    """One of our modules, read but not imported."""

    name: str
    path: Path
    is_package: bool

    @cached_property
    def source(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @cached_property
    def lines(self) -> list[str]:
        return self.source.splitlines(keepends=True)

    @cached_property
    def tree(self) -> ast.Module:
        return ast.parse(self.source, filename=str(self.path))

    @property
    def package(self) -> str:
        """What its relative imports and references start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]

    @cached_property
    def namespace(self) -> Namespace:
        return _bindings(self.tree.body, self.package)


def _absolute(module: str | None, level: int, package: str) -> str:
    """The module ``from <level dots><module> import ...`` names, in ``package``."""
    if level == 0:
        return module or ""
    base = package.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _bindings(body: Sequence[ast.AST], package: str) -> Namespace:
    """The names a body binds: its definitions, assignments and imports, under ``if``/``try``/``with`` too."""
    space = Namespace()
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            space.names[node.name] = node
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.partition(".")[0]
                space.names[alias.asname or top] = alias.name if alias.asname else top  # `import a.b` binds a
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            for alias in node.names:
                if alias.name == "*":
                    space.stars.append(base)
                else:
                    space.names[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        space.names.setdefault(name.id, None)
        # What an if/try/with/for block (or an except clause) binds is bound in the scope around it.
        nested = [s for block in ("body", "orelse", "finalbody", "handlers") for s in getattr(node, block, [])]
        if nested:
            inner = _bindings(nested, package)
            space.names.update({k: v for k, v in inner.names.items() if v is not None or k not in space.names})
            space.stars += inner.stars
    return space


def _dotted(node: ast.expr) -> str | None:
    """``a.b.C`` for a name or attribute expression (a base class), its subscripted type's for ``G[T]``."""
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _external(dotted: str) -> bool | None:
    """Another project's dotted path looked up by importing it; None where its top-level package is not installed."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            if cut == 1:
                return None
            continue
        for part in parts[cut:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return None


class Index:
    """Our modules, and the resolution of a reference against them (False: it names nothing; None: skipped)."""

    def __init__(self, packages: dict[str, Path] = PACKAGES) -> None:
        self.modules: dict[str, Module] = {}
        for package, folder in packages.items():
            for path in sorted(folder.rglob("*.py")):
                parts = [package, *path.relative_to(folder).with_suffix("").parts]
                is_package = parts[-1] == "__init__"
                if is_package:
                    parts.pop()
                self.modules[".".join(parts)] = Module(".".join(parts), path, is_package)
        self._members: dict[ast.ClassDef, Namespace] = {}

    def ours(self, name: str) -> bool:
        return name.partition(".")[0] in PACKAGES

    def resolve(self, dotted: str, seen: frozenset[str] = frozenset()) -> bool | None:
        """An absolute dotted path: a module, or a name in one (through its imports), or a member of a class."""
        if dotted in seen:
            return False  # an import cycle: the name is defined nowhere
        if not self.ours(dotted):
            return _external(dotted)
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            module = self.modules.get(".".join(parts[:cut]))
            if module is not None:
                return self._in_module(module, parts[cut:], seen | {dotted})
        return False

    def _in_module(self, module: Module, rest: list[str], seen: frozenset[str]) -> bool | None:
        if not rest:
            return True
        space = module.namespace
        if rest[0] in space.names:
            return self._follow(module, space.names[rest[0]], rest[1:], seen)
        if f"{module.name}.{rest[0]}" in self.modules:
            return self._in_module(self.modules[f"{module.name}.{rest[0]}"], rest[1:], seen)
        for star in space.stars:
            if self.resolve(".".join([star, *rest]), seen):
                return True
        return False

    def _follow(self, module: Module, binding: Binding, rest: list[str], seen: frozenset[str]) -> bool | None:
        if isinstance(binding, str):
            return self.resolve(".".join([binding, *rest]), seen)
        if isinstance(binding, ast.ClassDef):
            return self.in_class(module, binding, rest, seen)
        if binding is None:
            return True  # a value: what is inside it is not known from the source
        return not rest  # a function has no members to name

    def class_members(self, module: Module, cls: ast.ClassDef) -> Namespace:
        """A class body's names, and the ``self.x`` attributes its methods assign."""
        if cls not in self._members:
            space = _bindings(cls.body, module.package)
            for method in cls.body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.args.args:
                    me = method.args.args[0].arg
                    for node in ast.walk(method):
                        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                                for attr in ast.walk(target):
                                    if (
                                        isinstance(attr, ast.Attribute)
                                        and isinstance(attr.value, ast.Name)
                                        and attr.value.id == me
                                    ):
                                        space.names.setdefault(attr.attr, None)
            self._members[cls] = space
        return self._members[cls]

    def in_class(self, module: Module, cls: ast.ClassDef, rest: list[str], seen: frozenset[str]) -> bool | None:
        """A member of a class, its bases' included."""
        if not rest:
            return True
        space = self.class_members(module, cls)
        if rest[0] in space.names:
            return self._follow(module, space.names[rest[0]], rest[1:], seen)
        for base in cls.bases:
            name = _dotted(base)
            if name and self.in_scope(module, [], [*name.split("."), *rest], seen):
                return True
        return False

    def in_scope(self, module: Module, classes: list[ast.ClassDef], parts: list[str], seen: frozenset[str]) -> bool:
        """A name as code in ``module`` (inside ``classes``) sees it: the classes', the module's, a builtin."""
        if any(self.in_class(module, cls, parts, seen) for cls in reversed(classes)):
            return True
        if parts[0] in module.namespace.names or f"{module.name}.{parts[0]}" in self.modules:
            return bool(self._in_module(module, parts, seen))
        if any(self.resolve(".".join([star, *parts]), seen) for star in module.namespace.stars):
            return True
        return _external(".".join(["builtins", *parts])) is True

    def reference(self, module: Module, classes: list[ast.ClassDef], target: str) -> bool | None:
        """A role's target, as written in a docstring of ``module`` inside ``classes``."""
        target = target.removeprefix("~").removesuffix("()")
        if target.startswith("."):
            level = len(target) - len(target.lstrip("."))
            base = module.package.split(".")
            if level - 1 >= len(base):
                return False
            absolute = ".".join([*base[: len(base) - (level - 1)], target[level:]])
            if self.resolve(absolute):
                return True
            return level == 1 and self.in_scope(module, classes, target[1:].split("."), frozenset())
        parts = target.split(".")
        if self.in_scope(module, classes, parts, frozenset()):
            return True
        if len(parts) == 1 or parts[0] in module.namespace.names or not parts[0].islower():
            return False  # a bare name is in scope or nowhere, a bound one resolves through its binding, and a
            # capitalised one (``PluginSpec.command``) is a class, never another project's package
        return self.resolve(target)


@dataclass(frozen=True)
class Role:
    """One cross-reference in a docstring."""

    where: str  # path:line
    role: str
    target: str
    module: Module
    classes: tuple[ast.ClassDef, ...]


def _shown(path: Path) -> Path:
    """A path as a report names it: from the repository's root."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _role_target(content: str) -> str | None:
    """The target of a role's content: ``title <target>`` or the content; None for ``!x`` (no link)."""
    content = content.strip()
    titled = re.fullmatch(r"[^<]*<([^>]+)>", content, re.S)
    if titled:
        content = titled.group(1).strip()
    return None if content.startswith("!") else content


def roles_in(module: Module) -> Iterator[Role]:
    """Every role in ``module``'s docstrings (a module's, class's, function's or attribute's) and comments (``#:``
    documents an attribute, for Sphinx too)."""
    where = _shown(module.path)

    def visit(node: ast.AST, classes: tuple[ast.ClassDef, ...]) -> Iterator[Role]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
                if isinstance(child.value.value, str) and "`" in child.value.value:
                    raw = "".join(module.lines[child.value.lineno - 1 : child.value.end_lineno])  # as written
                    for match in ROLE.finditer(raw):
                        target = _role_target(match.group(2))
                        if target is not None:
                            line = child.value.lineno + raw[: match.start()].count("\n")
                            yield Role(f"{where}:{line}", match.group(1), target, module, classes)
            yield from visit(child, (*classes, child) if isinstance(child, ast.ClassDef) else classes)

    yield from visit(module.tree, ())
    classes = sorted((n for n in ast.walk(module.tree) if isinstance(n, ast.ClassDef)), key=lambda n: n.lineno)
    comments = tokenize.generate_tokens(io.StringIO(module.source).readline) if "#" in module.source else iter(())
    for token in comments:
        if token.type == tokenize.COMMENT:
            line = token.start[0]
            inside = tuple(c for c in classes if c.lineno <= line <= (c.end_lineno or c.lineno))
            for match in ROLE.finditer(token.string):
                target = _role_target(match.group(2))
                if target is not None:
                    yield Role(f"{where}:{line}", match.group(1), target, module, inside)


def unresolved_roles(index: Index) -> tuple[list[str], int]:
    """The roles that name nothing (``path:line: :role:`target```), and the submodules a package's docstring lists
    that do not exist; how many were checked."""
    bad: list[str] = []
    checked = 0
    for module in index.modules.values():
        docstring = ast.get_docstring(module.tree, clean=False) or ""
        for entry in MODULE_ENTRY.finditer(docstring if module.is_package else ""):
            for name in re.findall(r"``(\w+)``", entry.group(1)):
                checked += 1
                if f"{module.name}.{name}" not in index.modules:
                    line = module.source[: module.source.index(entry.group(0))].count("\n") + 1
                    bad.append(f"{_shown(module.path)}:{line}: module ``{name}``")
        for role in roles_in(module):
            checked += 1
            if re.search(r"\s", role.target) or index.reference(module, list(role.classes), role.target) is False:
                bad.append(f"{role.where}: :{role.role}:`{role.target}`")
    return bad, checked


# --- paths and names in the docs ---------------------------------------------------------------------------------


@dataclass
class Block:
    """A stretch of a page: prose (its section's), a code block or a layout block; ``line`` is its first line."""

    kind: str  # "prose" | "code" | "layout"
    line: int
    lines: list[str]
    section: int


def blocks(text: str) -> list[Block]:
    """A page split into prose, code blocks and layout blocks, each numbered with its section."""
    found: list[Block] = []
    section = 0
    current = Block("prose", 1, [], 0)
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if fence is None and opening:
            found.append(current)
            fence = opening.group(1)
            current = Block("code", number + 1, [], section)
        elif fence is not None and opening and not opening.group(1):
            if fence == "" and current.lines and _is_layout(current.lines):
                current.kind = "layout"
            found.append(current)
            fence = None
            current = Block("prose", number + 1, [], section)
        elif fence is None and HEADING.match(line):
            found.append(current)
            section += 1
            current = Block("prose", number, [line], section)
        else:
            current.lines.append(line)
    found.append(current)
    return [b for b in found if b.lines]


def _is_layout(lines: list[str]) -> bool:
    """A bare code block listing paths: its first line is ``path/   what it is``."""
    first = LAYOUT_ENTRY.match(lines[0])
    return bool(first and first.group(3) and "/" in first.group(2))


def _our_path(token: str) -> Path | None:
    """Where a path named in prose is, when it is ours (its first part one of our folders), else None."""
    head = token.split("/")[0]
    if head in TOP_DIRS:
        return ROOT / token
    if head in PACKAGES:
        return PACKAGES[head].parent / token
    if (PACKAGES["pytest_devplug"] / head / "__init__.py").is_file():
        return PACKAGES["pytest_devplug"] / token
    return None


def _exists(path: Path) -> bool:
    """A file or folder, or a glob's match (``kind-config/*.yaml``)."""
    if "*" in path.name or "*" in str(path.parent):
        return any(ROOT.glob(str(path.relative_to(ROOT))))
    return path.exists()


def _names_test(path: Path, node_id: str) -> bool:
    """``path`` defines the test a node ID names (``test_x``, ``TestX::test_y``)."""
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    for name in node_id.split("::"):
        found = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name]
        if not found:
            return False
        scope = found[0].body
    return True


def _ancestors(folder: Path) -> Iterator[Path]:
    """``folder`` and each folder above it, up to the repository's root."""
    while folder.is_relative_to(ROOT):
        yield folder
        if folder == ROOT:
            return
        folder = folder.parent


def _prose_problems(page: str, text: str, index: Index) -> tuple[list[str], int]:
    """Paths, tests and dotted names of a page that name nothing, and how many were checked."""
    bad: list[str] = []
    checked = 0
    sections: dict[int, set[Path]] = {}  # section -> our folders it names (where its bare file names are)
    bare: list[tuple[int, int, str]] = []
    for block in blocks(text):
        for offset, line in enumerate(block.lines):
            where = f"{page}:{block.line + offset}"
            for name in DOTTED.findall(line):
                checked += 1
                if index.resolve(name) is False:
                    bad.append(f"{where}: {name}")
            if block.kind != "prose":
                continue
            for match in SLASH_PATH.finditer(line):
                token, node_id = match.group(1).rstrip("."), match.group(2)
                path = _our_path(token)
                if path is None or "<" in token:
                    continue
                checked += 1
                if not _exists(path):
                    bad.append(f"{where}: {token}")
                    continue
                if node_id and path.is_file():
                    checked += 1
                    if not _names_test(path, node_id):
                        bad.append(f"{where}: {token}::{node_id}")
                if "*" not in token:
                    sections.setdefault(block.section, set()).add(path if path.is_dir() else path.parent)
            bare += [(block.section, block.line + offset, m) for m in BARE_FILE.findall(line)]
    for section, line_number, name in bare:
        folders = sections.get(section)
        if not folders:
            continue  # no folder of ours in this section: a name of the reader's (their conftest.py)
        checked += 1
        if not any((above / name).is_file() for folder in folders for above in _ancestors(folder)):
            bad.append(f"{page}:{line_number}: {name} (in none of {sorted(str(f.relative_to(ROOT)) for f in folders)})")
    return bad, checked


@dataclass
class Entry:
    """One path of a layout block: where it is, its description, and the entries under it."""

    path: Path
    line: int
    description: str
    children: list[Entry] = field(default_factory=list)


def layout_entries(block: Block) -> list[Entry]:
    """A layout block read as a tree: an entry is under the last folder entry indented less than it; a line
    indented as far as the descriptions continues the previous entry's."""
    first = LAYOUT_ENTRY.match(block.lines[0])
    assert first is not None
    description_column = len(block.lines[0]) - len(first.group(3) or "")
    entries: list[Entry] = []
    stack: list[tuple[int, Entry | None, Path]] = [(-1, None, ROOT)]  # (indent, folder entry, its path)
    for offset, line in enumerate(block.lines):
        match = LAYOUT_ENTRY.match(line)
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if match is None or indent >= description_column - 4:
            if entries:
                entries[-1].description += " " + line.strip()
            continue
        while stack[-1][0] >= indent:
            stack.pop()
        parent, folder = stack[-1][1], stack[-1][2]
        for name in match.group(2).split(", "):
            entry = Entry(folder / name.rstrip("/"), block.line + offset, match.group(3) or "")
            entries.append(entry)
            if parent is not None:
                parent.children.append(entry)
            if name.endswith("/"):
                stack.append((indent, entry, entry.path))
    return entries


def _layout_problems(page: str, block: Block) -> tuple[list[str], int]:
    """Entries of a layout block, and files their descriptions name, that do not exist; how many were checked."""
    bad: list[str] = []
    checked = 0
    for entry in layout_entries(block):
        checked += 1
        if not _exists(entry.path):
            bad.append(f"{page}:{entry.line}: {entry.path.relative_to(ROOT)}")
            continue
        here = entry.path if entry.path.is_dir() else entry.path.parent
        named = [m.group(1).rstrip(".") for m in SLASH_PATH.finditer(entry.description)]
        named = [n for n in named if any((above / n.split("/")[0]).exists() for above in _ancestors(here))]
        for name in named + BARE_FILE.findall(entry.description):
            checked += 1
            if not any(_exists(above / name) for above in _ancestors(here)):
                bad.append(f"{page}:{entry.line}: {name} (named for {entry.path.relative_to(ROOT)})")
    return bad, checked


def docs_pages() -> dict[str, str]:
    """The pages: docs/**/*.md, README.md and the included plugin's README, by path."""
    pages = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md", ROOT / "plugin_under_test" / "README.md"]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in pages}


def docs_problems(pages: dict[str, str], index: Index) -> tuple[list[str], int]:
    """Every path, test, dotted name and layout entry of the pages that names nothing, and how many were checked."""
    bad: list[str] = []
    checked = 0
    for page, text in pages.items():
        found, count = _prose_problems(page, text, index)
        bad += found
        checked += count
        for block in blocks(text):
            if block.kind == "layout":
                found, count = _layout_problems(page, block)
                bad += found
                checked += count
    return bad, checked


def unlisted_modules(block: Block) -> list[str]:
    """Modules of our packages a layout leaves out. A folder entry with no entries under it covers its folder, or,
    when its description names files, those files; ``__init__.py`` needs no entry."""
    listed: set[Path] = set()
    for entry in layout_entries(block):
        if entry.path.is_dir() and not entry.children:
            named = BARE_FILE.findall(entry.description)
            if named:
                listed |= {entry.path / n for n in named}
            else:
                listed |= set(entry.path.rglob("*.py"))
        listed |= set(ROOT.glob(str(entry.path.relative_to(ROOT)))) if "*" in entry.path.name else {entry.path}
    modules = {p for folder in PACKAGES.values() for p in folder.rglob("*.py") if p.name != "__init__.py"}
    return sorted(str(p.relative_to(ROOT)) for p in modules - listed)


# --- the tests ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def index() -> Index:
    return Index()


def test_docstring_references_resolve(index: Index) -> None:
    bad, checked = unresolved_roles(index)
    assert checked > 300, f"only {checked} roles found: the pattern is wrong"
    assert bad == [], "docstring references naming nothing (point them at what exists now):\n" + "\n".join(bad)


def test_paths_and_names_in_the_docs_exist(index: Index) -> None:
    bad, checked = docs_problems(docs_pages(), index)
    assert checked > 300, f"only {checked} references found: the patterns are wrong"
    assert bad == [], "docs naming files, tests or modules that do not exist:\n" + "\n".join(bad)


def test_design_layout_lists_every_module() -> None:
    text = (DOCS / "explanation" / "design.md").read_text(encoding="utf-8")
    layouts = [b for b in blocks(text) if b.kind == "layout"]
    assert len(layouts) == 1, "design.md has one layout block"
    assert unlisted_modules(layouts[0]) == [], "modules design.md's layout does not list"


# --- the checkers catch what they are for --------------------------------------------------------------------------

_FAKE_PACKAGE = '''\
"""A package of pytest_devplug.backends.k8s.

- ``present``: :class:`~.present.Thing`.
- ``gone``, ``present``: stale.
"""
'''

_FAKE_MODULE = '''\
"""See :class:`~..backend.KubeBackend` and :class:`~..node.Gone`."""

from ..nodeops import NodeTransport


class Thing(NodeTransport):
    """Uses :meth:`run`, :meth:`missing`, :class:`NodeTransport`, :func:`~pytest_devplug.waiting.wait_for`,
    :exc:`ValueError`, :class:`pytest.UsageError`, :class:`pytest.NoSuchThing` and :attr:`value`."""

    #: Set by :meth:`__init__`, unlike :attr:`other`.
    value: int

    def __init__(self) -> None:
        self.value = 1

    def run(self) -> None:
        """:meth:`close`, :attr:`nothing`, :mod:`...kind.lifecycle`, :mod:`...kind.cluster`, :meth:`Gone.x`."""
'''


def test_the_docstring_check_names_stale_references(tmp_path: Path, index: Index) -> None:
    (tmp_path / "__init__.py").write_text(_FAKE_PACKAGE)
    (tmp_path / "present.py").write_text(_FAKE_MODULE)
    index = copy.copy(index)
    index.modules = dict(index.modules)
    for module in (
        Module("pytest_devplug.backends.k8s.fake", tmp_path / "__init__.py", is_package=True),
        Module("pytest_devplug.backends.k8s.fake.present", tmp_path / "present.py", is_package=False),
    ):
        index.modules[module.name] = module
    bad = [b.removeprefix(f"{tmp_path}/") for b in unresolved_roles(index)[0] if b.startswith(str(tmp_path))]
    assert bad == [
        "__init__.py:4: module ``gone``",
        "present.py:1: :class:`~..node.Gone`",
        "present.py:7: :meth:`missing`",
        "present.py:8: :class:`pytest.NoSuchThing`",
        "present.py:17: :attr:`nothing`",
        "present.py:17: :mod:`...kind.cluster`",
        "present.py:17: :meth:`Gone.x`",
        "present.py:10: :attr:`other`",
    ]
    assert _external("devplug_no_such_project.Thing") is None  # another project's, not installed: skipped


def test_the_docs_check_names_stale_paths(index: Index) -> None:
    page = """\
# A page

The kubelet (`sim/kubelet.py`, `backends/k8s/node.py`), upstream's `pkg/kubelet/cm/dra/manager.go`, a file of
`tests/sim/test_kubelet.py::test_no_such_test`, `pytest_devplug.sim.kubelet.SimNode` and `pytest_devplug.sim.model`.

## DRA

In `sim/dra/`: `manager.py`, `kubelet.py` and `api.py`.

## Yours

Your `conftest.py`:

```python
# tests/test_mine.py
from pytest_devplug.conformance.suitex import *
```

```
src/pytest_devplug/      the package
  sim/                   the kubelet
    errors.py            gone
    kubelet.py           see admission.py, nope.py and dra/gone.py
```
"""
    bad, _ = docs_problems({"page.md": page}, index)
    assert {b.split(" (")[0] for b in bad} == {
        "page.md:3: backends/k8s/node.py",
        "page.md:4: pytest_devplug.sim.model",
        "page.md:4: tests/sim/test_kubelet.py::test_no_such_test",
        "page.md:8: api.py",
        "page.md:16: pytest_devplug.conformance.suitex",
        "page.md:22: src/pytest_devplug/sim/errors.py",
        "page.md:23: nope.py",
        "page.md:23: dra/gone.py",
    }
    layout = next(b for b in blocks(page) if b.kind == "layout")
    assert "src/pytest_devplug/sim/daemon.py" in unlisted_modules(layout)
