"""``--devplug-report FILE``: a Markdown report of a run for people, and the same as JSON beside it for machines.

One row per check (passed / failed / skipped with the reason / error, and its duration), grouped into the
suite's core checks, its opt-in convention checks and its fault-injection checks, under a header that says
what was tested where: the plugin's command (or image), its resource, the backend and the Kubernetes version
(in a DRA run, one the DRA plugin marks as such: the driver's command and name, under a title that says so).
A plugin that exited by itself and was restarted by the kubelet (its DaemonSet's pod would be), or that
crash-loops, is counted per check and in the header: a check may pass over a restart it never noticed.
It sits beside pytest's own reports (``--junitxml`` and the terminal) and changes neither.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest

from .backends.base import Backend, PluginSpec
from .backends.dra import DriverSpec
from .errors import DevplugError

__all__ = [
    "GROUPS",
    "NOTE_PREFIX",
    "SCHEMA",
    "CheckResult",
    "ReportWriter",
    "RunInfo",
    "check_group",
    "is_dra_run",
    "json_path_for",
    "mark_dra_run",
    "note_check",
    "note_driver",
    "note_plugin",
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
#: Set when the run judges a DRA driver rather than a device plugin (decided once, at configure time).
_DRA_RUN_KEY = pytest.StashKey[bool]()
SCHEMA = "pytest-devplug/report/v1"
#: A check's ``user_properties`` under this prefix are notes in its row (:func:`note_check`).
NOTE_PREFIX = "devplug_"


def check_group(item: pytest.Item) -> str:
    """``conventions`` (an opt-in convention check), ``faults`` (it injects faults) or ``core``."""
    names = {m.name for m in item.iter_markers()} | set(getattr(item, "fixturenames", ()))
    for group, _, markers in GROUPS:
        if names & markers:
            return group
    return "core"


def note_check(node: pytest.Item, what: str, text: str) -> None:
    """Note how the running check did something (``what``: ``reboot`` -> ``staged: ...``): the report shows it beside
    its verdict and junit carries it as a property. Not ``record_property``, which warns under junit's xunit2."""
    node.user_properties.append((NOTE_PREFIX + what, text))


def mark_dra_run(config: pytest.Config) -> None:
    """This run judges a DRA driver: the pytest header and the report describe the driver, not a device plugin."""
    config.stash[_DRA_RUN_KEY] = True


def is_dra_run(config: pytest.Config) -> bool:
    return config.stash.get(_DRA_RUN_KEY, False)


def json_path_for(path: Path) -> Path:
    """Where the JSON report goes: beside the Markdown one, same name, ``.json``."""
    return path.with_suffix(".json")


@dataclass
class CheckResult:
    """One check's verdict: ``passed``, ``failed``, ``skipped``, ``error`` (set-up or tear-down), ``xfailed``,
    ``xpassed``."""

    id: str
    name: str
    group: str
    outcome: str = "passed"
    duration_s: float = 0.0
    reason: str = ""
    #: Restarts of the plugin by the kubelet seen during the check (looked at after each of its phases; a plugin
    #: the check itself started again counts from 0, as its ``restartCount`` does).
    plugin_restarts: int = 0
    #: How the plugin crash-looped (``CrashLoopBackOff``) when looked at during the check; empty: it did not.
    plugin_crash_loop: str = ""
    #: What the check noted about how it ran (:func:`note_check`), e.g. a staged reboot.
    notes: list[str] = field(default_factory=list)


@dataclass
class RunInfo:
    """What was tested where, noted by the fixtures when they deploy (a conftest's own plugin spec included)."""

    backend: str = ""
    plugin: str = ""
    resource: str = ""
    mock: bool | None = None
    kubernetes: str = ""
    #: The DRA driver's command and the name it registers under, once deployed.
    driver: str = ""
    driver_name: str = ""


def _describe_plugin(spec: PluginSpec, backend: str) -> str:
    if backend == "sim" or not (spec.image or spec.manifest):
        return shlex.join(spec.argv)
    parts = [f"image {spec.image}" if spec.image else "", f"manifest {spec.manifest}" if spec.manifest else ""]
    return ", ".join(p for p in parts if p)


def note_run(config: pytest.Config, backend: str, spec: PluginSpec, kubernetes: str) -> None:
    """Record the run's plugin and cluster for the report (no-op without ``--devplug-report``)."""
    writer = config.stash.get(_KEY, None)
    if writer is not None:
        writer.info = replace(
            writer.info,
            backend=backend,
            plugin=_describe_plugin(spec, backend),
            resource=spec.resource_name,
            mock=spec.mock,
            kubernetes=kubernetes,
        )


def note_driver(config: pytest.Config, backend: str, spec: DriverSpec, kubernetes: str) -> None:
    """Record the run's DRA driver and cluster for the report (no-op without ``--devplug-report``)."""
    writer = config.stash.get(_KEY, None)
    if writer is not None:
        writer.info = replace(
            writer.info,
            backend=backend,
            driver=shlex.join(spec.argv),
            driver_name=spec.driver_name,
            mock=spec.mock,
            kubernetes=kubernetes,
        )


def note_plugin(config: pytest.Config, nodeid: str, backend: Backend, node: str) -> None:
    """Look at the restarts of the plugin on ``node`` for check ``nodeid`` (no-op without ``--devplug-report``)."""
    writer = config.stash.get(_KEY, None)
    if writer is None:
        return
    try:
        restarts = backend.plugin_restarts(node)
    except DevplugError:
        return  # the cluster is going away: no look this time, the report says what was seen
    writer.plugin_seen(nodeid, node, restarts.count, restarts.crash_loop)


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
        #: node -> the plugin's restart count at the last look, so that each restart is counted once.
        self._restarts_seen: dict[str, int] = {}

    @staticmethod
    def install(config: pytest.Config, path: str) -> None:
        target = Path(path)
        if target.suffix == ".json":
            raise pytest.UsageError(
                f"--devplug-report {path}: give the Markdown file (e.g. report.md); the JSON goes beside it"
            )
        writer = ReportWriter(config, target)
        config.stash[_KEY] = writer
        config.pluginmanager.register(writer, "devplug-report")

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        module = getattr(item, "module", None)
        where = module.__name__.rsplit(".", 1)[-1].removeprefix("test_") if module is not None else item.path.stem
        self.collected[item.nodeid] = (f"{where}: {item.name}", check_group(item))

    def _check(self, nodeid: str) -> CheckResult:
        check = self.checks.get(nodeid)
        if check is None:
            name, group = self.collected.get(nodeid, (nodeid, "core"))
            check = self.checks[nodeid] = CheckResult(nodeid, name, group)
        return check

    def plugin_seen(self, nodeid: str, node: str, restarts: int, crash_loop: str | None) -> None:
        """The plugin on ``node`` had been restarted ``restarts`` times when check ``nodeid`` looked; a count
        lower than at the last look belongs to a plugin started again since (a new pod: it counts from 0)."""
        last = self._restarts_seen.get(node, 0)
        self._restarts_seen[node] = restarts
        check = self._check(nodeid)
        check.plugin_restarts += restarts - last if restarts >= last else restarts
        if crash_loop and not check.plugin_crash_loop:
            check.plugin_crash_loop = _one_line(crash_loop)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        check = self._check(report.nodeid)
        check.duration_s += report.duration
        for key, value in report.user_properties:
            note = f"{key.removeprefix(NOTE_PREFIX)}: {value}"
            if key.startswith(NOTE_PREFIX) and note not in check.notes:
                check.notes.append(note)
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
        looping = [c.plugin_crash_loop for c in checks if c.plugin_crash_loop]
        plugin = {
            "plugin_restarts": sum(c.plugin_restarts for c in checks),
            "plugin_crash_loop": looping[0] if looping else "",
        }
        return {
            "schema": SCHEMA,
            "pytest_devplug": ours,
            "pytest": pytest.__version__,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "duration_s": round(time.time() - self.started, 3),
            "exit_status": int(exitstatus),
            "interrupted": int(exitstatus) == int(pytest.ExitCode.INTERRUPTED),
            # subject: what the run judged, ``device-plugin`` or ``dra-driver`` (a DRA run: :func:`mark_dra_run`)
            "run": {
                **asdict(self.info),
                "subject": "dra-driver" if is_dra_run(self.config) else "device-plugin",
                **plugin,
            },
            "summary": counts,
            "checks": [dict(asdict(c), duration_s=round(c.duration_s, 3)) for c in ordered],
        }


_VERDICT = {
    "passed": "passed",
    "failed": "**FAILED**",
    "error": "**ERROR**",
    "skipped": "skipped",
    "xfailed": "xfailed",
    "xpassed": "**XPASSED**",
}


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


def _plugin_cell(check: dict[str, Any]) -> str:
    restarts = check.get("plugin_restarts", 0)
    parts = ["**crash-looping**"] if check.get("plugin_crash_loop") else []
    parts += [f"{restarts} restart{'' if restarts == 1 else 's'}"] if restarts else []
    return ", ".join(parts)


def _plugin_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Header rows on a plugin that exited by itself (absent from reports of earlier versions: no rows)."""
    run = data["run"]
    restarts = run.get("plugin_restarts", 0)
    looping = sum(1 for c in data["checks"] if c.get("plugin_crash_loop"))
    rows = []
    if restarts:
        rows.append(
            (
                "plugin restarts",
                f"{restarts} by the kubelet: the plugin exited by itself and was started "
                "again, as its DaemonSet's pod would be (per check: column *plugin*)",
            )
        )
    if looping:
        rows.append(
            (
                "crash loop",
                f"**the plugin crash-looped** (seen in {looping} check{'' if looping == 1 else 's'}): "
                f"{run.get('plugin_crash_loop', '')}",
            )
        )
    return rows


def _subject_rows(data: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """The title and the rows on what was judged: the device plugin, or in a DRA run the driver (each subject's rows
    also when it was deployed beside the other)."""
    run = data["run"]
    dra = run.get("subject") == "dra-driver"
    plugin = [
        ("plugin", f"`{run['plugin']}`" if run["plugin"] else "(no plugin was deployed in this run)"),
        *_plugin_rows(data),
        ("resource", f"`{run['resource']}`" if run["resource"] else ""),
    ]
    driver = [
        ("DRA driver", f"`{run['driver']}`" if run.get("driver") else "(no DRA driver was deployed in this run)"),
        ("driver name", f"`{run['driver_name']}`" if run.get("driver_name") else ""),
    ]
    if dra:
        return "DRA driver conformance report", driver + (plugin if run["plugin"] else [])
    return "Device plugin conformance report", plugin + (driver if run.get("driver") else [])


def render_markdown(data: dict[str, Any]) -> str:
    """The report as Markdown (``data`` as written to the JSON file)."""
    run = data["run"]
    mock = {True: "yes (mock-NVML state file)", False: "no", None: ""}[run["mock"]]
    title, subject = _subject_rows(data)
    header = [
        *subject,
        ("mock controls", mock),
        ("backend", _BACKENDS.get(run["backend"], run["backend"])),
        ("Kubernetes", run["kubernetes"]),
        ("pytest-devplug / pytest", f"{data['pytest_devplug']} / {data['pytest']}"),
        ("started (UTC)", data["started"].replace("T", " ").rstrip("Z")),
        (
            "result",
            f"{_summary(data['summary'])} in {data['duration_s']:.1f} s"
            + (" (interrupted)" if data["interrupted"] else ""),
        ),
    ]
    lines = [f"# {title}", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in header if v]
    titles = {g: title for g, title, _ in GROUPS}
    with_plugin = any(_plugin_cell(c) for c in data["checks"])
    for group in _ORDER:
        checks = [c for c in data["checks"] if c["group"] == group]
        if not checks:
            continue
        counts: dict[str, int] = {}
        for c in checks:
            counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
        columns = (
            "| check | verdict | duration | plugin | reason |"
            if with_plugin
            else "| check | verdict | duration | reason |"
        )
        lines += [
            "",
            f"## {titles[group]} — {_summary(counts)}",
            "",
            columns,
            "|---|---|--:|---|---|" if with_plugin else "|---|---|--:|---|",
        ]
        for c in checks:
            verdict = _VERDICT.get(c["outcome"], c["outcome"])
            plugin = f" {_plugin_cell(c)} |" if with_plugin else ""
            reason = "; ".join([c["reason"], *c.get("notes", [])] if c["reason"] else c.get("notes", []))
            lines.append(f"| `{_cell(c['name'])}` | {verdict} | {c['duration_s']:.2f} s |{plugin} {_cell(reason)} |")
    return "\n".join(lines) + "\n"
