"""``--devplug-report FILE``: a Markdown report of a run for people, and the same as JSON beside it for machines.

One row per check (passed / failed / skipped with the reason / error, and its duration), grouped into the
suite's core checks, its opt-in convention checks and its fault-injection checks, under a header that says
what was tested where: the plugin's command (or image), its resource, the backend and the Kubernetes version.
It sits beside pytest's own reports (``--junitxml`` and the terminal) and changes neither.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest

from .backends.base import PluginSpec

__all__ = [
    "GROUPS",
    "SCHEMA",
    "CheckResult",
    "ReportWriter",
    "RunInfo",
    "check_group",
    "json_path_for",
    "note_run",
    "render_markdown",
]

#: Report groups, in order, and the markers or fixtures that put a check in one (the first that matches wins).
GROUPS: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("conventions", "Conventions (opt-in)", frozenset({"devplug_convention"})),
    ("faults", "Fault injection", frozenset({"devplug_faults", "devplug_dra_faults", "devplug_mock"})),
    ("core", "Core: what the kubelet requires", frozenset()),
)
_ORDER = ("core", "conventions", "faults")
_KEY = pytest.StashKey["ReportWriter"]()
SCHEMA = "pytest-devplug/report/v1"


def check_group(item: pytest.Item) -> str:
    """``conventions`` (an opt-in convention check), ``faults`` (it injects faults) or ``core``."""
    names = {m.name for m in item.iter_markers()} | set(getattr(item, "fixturenames", ()))
    for group, _, markers in GROUPS:
        if names & markers:
            return group
    return "core"


def json_path_for(path: Path) -> Path:
    """Where the JSON report goes: beside the Markdown one, same name, ``.json``."""
    return path.with_suffix(".json")


@dataclass
class CheckResult:
    """One check's verdict: ``passed``, ``failed``, ``skipped``, ``error`` (set-up or tear-down), ``xfailed``, ``xpassed``."""

    id: str
    name: str
    group: str
    outcome: str = "passed"
    duration_s: float = 0.0
    reason: str = ""


@dataclass
class RunInfo:
    """What was tested where, noted by the fixtures when they deploy (a conftest's own plugin spec included)."""

    backend: str = ""
    plugin: str = ""
    resource: str = ""
    mock: bool | None = None
    kubernetes: str = ""


def _describe_plugin(spec: PluginSpec, backend: str) -> str:
    if backend == "sim" or not (spec.image or spec.manifest):
        return shlex.join(spec.argv)
    parts = [f"image {spec.image}" if spec.image else "", f"manifest {spec.manifest}" if spec.manifest else ""]
    return ", ".join(p for p in parts if p)


def note_run(config: pytest.Config, backend: str, spec: PluginSpec, kubernetes: str) -> None:
    """Record the run's plugin and cluster for the report (no-op without ``--devplug-report``)."""
    writer = config.stash.get(_KEY, None)
    if writer is not None:
        writer.info = RunInfo(backend, _describe_plugin(spec, backend), spec.resource_name, spec.mock, kubernetes)


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _reason(report: pytest.TestReport) -> str:
    """The skip reason or the failure's message, on one line (without the test's name: the row has it)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, lineno, "Skipped: why"), perhaps "Skipped: test_x: why"
        name = report.nodeid.rsplit("::", 1)[-1]
        return _one_line(str(longrepr[2]).removeprefix("Skipped: ").removeprefix(f"{name}: "))
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return _one_line(str(crash.message))
    return _one_line(str(longrepr or "")).strip()


class ReportWriter:
    """The pytest plugin that collects verdicts and writes the report at the end of the session."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config = config
        self.path = path
        self.info = RunInfo()
        self.collected: dict[str, tuple[str, str]] = {}  # node id -> (name, group)
        self.checks: dict[str, CheckResult] = {}  # only checks that ran, in the order they ran
        self.started = time.time()

    @staticmethod
    def install(config: pytest.Config, path: str) -> None:
        target = Path(path)
        if target.suffix == ".json":
            raise pytest.UsageError(f"--devplug-report {path}: give the Markdown file (e.g. report.md); the JSON goes beside it")
        writer = ReportWriter(config, target)
        config.stash[_KEY] = writer
        config.pluginmanager.register(writer, "devplug-report")

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        module = getattr(item, "module", None)
        where = module.__name__.rsplit(".", 1)[-1].removeprefix("test_") if module is not None else item.path.stem
        self.collected[item.nodeid] = (f"{where}: {item.name}", check_group(item))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        check = self.checks.get(report.nodeid)
        if check is None:
            name, group = self.collected.get(report.nodeid, (report.nodeid, "core"))
            check = self.checks[report.nodeid] = CheckResult(report.nodeid, name, group)
        check.duration_s += report.duration
        if hasattr(report, "wasxfail"):
            check.outcome = "xfailed" if report.skipped else "xpassed"
            check.reason = _one_line(str(report.wasxfail))
        elif report.failed:
            if check.outcome in ("passed", "skipped"):
                check.outcome = "failed" if report.when == "call" else "error"
                where = "" if report.when == "call" else f"in {report.when}: "
                check.reason = where + _reason(report)
        elif report.skipped:
            check.outcome = "skipped"
            check.reason = _reason(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        data = self._as_dict(list(self.checks.values()), exitstatus)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(render_markdown(data), encoding="utf-8")
        json_path_for(self.path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_line(f"devplug report: {self.path} (JSON: {json_path_for(self.path)})")

    def _as_dict(self, checks: list[CheckResult], exitstatus: int) -> dict[str, Any]:
        try:
            ours = version("pytest-devplug")
        except PackageNotFoundError:
            ours = "unknown"
        counts: dict[str, int] = {}
        for c in checks:
            counts[c.outcome] = counts.get(c.outcome, 0) + 1
        ordered = sorted(checks, key=lambda c: _ORDER.index(c.group) if c.group in _ORDER else len(_ORDER))
        return {
            "schema": SCHEMA,
            "pytest_devplug": ours,
            "pytest": pytest.__version__,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "duration_s": round(time.time() - self.started, 3),
            "exit_status": int(exitstatus),
            "interrupted": int(exitstatus) == int(pytest.ExitCode.INTERRUPTED),
            "run": asdict(self.info),
            "summary": counts,
            "checks": [dict(asdict(c), duration_s=round(c.duration_s, 3)) for c in ordered],
        }


_VERDICT = {"passed": "passed", "failed": "**FAILED**", "error": "**ERROR**", "skipped": "skipped",
            "xfailed": "xfailed", "xpassed": "**XPASSED**"}  # fmt: skip


_BACKENDS = {
    "sim": "sim (embedded kubelet)",
    "kind": "kind (a real cluster)",
    "cluster": "cluster (the kubeconfig's cluster)",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _summary(counts: dict[str, int]) -> str:
    order = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k)) or "no checks ran"


def render_markdown(data: dict[str, Any]) -> str:
    """The report as Markdown (``data`` as written to the JSON file)."""
    run = data["run"]
    mock = {True: "yes (mock-NVML state file)", False: "no", None: ""}[run["mock"]]
    header = [
        ("plugin", f"`{run['plugin']}`" if run["plugin"] else "(no plugin was deployed in this run)"),
        ("resource", f"`{run['resource']}`" if run["resource"] else ""),
        ("mock controls", mock),
        ("backend", _BACKENDS.get(run["backend"], run["backend"])),
        ("Kubernetes", run["kubernetes"]),
        ("pytest-devplug / pytest", f"{data['pytest_devplug']} / {data['pytest']}"),
        ("started (UTC)", data["started"].replace("T", " ").rstrip("Z")),
        ("result", f"{_summary(data['summary'])} in {data['duration_s']:.1f} s"
         + (" (interrupted)" if data["interrupted"] else "")),
    ]  # fmt: skip
    lines = ["# Device plugin conformance report", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in header if v]
    titles = {g: title for g, title, _ in GROUPS}
    for group in _ORDER:
        checks = [c for c in data["checks"] if c["group"] == group]
        if not checks:
            continue
        counts: dict[str, int] = {}
        for c in checks:
            counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
        lines += ["", f"## {titles[group]} — {_summary(counts)}", "", "| check | verdict | duration | reason |", "|---|---|--:|---|"]
        for c in checks:
            verdict = _VERDICT.get(c["outcome"], c["outcome"])
            lines.append(f"| `{_cell(c['name'])}` | {verdict} | {c['duration_s']:.2f} s | {_cell(c['reason'])} |")
    return "\n".join(lines) + "\n"

