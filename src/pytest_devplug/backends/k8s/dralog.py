"""A real kubelet's DRA side as its journal tells it: the plugins it registered, their connections, its calls.

A real kubelet shows its DRA state nowhere else (no API field, no pod-resources call). Its
``dra_plugin_manager.go`` logs ``"Registered DRA plugin"`` (driverName, endpoint, chosenService) and
``"Unregistered DRA plugin"`` at level 3 and ``"Connection changed"`` (connected=true|false) at level 2;
``dra_plugin.go`` logs every ``"Calling NodePrepareResources rpc"`` / ``"Calling NodeUnprepareResource rpc"`` with
its request and every ``"Done calling ... rpc"`` with the response and error at level 4; the plugin manager's
reconciler logs a refused registration (``"OperationExecutor.RegisterPlugin failed"``) as an error. So the
node's kubelet must log those two files at ``-v=4`` (``logging.vmodule``: ``dra_plugin=4,dra_plugin_manager=4``;
kind-config/*.yaml set it, and :class:`~.dra.KubeDRA` sets it where it is missing).

Lines are read incrementally (``journalctl --after-cursor``), only those matching :data:`GREP`. What the kubelet
has registered now is what the lines of its current process (the unit's ``MainPID``) say; events and calls are
kept from the first read on.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from ..dra import DRACallRecord, RegistrationRecord

__all__ = ["GREP", "KubeletDRAState", "KubeletLine", "VMODULE", "parse_line", "read_into", "read_script"]

#: The kubelet files whose level-4 lines the view needs, as ``logging.vmodule`` entries.
VMODULE = (("dra_plugin", 4), ("dra_plugin_manager", 4))
#: The lines read (``journalctl --grep``, PCRE2).
GREP = 'DRA plugin"|"Connection changed"|NodePrepareResources rpc"|NodeUnprepareResources? rpc"|RegisterPlugin failed"'

_LINE = re.compile(
    r"^(?P<ts>\d+(?:\.\d+)?) \S+ kubelet\[(?P<pid>\d+)\]: [IWEF]\d{4} \S+\s+\d+ \S+\] "
    r'"(?P<msg>(?:[^"\\]|\\.)*)"(?P<rest>.*)$'
)
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
#: How a logged request or response names claims: 1.34's gogo-protobuf ``String()`` (``&Claim{...UID:u,...}``,
#: ``u: &NodePrepareResourceResponse{...Error:e,}``) or, from 1.35 (google.golang.org/protobuf), its text format
#: (``claims:{namespace:"n" uid:"u" ...}``, ``claims:{key:"u" value:{... error:"e"}}``, spaces at random).
_UID = re.compile(r'UID:([^,}]+),|\buid:\s*"([^"]*)"|\bUid:([^\s}]+)')
_CLAIM_ANSWER = re.compile(
    r'([0-9A-Za-z-]+): &Node(?:Un)?[Pp]repareResourceResponse\{|\bkey:\s*"([^"]*)"\s*value:\s*\{'
)
_ERROR = re.compile(r'Error:(.*?),\}|\berror:\s*"((?:[^"\\]|\\.)*)"', re.S)
#: A Unix socket path in a plugin's description
#: (``plugin="&{SocketPath:/var/lib/kubelet/plugins_registry/x.sock ...}"``).
_SOCKET = re.compile(r"(/[^\s\"{}]+\.sock)")


def _unquote(value: str) -> str:
    if not (len(value) >= 2 and value[0] == value[-1] == '"'):
        return value
    try:
        return str(json.loads(value))
    except ValueError:
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")


@dataclass(frozen=True)
class KubeletLine:
    """One structured kubelet log line: its journal time, the kubelet's PID, the message and its key/value pairs."""

    at: float
    pid: int
    message: str
    fields: dict[str, str]


def parse_line(text: str) -> KubeletLine | None:
    """A ``journalctl -o short-unix`` line of the kubelet in klog's text format; ``None`` for any other line."""
    m = _LINE.match(text)
    if m is None:
        return None
    fields = {k: _unquote(v) for k, v in _FIELD.findall(m.group("rest"))}
    return KubeletLine(float(m.group("ts")), int(m.group("pid")), _unquote(f'"{m.group("msg")}"'), fields)


def read_script(cursor: str | None, since: str) -> str:
    """The node script printing the kubelet's ``MainPID`` (``PID <n>``), then the matching journal lines after
    ``cursor`` (else since ``since``, a ``journalctl --since`` value or ``unit-start``) and the new cursor."""
    where = (
        f"--after-cursor {shlex.quote(cursor)}"
        if cursor
        else (
            '--since "$(systemctl show -p ExecMainStartTimestamp --value kubelet)"'
            if since == "unit-start"
            else f"--since {shlex.quote(since)}"
        )
    )
    return (
        'echo "PID $(systemctl show -p MainPID --value kubelet)"; '
        f"journalctl -u kubelet --no-pager -o short-unix --show-cursor {where} --grep {shlex.quote(GREP)} || true"
    )


def _claims_errors(response: str) -> dict[str, str]:
    """Claim UID -> its ``Error`` in a logged NodePrepare/NodeUnprepare response (``""``: none)."""
    out: dict[str, str] = {}
    starts = list(_CLAIM_ANSWER.finditer(response))
    for i, m in enumerate(starts):
        section = response[m.end() : starts[i + 1].start() if i + 1 < len(starts) else len(response)]
        errors = [old or _unquote(f'"{new}"') for old, new in _ERROR.findall(section)]
        out[m.group(1) or m.group(2)] = errors[-1].strip() if errors else ""
    return out


def _claim_uids(request: str) -> tuple[str, ...]:
    return tuple(next(u for u in found if u) for found in _UID.findall(request))


@dataclass
class _Call:
    driver: str
    method: str
    uids: tuple[str, ...]
    at: float


@dataclass
class KubeletDRAState:
    """What the DRA lines fed so far say; ``feed`` them oldest first."""

    #: Whether lines before this time go into events and calls (``None``: all).
    since: float | None = None
    events: list[RegistrationRecord] = field(default_factory=list)
    calls: list[DRACallRecord] = field(default_factory=list)
    #: kubelet PID -> driver -> endpoint -> (chosen service, connected)
    _plugins: dict[int, dict[str, dict[str, tuple[str, bool]]]] = field(default_factory=dict)
    _pending: list[_Call] = field(default_factory=list)

    def _keep(self, line: KubeletLine) -> bool:
        return self.since is None or line.at >= self.since

    def feed(self, line: KubeletLine) -> None:
        f, msg = line.fields, line.message
        plugins = self._plugins.setdefault(line.pid, {})
        driver, endpoint = f.get("driverName", ""), f.get("endpoint", "")
        if msg == "Registered DRA plugin":
            plugins.setdefault(driver, {})[endpoint] = (f.get("chosenService", ""), False)
            if self._keep(line):
                self.events.append(RegistrationRecord("registered", endpoint, driver, f.get("chosenService", "")))
        elif msg == "Unregistered DRA plugin":
            plugins.get(driver, {}).pop(endpoint, None)
            if self._keep(line):
                self.events.append(RegistrationRecord("deregistered", endpoint, driver, ""))
        elif msg == "Connection changed":
            known = plugins.get(driver, {})
            if endpoint in known:
                known[endpoint] = (known[endpoint][0], f.get("connected") == "true")
        elif msg == "OperationExecutor.RegisterPlugin failed":
            socket = _SOCKET.search(f.get("plugin", ""))
            if self._keep(line):
                self.events.append(
                    RegistrationRecord("failed", socket.group(1) if socket else "", "", f.get("err", ""))
                )
        elif msg.startswith("Calling Node"):
            method = "NodePrepareResources" if "NodePrepare" in msg else "NodeUnprepareResources"
            self._pending.append(_Call(driver, method, _claim_uids(f.get("request", "")), line.at))
        elif msg.startswith("Done calling Node"):
            self._done(line, "NodePrepareResources" if "NodePrepare" in msg else "NodeUnprepareResources")

    def _done(self, line: KubeletLine, method: str) -> None:
        f = line.fields
        driver = f.get("driverName", "")
        answers = _claims_errors(f.get("response", ""))
        # 1.34's "Calling NodeUnprepareResource rpc" line names no driver: match by method and claims
        mine = [c for c in self._pending if c.driver in (driver, "") and c.method == method]
        call = next((c for c in mine if set(c.uids) == set(answers)), mine[0] if mine else None)
        if call is None:
            return  # its "Calling" line came before the first read
        self._pending.remove(call)
        call.driver = call.driver or driver
        err = f.get("err", "null")
        error = "" if err in ("null", "<nil>", "") else err
        if not error:
            error = "; ".join(f"claim {uid}: {e}" for uid, e in sorted(answers.items()) if e)
        if self.since is None or call.at >= self.since:
            self.calls.append(DRACallRecord(call.driver, call.method, call.uids, error, call.at))

    def registered(self, pid: int) -> dict[str, list[str]]:
        """Driver -> endpoints the kubelet process ``pid`` has registered (0: none runs)."""
        return {d: sorted(eps) for d, eps in self._plugins.get(pid, {}).items() if eps}

    def usable(self, pid: int, driver: str) -> bool:
        return any(connected for _, connected in self._plugins.get(pid, {}).get(driver, {}).values())

    def chosen_service(self, pid: int, driver: str) -> str | None:
        endpoints = self._plugins.get(pid, {}).get(driver, {})
        return next((service for service, _ in endpoints.values()), None)

    def forget_before(self, pid: int) -> None:
        """Drop the plugin state of kubelet processes other than ``pid`` (they ended)."""
        for old in [p for p in self._plugins if p != pid]:
            del self._plugins[old]


def read_into(state: KubeletDRAState, output: str, on_cursor: Callable[[str], None]) -> int:
    """Feed :func:`read_script`'s ``output`` to ``state``; the kubelet's current PID (0: not running)."""
    pid = 0
    for text in output.splitlines():
        if text.startswith("PID "):
            pid = int(text[4:].strip() or 0)
        elif text.startswith("-- cursor: "):
            on_cursor(text[len("-- cursor: ") :].strip())
        elif (line := parse_line(text)) is not None:
            state.feed(line)
    if pid:
        state.forget_before(pid)
    return pid
