"""Reliability benchmark: the adversarial probes of issue 11, counted.

    python bench/bench_reliability.py [--checkpoints 3000] [--registrations 300] [--ops 600] [--hung 8] [--runs 3]

1. Checkpoint reader and ``devplug checkpoint show/show --json/verify`` on generated hostile files
   (tests/reliability/fuzz_inputs.py) plus special files (FIFO, /dev/zero, a directory, a symlink
   loop, a 20 MiB file, a closed stdout pipe): every run must end in a verdict (exit 0/1/2); a Python
   exception is a crash, a run over 10 s a hang. Where Go is installed each file is also decoded by
   tests/reliability/gojson and the verdicts compared.
2. Registration: random RegisterRequests (answered with upstream's texts or connected), then
   ``--hung`` plugins whose sockets never answer register at once while a healthy one registers:
   its Register latency (median of ``--runs``).
3. Admission: ``--ops`` random pod creates/deletes on a 4-GPU node with the real GPU plugin, a
   third of the creates deleted between binding and admission: devices held twice, pods deleted
   before admission that hold devices, and at the end a pod asking for every GPU (a leak fails it).

Not a test: prints a Markdown table for bench/RESULTS.md; exit status 1 if any count that must be
0 is not.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "reliability"))

import grpc  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb  # noqa: E402
from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pb_grpc  # noqa: E402
from pytest_devplug.api.podresources import v1_pb2, v1_pb2_grpc  # noqa: E402
from pytest_devplug.cli import main as devplug  # noqa: E402
from pytest_devplug.nvml import mock_env  # noqa: E402
from pytest_devplug.settings import default_plugin_argv  # noqa: E402
from pytest_devplug.backends.base import PluginSpec  # noqa: E402
from pytest_devplug.kubeletmodel.checkpoint import CheckpointData, decode, encode  # noqa: E402
from pytest_devplug.errors import CheckpointFormatError, NotFoundError  # noqa: E402
from pytest_devplug.sim.embeddedplane import EmbeddedPlane  # noqa: E402
from pytest_devplug.sim.devicemanager import DeviceManager  # noqa: E402
from pytest_devplug.sim.kubelet import SimNode  # noqa: E402

GPU = "nvidia.com/gpu"
HANG_S = 10.0


@dataclass
class Row:
    what: str
    tried: int = 0
    clean: int = 0
    crashes: int = 0
    hangs: int = 0
    double: int | str = "-"
    leaks: int | str = "-"
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        return (
            f"| {self.what} | {self.tried} | {self.clean} | {self.crashes} | {self.hangs} | {self.double} "
            f"| {self.leaks} | {'; '.join(self.notes)} |"
        )


class _Hang(Exception):
    pass


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _Hang()


@contextlib.contextmanager
def _deadline(seconds: float) -> Any:
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


# -- 1. checkpoints ------------------------------------------------------------------------------
def bench_checkpoints(n: int, work: Path) -> tuple[Row, Row]:
    from reliability_support import GoDecoder, build_gojson  # tests/reliability
    from fuzz_inputs import checkpoint_files

    built = build_gojson()
    go = GoDecoder(built) if not isinstance(built, str) else None
    row = Row("`devplug checkpoint` on generated files (show, show --json, verify)")
    agree = Row("the reader vs Go's `json.Unmarshal` on the same files")
    path = work / "checkpoint"
    samples: list[str] = []

    @settings(max_examples=n, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(checkpoint_files(), st.sampled_from([["show"], ["show", "--json"], ["verify"]]))
    def one(blob: bytes, action: list[str]) -> None:
        row.tried += 1
        path.write_bytes(blob)
        out, err = io.StringIO(), io.StringIO()
        try:
            with _deadline(HANG_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = devplug(["checkpoint", *action, str(path)])
        except _Hang:
            row.hangs += 1
            return
        except BaseException as exc:  # noqa: BLE001 - counting crashes is the point
            row.crashes += 1
            if len(samples) < 3:
                samples.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        if code in (0, 1, 2):
            row.clean += code != 0
        else:
            row.crashes += 1
        if go is not None:
            agree.tried += 1
            try:
                data, stored = decode(blob)
                mine: Any = json.loads(encode(data, stored=stored))
            except CheckpointFormatError:
                mine = None
            theirs = go.decode(blob)
            same = (mine is None) == (not theirs["ok"]) and (mine is None or mine == theirs["value"])
            agree.clean += same and mine is None
            agree.crashes += not same

    one()
    if go is not None:
        go.close()
        agree.notes.append("clean: refused by both; crashes: a different verdict or decoded value than Go's")
    else:
        agree.notes.append(built)
    row.notes.append("clean: exit 1 (checksum mismatch) or 2 (not a checkpoint); exit 0 otherwise")
    row.notes.extend(samples)
    return row, agree


def bench_special_files(work: Path) -> Row:
    row = Row("`devplug checkpoint` on special files (FIFO, /dev/zero, dir, symlink loop, 20 MiB, closed pipe)")
    fifo = work / "fifo"
    os.mkfifo(fifo)
    loop = work / "loop"
    os.symlink(loop, loop)
    big = work / "big"
    with big.open("wb") as f:
        f.truncate(20 * 1024 * 1024)
    good = work / "good"
    good.write_bytes(encode(CheckpointData(None, {"r": [f"GPU-{i:06d}" for i in range(50_000)]})))
    cmd = [sys.executable, "-c", "import sys; from pytest_devplug.cli import main; sys.exit(main(sys.argv[1:]))"]
    cases: list[tuple[list[str], bool]] = []
    for target in (fifo, Path("/dev/zero"), work, loop, big):
        for action in (["show"], ["show", "--json"], ["verify"]):
            cases.append(([*action, str(target)], False))
    cases += [(["show", str(good)], True), (["show", "--json", str(good)], True)]
    for args, closed_pipe in cases:
        row.tried += 1
        proc = subprocess.Popen([*cmd, "checkpoint", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        if closed_pipe:
            proc.stdout.read(1)
            proc.stdout.close()  # what `| head -c1` does
            proc.stdout = None
        try:
            _, err = proc.communicate(timeout=HANG_S)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            row.hangs += 1
            continue
        if b"Traceback" in err or code not in ((141,) if closed_pipe else (2,)):
            row.crashes += 1
            row.notes.append(f"{args}: exit {code} {err[-200:]!r}")
        else:
            row.clean += 1
    return row


# -- 2. registration -----------------------------------------------------------------------------
def bench_registration(n: int, hung: int, runs: int) -> tuple[Row, Row]:
    fuzz = Row("Register with random version / resource name / endpoint")
    hol = Row(f"a healthy plugin's Register while {hung} others hang in their dial")
    root = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))
    try:
        plugin_dir = root / "dp"
        plugin_dir.mkdir()
        counter = _Counter()
        log = logging.getLogger("pytest_devplug.bench.registration")
        log.setLevel(logging.INFO)
        log.propagate = False
        log.addHandler(counter)
        dm = DeviceManager(plugin_dir, logger=log)
        dm.start()
        try:
            dm.dial_timeout = 0.05
            rng = random.Random(11)
            alphabet = "abcXYZ019./-_ \n\t\u00e9/"
            for _ in range(n):
                fuzz.tried += 1
                req = pb.RegisterRequest(
                    version=rng.choice(["v1beta1", "v1beta1", "v1alpha", ""]),
                    endpoint="".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))),
                    resource_name=rng.choice(["example.com/", "EXAMPLE.com/", "", "kubernetes.io/", "a/b/"])
                    + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))),
                )
                with grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as ch:
                    try:
                        pb_grpc.RegistrationStub(ch).Register(req, timeout=HANG_S)
                        fuzz.crashes += 1  # nothing serves these endpoints
                    except grpc.RpcError as err:
                        if err.code() == grpc.StatusCode.UNKNOWN:
                            fuzz.clean += 1
                        elif err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                            fuzz.hangs += 1
                        else:
                            fuzz.crashes += 1
            dm.dial_timeout = 10.0  # upstream's
            latencies = [_healthy_behind_hung(dm, plugin_dir, hung, i, counter) for i in range(runs)]
            hol.tried = runs
            hol.clean = sum(1 for t in latencies if t < 1.0)
            hol.hangs = sum(1 for t in latencies if t >= 1.0)
            hol.notes.append(
                f"median {statistics.median(latencies) * 1000:.0f} ms (runs: "
                + ", ".join(f"{t * 1000:.0f}" for t in latencies)
                + " ms); target < 1 s; clean: under 1 s"
            )
        finally:
            dm.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    fuzz.notes.append("clean: refused with status Unknown (the texts are checked by tests/reliability)")
    return fuzz, hol


class _Counter(logging.Handler):
    """Counts the Register calls the kubelet has started serving."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Got registration request" in record.getMessage():
            self.seen += 1


def _healthy_behind_hung(dm: DeviceManager, plugin_dir: Path, hung: int, run: int, counter: _Counter) -> float:
    silent = []
    threads = []
    for i in range(hung):
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(plugin_dir / f"hung{run}-{i}.sock"))
        s.listen(16)
        silent.append(s)

        def register(i: int = i) -> None:
            with grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as ch:
                with contextlib.suppress(grpc.RpcError):
                    pb_grpc.RegistrationStub(ch).Register(
                        pb.RegisterRequest(
                            version="v1beta1", endpoint=f"hung{run}-{i}.sock", resource_name=f"example.com/hung{i}"
                        ),
                        timeout=30,
                    )

        threads.append(threading.Thread(target=register, daemon=True))
    before = counter.seen
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while counter.seen < before + hung:  # every hung Register is in the kubelet, dialling
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {counter.seen - before} of {hung} Register calls reached the kubelet")
        time.sleep(0.01)
    healthy = _HealthyPlugin(plugin_dir / f"healthy{run}.sock")
    try:
        start = time.monotonic()
        with grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as ch:
            pb_grpc.RegistrationStub(ch).Register(
                pb.RegisterRequest(version="v1beta1", endpoint=healthy.sock.name, resource_name="example.com/healthy"),
                timeout=60,
            )
        return time.monotonic() - start
    finally:
        for t in threads:
            t.join(timeout=15)
        for s in silent:
            s.close()
        healthy.stop()


class _HealthyPlugin(pb_grpc.DevicePluginServicer):
    def __init__(self, sock: Path) -> None:
        from concurrent import futures

        self.sock = sock
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DevicePluginServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        self._server.add_insecure_port(f"unix://{sock}")
        self._server.start()
        self._stop = threading.Event()

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:  # noqa: N802
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Any:  # noqa: N802
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="d0", health="Healthy")])
        while not self._stop.wait(0.1) and context.is_active():
            pass

    def stop(self) -> None:
        self._stop.set()
        self._server.stop(grace=None).wait(5)


# -- 3. admission --------------------------------------------------------------------------------
def _pod(name: str, gpus: int, node_name: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": {GPU: gpus}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _held(node: SimNode) -> dict[str, list[str]]:
    with grpc.insecure_channel(f"unix://{node.pod_resources_socket}") as ch:
        resp = v1_pb2_grpc.PodResourcesListerStub(ch).List(v1_pb2.ListPodResourcesRequest(), timeout=5)  # type: ignore[no-untyped-call]
    return {p.name: [i for c in p.containers for d in c.devices for i in d.device_ids] for p in resp.pod_resources}


def bench_admission(ops: int, work: Path) -> Row:
    row = Row("pod create/delete on 4 GPUs, 1 in 3 creates deleted between binding and admission")
    state = work / "state.json"
    gpus = [
        {
            "uuid": f"GPU-{i:04d}",
            "name": "A100",
            "memory_mib": 40960,
            "numa_node": i % 2,
            "minor": i,
            "lost": False,
            "fail_allocate": False,
        }
        for i in range(4)
    ]
    state.write_text(json.dumps({"gpus": gpus, "events": []}))
    rng = random.Random(5)
    double = leaks = 0
    with EmbeddedPlane() as cluster:
        node = cluster.add_node("node-1")
        spec = PluginSpec(argv=default_plugin_argv(GPU, pre_start_required=False))
        node.start_plugin(spec.command(plugin_dir=node.plugin_dir, mock_state=state)[0], env=mock_env(str(state)))
        deadline = time.monotonic() + 30
        while node.allocatable().get(GPU) != "4":
            if time.monotonic() > deadline:
                raise TimeoutError("the GPU plugin did not register within 30 s")
            time.sleep(0.05)
        admit = node.admit
        doomed: set[str] = set()

        def admit_unless_deleted(p: dict[str, Any]) -> None:
            if p["metadata"]["name"] in doomed:
                cluster.delete_pod(p["metadata"]["name"])
            admit(p)

        node.admit = admit_unless_deleted  # type: ignore[method-assign]
        live: set[str] = set()
        for _ in range(ops):
            row.tried += 1
            name = f"p{rng.randrange(8)}"
            try:
                if name in live and rng.random() < 0.6:
                    cluster.delete_pod(name)
                    live.discard(name)
                elif name not in live:
                    if rng.random() < 1 / 3:
                        doomed.add(name)
                    try:
                        cluster.create_pod(_pod(name, rng.randint(1, 2), "node-1" if rng.random() < 0.5 else None))
                        live.add(name)
                    except NotFoundError:
                        pass
                    doomed.discard(name)
                held = _held(node)
                ids = [d for devs in held.values() for d in devs]
                double += len(ids) - len(set(ids))
                leaks += sum(1 for n in held if n not in live)
                row.clean += 1
            except Exception as exc:  # noqa: BLE001
                row.crashes += 1
                row.notes.append(f"{type(exc).__name__}: {exc}"[:200])
        for name in list(live):
            cluster.delete_pod(name)
        cluster.create_pod(_pod("all", 4, "node-1"))
        if cluster.get_pod("all")["status"].get("phase") != "Running" or len(_held(node).get("all", [])) != 4:
            leaks += 1
            row.notes.append("a pod asking for all 4 GPUs was not admitted after every pod was deleted")
    row.double, row.leaks = double, leaks
    row.notes.append("leaks: a device held by a pod no longer live, or the final all-GPU pod refused")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoints", type=int, default=3000)
    ap.add_argument("--registrations", type=int, default=300)
    ap.add_argument("--ops", type=int, default=600)
    ap.add_argument("--hung", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="devplug-bench-rel-"))
    started = time.monotonic()
    try:
        rows = [*bench_checkpoints(args.checkpoints, work), bench_special_files(work)]
        rows += bench_registration(args.registrations, args.hung, args.runs)
        rows.append(bench_admission(args.ops, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| probe | cases tried | clean errors | crashes | hangs | double allocations | leaks | notes |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r.markdown())
    print(f"\n{time.monotonic() - started:.0f} s in all")
    bad = [r for r in rows if r.crashes or r.hangs or r.double not in (0, "-") or r.leaks not in (0, "-")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
