"""docs/explanation/upstream-scenarios.md stays true: every check it names exists, and every row has a file, an
It() text and either a check or a reason why none covers it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "explanation" / "upstream-scenarios.md"
CONFORMANCE = ROOT / "src" / "pytest_devplug" / "conformance"
UPSTREAM_FILES = {
    "device_plugin_test.go",
    "device_plugin_failures_test.go",
    "device_plugin_failures_pod_status_test.go",
    "device_plugin_allocation_test.go",
    "device_plugin_multiple_test.go",
    "device_manager_test.go",
    "podresources_test.go",
    "topology_manager_test.go",
}


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def _rows() -> list[list[str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].endswith(".go"):
            rows.append(cells)
    return rows


def test_every_named_check_exists() -> None:
    suite = set().union(*(_tests_in(p) for p in CONFORMANCE.glob("test_*.py")))
    missing = []
    for cells in _rows():
        for name in re.findall(r"`([^`]+)`", cells[2]):
            path, _, test = name.rpartition("::")
            found = test in _tests_in(ROOT / path) if path else name in suite
            if not found:
                missing.append(f"{cells[1]!r} -> {name}")
    assert not missing, f"checks named in {TABLE.relative_to(ROOT)} that do not exist:\n" + "\n".join(missing)


def test_every_row_is_complete() -> None:
    rows = _rows()
    assert len(rows) >= 25, f"only {len(rows)} scenario rows"
    for file, text, check, backends, notes in rows:
        assert file in UPSTREAM_FILES, file
        assert text, f"{file}: a row without its It() text"
        if check == "none":
            assert notes, f"{text!r}: no check and no reason why"
        else:
            assert re.search(r"`test_\w+`|::test_\w+`", check), f"{text!r}: check column {check!r} names no test"
            assert backends and backends != "—", f"{text!r}: no backends"
    texts = [r[1] for r in rows]
    assert len(texts) == len(set(texts)), "a scenario is listed twice"
    assert {r[0] for r in rows} == UPSTREAM_FILES, (
        f"files without a row: {sorted(UPSTREAM_FILES - {r[0] for r in rows})}"
    )


DRA_TABLE = ROOT / "docs" / "explanation" / "upstream-dra-scenarios.md"
DRA_SUITE = ROOT / "src" / "pytest_devplug" / "dra" / "conformance"
#: The ``Context`` blocks of test/e2e_node/dra_test.go.
DRA_CONTEXTS = {
    "Resource Kubelet Plugin",
    "Two resource Kubelet Plugins",
    "ResourceSlice",
    "Resource Health",
    "Device ShareID",
}


def _dra_rows() -> list[list[str]]:
    rows = []
    for line in DRA_TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in DRA_CONTEXTS:
            rows.append(cells)
    return rows


def test_every_check_named_in_the_dra_table_exists() -> None:
    suite = set().union(*(_tests_in(p) for p in DRA_SUITE.glob("test_*.py")))
    text = DRA_TABLE.read_text()
    missing = []
    for name in re.findall(r"`((?:tests/[\w/]+\.py::)?test_\w+)`", text):
        path, _, test = name.rpartition("::")
        if not (test in _tests_in(ROOT / path) if path else name in suite):
            missing.append(name)
    assert not missing, f"checks named in {DRA_TABLE.relative_to(ROOT)} that do not exist:\n" + "\n".join(missing)


def test_every_dra_row_is_complete() -> None:
    rows = _dra_rows()
    assert len(rows) >= 30, f"only {len(rows)} DRA scenario rows"
    for context, text, check, notes in rows:
        assert text, f"{context}: a row without its It() text"
        if check == "none":
            assert notes, f"{text!r}: no check and no reason why"
        else:
            assert re.search(r"`test_\w+`|::test_\w+`", check), f"{text!r}: check column {check!r} names no test"
    texts = [r[1] for r in rows]
    assert len(texts) == len(set(texts)), "a scenario is listed twice"
