"""The docs agree with ``pytest --help``, ``pytest --fixtures`` and the report: every option and fixture the plugin
has is documented, and no page names one that does not exist. README.md, also the PyPI page, stays a front page
whose relative links all reach a file; every ``docs/`` path the code names exists.

The site itself (links and anchors between pages) is checked by its strict build, ``nox -s docs``; these checks
need neither mkdocs nor the network.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from pytest_devplug.report import render_markdown

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
#: An option's name; not a wildcard naming a family (``--devplug-driver-*``).
OPTION = re.compile(r"--devplug-[a-z][a-z-]*[a-z](?![\w-]*\*)")
#: A Markdown link's target: ``[label](target)``.
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: A docs path named in code or comments: ``docs/guides/backends.md``.
DOCS_PATH = re.compile(r"\bdocs/[\w./-]*\w\.(?:md|yml)\b")


def _hooks() -> ModuleType:
    """docs/hooks.py, the mkdocs hooks that fill the generated parts of pages."""
    spec = importlib.util.spec_from_file_location("_devplug_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page(name: str) -> str:
    """A page as the site shows it: its markers filled as the build fills them."""
    text: str = _hooks().fill((DOCS / name).read_text())
    return text


def _every_page() -> dict[str, str]:
    pages = {str(p.relative_to(DOCS)): _page(str(p.relative_to(DOCS))) for p in sorted(DOCS.rglob("*.md"))}
    pages["plugin_under_test/README.md"] = (ROOT / "plugin_under_test" / "README.md").read_text()  # a page too
    return pages


def test_options_in_help_and_docs_are_the_same(pytester: pytest.Pytester) -> None:
    help_text = pytester.runpytest("--help").stdout.str()
    title = re.search(r"^(device-plugin end-to-end tests[^:\n]*):$", help_text, re.M)
    assert title is not None
    raw = (DOCS / "reference" / "options.md").read_text()
    assert _hooks().OPTIONS_MARKER in raw, "reference/options.md lost the marker the generated table goes in"
    reference = _page("reference/options.md")
    assert f'"{title.group(1)}"' in reference, "the options reference must name the option group as --help shows it"
    in_help = set(OPTION.findall(help_text))
    assert in_help - set(OPTION.findall(reference)) == set(), "options missing from the options reference"
    named = {(page, o) for page, text in _every_page().items() for o in OPTION.findall(text)}
    named |= {("README.md", o) for o in OPTION.findall(README.read_text())}
    assert {(page, o) for page, o in named if o not in in_help} == set(), "docs naming options that do not exist"
    for kind_option in ("--cluster-name", "--keep-cluster", "--kind-bin", "--kind-image", "--kubeconfig"):
        assert kind_option in help_text and kind_option in reference


def test_fixtures_are_documented(pytester: pytest.Pytester) -> None:
    fixtures = set(re.findall(r"^(devplug_\w+)\b", pytester.runpytest("--fixtures").stdout.str(), re.M))
    assert {"devplug_cluster", "devplug_node", "devplug_plugin", "devplug_pod"} <= fixtures
    page = (DOCS / "reference" / "fixtures.md").read_text()
    public = fixtures - {"devplug_settings"}
    assert {f for f in public if f"`{f}`" not in page} == set(), "fixtures the reference does not describe"
    rendered = set(re.findall(r"^ +- (devplug_\w+)$", page, re.M))  # the mkdocstrings blocks' member lists
    assert rendered == public, f"docstrings not rendered: {public - rendered}; not fixtures: {rendered - public}"


def test_report_example_has_the_rows_the_report_writes() -> None:
    guide = (DOCS / "guides" / "device-plugins.md").read_text()
    example = [line.removeprefix("> ") for line in guide.splitlines() if line.startswith("> |")]
    labels = {line.split("|")[1].strip() for line in example if line.count("|") == 3} - {""}
    data = {
        "run": {"plugin": "p", "resource": "r", "mock": False, "backend": "sim", "kubernetes": "k"},
        "pytest_devplug": "0",
        "pytest": "0",
        "started": "2026-12-01T00:00:00Z",
        "duration_s": 1.0,
        "interrupted": False,
        "summary": {"passed": 1},
        "checks": [],
    }
    written = {line.split("|")[1].strip() for line in render_markdown(data).splitlines() if line.count("|") == 3} - {""}
    assert labels and labels <= written, labels - written
    header = next(line for line in example if line.startswith("| check |"))
    assert header in render_markdown(
        dict(data, checks=[{"name": "a: t", "group": "core", "outcome": "passed", "duration_s": 0.0, "reason": ""}])
    )


def test_readme_is_a_front_page_whose_links_reach_files() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: the manual belongs in docs/"
    long_rows = [row[:80] for row in lines if row.startswith("|") and len(row) > 300]
    assert long_rows == [], "README table rows over 300 characters (PyPI renders them unreadable)"
    assert "python3 -m nox -s conformance" in text and "python3 -m nox -s tests" in text
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in targets), "README links into no docs page"
    broken = [t for t in targets if t.startswith("#") or not (ROOT / t.partition("#")[0]).is_file()]
    assert broken == [], "README links reaching no file (the PyPI page has no anchors to other sections)"


def test_home_page_is_the_readme_with_site_links() -> None:
    home = _page("index.md")
    assert home.startswith("<!--") and "# pytest-devplug" in home and "](docs/" not in home
    for target in LINK.findall(home):
        if not re.match(r"[a-z]+:|#", target):
            assert (DOCS / target.partition("#")[0]).is_file() or target == _hooks().PLUGIN_PAGE, target


def test_docs_paths_named_in_the_code_exist() -> None:
    sources = [ROOT / "noxfile.py", ROOT / ".ci" / "run", DOCS / "github-actions.yml"]
    for top in ("src", "tests", "plugin_under_test/src", "peers"):
        sources += [p for p in (ROOT / top).rglob("*") if p.suffix in {".py", ".c", ".sh", ".yaml", ".yml", ".go"}]
    named = {(str(p.relative_to(ROOT)), m) for p in sources if p.is_file() for m in DOCS_PATH.findall(p.read_text())}
    assert named, "no docs path found: the pattern is wrong"
    assert {(where, path) for where, path in named if not (ROOT / path).is_file()} == set()
