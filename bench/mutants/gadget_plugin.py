"""example.com/gadget: a small device plugin as a plugin author writes one, with realistic bugs switchable.

Devices come from a health file (JSON ``{"count": N, "unhealthy": [ids], "fail": bool, "prestart_fail": bool}``) it
re-reads when it changes; ``--second-resource NAME=N`` serves the last N gadgets as a second resource from the same
process (its own socket and registration). PreStartContainer "resets" the gadgets it is given (``prestart_fail``:
the reset fails). Each process serves on a socket of its own, so a second instance can start beside a running one.
``GADGET_BUG`` selects one bug (mutant schemata: each bug is the one line a real plugin got wrong):

* ``law-ends``: ListAndWatch returns after 8 s (an idle timeout copied from an HTTP handler);
* ``no-reregister``: never notices a kubelet restart;
* ``ids-change``: device IDs derive from the process (a UUID minted at start instead of the device's serial);
* ``sticky-unhealthy``: a device once Unhealthy is never reported Healthy again;
* ``init-reuse``: Allocate refuses an ID it already handed out (it keeps its own "in use" set);
* ``first-stream-only``: health updates reach only the first ListAndWatch stream (a queue with one consumer);
* ``register-first``: registers before its server is started;
* ``single-instance``: a fixed socket name, and exits when something answers on it ("already running"): a rolling
  update's new instance never comes up;
* ``prestart-swallows``: a failed reset in PreStartContainer is logged and answered with success;
* ``health-after-prestart``: health is watched for free gadgets and for gadgets PreStartContainer handed to a
  container, not for gadgets allocated to a container that has not started yet;
* ``numa-minus-one``: the NUMA node read from sysfs is sent as is, ``-1`` ("unknown") included;
* ``reregister-first-only``: after a kubelet restart only the first resource is registered again;
* ``allocate-first-table``: the second resource's Allocate looks its IDs up in the first resource's table.
"""

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from concurrent import futures

import grpc

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pbg

parser = argparse.ArgumentParser()
parser.add_argument("--plugin-dir", required=True)
parser.add_argument("--health-file", required=True)
parser.add_argument("--resource-name", default="example.com/gadget")
parser.add_argument("--second-resource", default=None, help="NAME=N: the last N gadgets as a second resource")
args = parser.parse_args()
BUG = os.environ.get("GADGET_BUG", "none")

KUBELET = os.path.join(args.plugin_dir, "kubelet.sock")
PREFIX = uuid.uuid4().hex[:6] if BUG == "ids-change" else "gadget"
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())


def read_health() -> dict:
    with open(args.health_file) as fh:
        return json.load(fh)


def answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


class State:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.version = 0
        self.devices: list[pb.Device] = []
        self.ever_unhealthy: set[str] = set()
        self.handed_out: set[str] = set()
        self.allocated: set[str] = set()
        self.prestarted: set[str] = set()
        self.first_stream_taken = False
        self.updates_for_first: list[int] = []

    def reload(self, h: dict) -> None:
        bad = set(h.get("unhealthy", []))
        if BUG == "sticky-unhealthy":
            self.ever_unhealthy |= bad
            bad = self.ever_unhealthy
        if BUG == "health-after-prestart":
            bad -= {f"gadget-{d.rsplit('-', 1)[1]}" for d in self.allocated - self.prestarted}
        devs = []
        for i in range(h["count"]):
            dev = pb.Device(ID=f"{PREFIX}-{i}", health="Unhealthy" if f"gadget-{i}" in bad else "Healthy")
            if BUG == "numa-minus-one":
                dev.topology.nodes.add(ID=-1)  # /sys/bus/pci/devices/<addr>/numa_node on a machine without NUMA info
            devs.append(dev)
        with self.cond:
            self.devices = devs
            self.version += 1
            self.cond.notify_all()


STATE = State()


class Gadgets(pbg.DevicePluginServicer):
    """One resource's servicer: the gadgets whose index ``member`` accepts."""

    def __init__(self, resource: str, member, first: "Gadgets | None" = None) -> None:
        self.resource, self.member, self.first = resource, member, first

    def mine(self) -> list[pb.Device]:
        with STATE.cond:
            return [d for d in STATE.devices if self.member(int(d.ID.rsplit("-", 1)[1]))]

    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions(pre_start_required=True)

    def ListAndWatch(self, request, context):
        started = time.monotonic()
        with STATE.cond:
            first = not STATE.first_stream_taken
            STATE.first_stream_taken = True
            seen = STATE.version
        devs = self.mine()
        yield pb.ListAndWatchResponse(devices=devs)
        while context.is_active() and not stop.is_set():
            if BUG == "law-ends" and time.monotonic() - started > 8:
                return
            with STATE.cond:
                if STATE.version == seen:
                    STATE.cond.wait(0.2)
                    continue
                seen = STATE.version
            if BUG == "first-stream-only" and not first:
                continue  # the update went to the queue the first stream consumes
            now = self.mine()
            if now != devs:
                devs = now
                yield pb.ListAndWatchResponse(devices=devs)

    def Allocate(self, request, context):
        if read_health().get("fail"):
            context.abort(grpc.StatusCode.UNAVAILABLE, "gadget firmware does not answer")
        table = self.first if BUG == "allocate-first-table" and self.first is not None else self
        known = {d.ID for d in table.mine()}
        out = pb.AllocateResponse()
        for c in request.container_requests:
            unknown = sorted(set(c.devices_ids) - known)
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown {self.resource} devices {unknown}")
            if BUG == "init-reuse":
                taken = sorted(set(c.devices_ids) & STATE.handed_out)
                if taken:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"gadgets {taken} are already in use")
                STATE.handed_out |= set(c.devices_ids)
            STATE.allocated |= set(c.devices_ids)
            r = out.container_responses.add()
            r.envs["GADGET_IDS" if self.first is None else "GADGET_MINI_IDS"] = ",".join(c.devices_ids)
        return out

    def PreStartContainer(self, request, context):
        if read_health().get("prestart_fail"):
            print(f"gadget: resetting {list(request.devices_ids)} failed", flush=True)
            if BUG != "prestart-swallows":
                context.abort(grpc.StatusCode.INTERNAL, f"resetting gadgets {list(request.devices_ids)} failed")
        STATE.prestarted |= set(request.devices_ids)
        return pb.PreStartContainerResponse()


class Served:
    """One resource: its servicer, socket and registration."""

    def __init__(self, servicer: Gadgets, name: str) -> None:
        self.servicer, self.name = servicer, name
        self.sock = os.path.join(args.plugin_dir, name)
        self.server: grpc.Server | None = None

    def serve(self) -> None:
        if self.server is not None:
            self.server.stop(0)
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pbg.add_DevicePluginServicer_to_server(self.servicer, self.server)
        self.server.add_insecure_port("unix://" + self.sock)
        self.server.start()

    def register(self) -> None:
        request = pb.RegisterRequest(
            version="v1beta1",
            endpoint=self.name,
            resource_name=self.servicer.resource,
            options=pb.DevicePluginOptions(pre_start_required=True),
        )
        with grpc.insecure_channel("unix://" + KUBELET) as ch:
            pbg.RegistrationStub(ch).Register(request, timeout=10)


def identity(path: str):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


if BUG == "single-instance" and answers(os.path.join(args.plugin_dir, "gadget.sock")):
    print("gadget: another gadget plugin is already running, exiting", flush=True)
    sys.exit(1)
STATE.reload(read_health())
count = read_health()["count"]
second = int(args.second_resource.rpartition("=")[2]) if args.second_resource else 0
main = Gadgets(args.resource_name, lambda i: i < count - second)
tag = "" if BUG == "single-instance" else f"-{os.getpid()}"
served = [Served(main, f"gadget{tag}.sock")]
if second:
    served.append(
        Served(
            Gadgets(args.second_resource.rpartition("=")[0], lambda i: i >= count - second, main),
            f"gadget-mini{tag}.sock",
        )
    )
if BUG == "register-first":
    try:
        served[0].register()
    except grpc.RpcError as exc:
        print("gadget: register failed:", exc.details(), flush=True)
    time.sleep(1.0)
for s in served:
    s.serve()
if BUG != "register-first":
    for s in served:
        s.register()
print("gadget: registered", [s.servicer.resource for s in served], "bug", BUG, flush=True)
kubelet_seen, health_seen = identity(KUBELET), identity(args.health_file)
while not stop.wait(0.1):
    h = identity(args.health_file)
    if h != health_seen:
        health_seen = h
        try:
            STATE.reload(read_health())
        except (OSError, ValueError) as exc:
            print("gadget: bad health file, keeping the last state:", exc, flush=True)
    k = identity(KUBELET)
    if BUG == "no-reregister" or k is None or k == kubelet_seen:
        continue
    try:
        for s in served[:1] if BUG == "reregister-first-only" else served:
            s.serve()
            s.register()
        kubelet_seen = k
    except grpc.RpcError as exc:
        print("gadget: re-register failed (will retry):", exc.details(), flush=True)
for s in served:
    if s.server is not None:
        s.server.stop(0)
    if os.path.exists(s.sock):
        os.unlink(s.sock)
sys.exit(0)
