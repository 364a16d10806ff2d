"""mkdocs hooks: the pages made from sources that live elsewhere, so the site never holds a copy that can drift.

- ``index.md`` is the repository's README.md (also the PyPI page), its ``docs/`` links made site-relative;
- ``reference/options.md`` gets the options table ``pytest_devplug.options.options_markdown()`` renders from the
  declarative option table, in place of its marker;
- ``guides/included-plugin-reference.md`` is ``plugin_under_test/README.md``, the included plugin's own manual.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README_MARKER = "<!-- devplug:readme -->"
OPTIONS_MARKER = "<!-- devplug:options -->"
PLUGIN_README = ROOT / "plugin_under_test" / "README.md"
PLUGIN_PAGE = "guides/included-plugin-reference.md"
#: A Markdown link to a path under docs/: ``](docs/guides/x.md#y)``.
_DOCS_LINK = re.compile(r"\]\(docs/")


def readme_markdown() -> str:
    """README.md with its links into ``docs/`` relative to the site's root, where ``index.md`` is, and its link to
    the included plugin's README pointing at that README's page."""
    text = _DOCS_LINK.sub("](", (ROOT / "README.md").read_text())
    return text.replace("](plugin_under_test/README.md)", f"]({PLUGIN_PAGE})")


def options_markdown() -> str:
    """The options reference table, rendered from ``pytest_devplug.options``
    (imported late: only this page needs it)."""
    from pytest_devplug.options import options_markdown as render

    return render()


def fill(markdown: str) -> str:
    """``markdown`` with each marker replaced by what it stands for; a page without markers unchanged."""
    if README_MARKER in markdown:
        markdown = markdown.replace(README_MARKER, readme_markdown())
    if OPTIONS_MARKER in markdown:
        markdown = markdown.replace(OPTIONS_MARKER, options_markdown())
    return markdown


# mkdocs's own types are Any here: mkdocs is the docs session's dependency, not the test suite's (tests import fill).


def on_files(files: Any, config: Any) -> Any:
    """Add the included plugin's README as a page of the site."""
    from mkdocs.structure.files import File  # type: ignore[import-not-found,unused-ignore]

    files.append(File.generated(config, PLUGIN_PAGE, abs_src_path=str(PLUGIN_README)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return fill(markdown)
