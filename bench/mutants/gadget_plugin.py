"""example.com/gadget: a small device plugin as a plugin author writes one, with realistic bugs switchable.

Devices come from a health file (JSON ``{"count": N, "unhealthy": [ids], "fail": bool}``) it re-reads when it
changes. ``GADGET_BUG`` selects one bug (mutant schemata: each bug is the one line a real plugin got wrong):

* ``law-ends``: ListAndWatch returns after 8 s (an idle timeout copied from an HTTP handler);
* ``no-reregister``: never notices a kubelet restart;
* ``ids-change``: device IDs derive from the process (a UUID minted at start instead of the device's serial);
* ``sticky-unhealthy``: a device once Unhealthy is never reported Healthy again;
* ``init-reuse``: Allocate refuses an ID it already handed out (it keeps its own "in use" set);
* ``first-stream-only``: health updates reach only the first ListAndWatch stream (a queue with one consumer);
* ``register-first``: registers before its server is started.
"""

import argparse
import json
import os
import queue
import signal
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
args = parser.parse_args()
BUG = os.environ.get("GADGET_BUG", "none")

NAME = "gadget.sock"
SOCK, KUBELET = os.path.join(args.plugin_dir, NAME), os.path.join(args.plugin_dir, "kubelet.sock")
PREFIX = uuid.uuid4().hex[:6] if BUG == "ids-change" else "gadget"
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())


def read_health() -> dict:
    with open(args.health_file) as fh:
        return json.load(fh)


class State:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.version = 0
        self.devices: list[pb.Device] = []
        self.ever_unhealthy: set[str] = set()
        self.updates: "queue.Queue[int]" = queue.Queue()
        self.first_stream_taken = False
        self.handed_out: set[str] = set()

    def reload(self, h: dict) -> None:
        bad = set(h.get("unhealthy", []))
        if BUG == "sticky-unhealthy":
            self.ever_unhealthy |= bad
            bad = self.ever_unhealthy
        devs = [pb.Device(ID=f"{PREFIX}-{i}", health="Unhealthy" if f"gadget-{i}" in bad else "Healthy") for i in range(h["count"])]
        with self.cond:
            self.devices = devs
            self.version += 1
            self.cond.notify_all()
        self.updates.put(self.version)


STATE = State()


class Gadgets(pbg.DevicePluginServicer):
    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request, context):
        started = time.monotonic()
        with STATE.cond:
            first = not STATE.first_stream_taken
            STATE.first_stream_taken = True
            seen, devs = STATE.version, list(STATE.devices)
        yield pb.ListAndWatchResponse(devices=devs)
        while context.is_active() and not stop.is_set():
            if BUG == "law-ends" and time.monotonic() - started > 8:
                return
            if BUG == "first-stream-only":
                if not first:
                    time.sleep(0.2)
                    continue
                try:
                    STATE.updates.get(timeout=0.2)
                except queue.Empty:
                    continue
                with STATE.cond:
                    devs = list(STATE.devices)
                yield pb.ListAndWatchResponse(devices=devs)
                continue
            with STATE.cond:
                if STATE.version == seen:
                    STATE.cond.wait(0.2)
                    continue
                seen, devs = STATE.version, list(STATE.devices)
            yield pb.ListAndWatchResponse(devices=devs)

    def Allocate(self, request, context):
        if read_health().get("fail"):
            context.abort(grpc.StatusCode.UNAVAILABLE, "gadget firmware does not answer")
        out = pb.AllocateResponse()
        for c in request.container_requests:
            if BUG == "init-reuse":
                taken = sorted(set(c.devices_ids) & STATE.handed_out)
                if taken:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"gadgets {taken} are already in use")
                STATE.handed_out |= set(c.devices_ids)
            r = out.container_responses.add()
            r.envs["GADGET_IDS"] = ",".join(c.devices_ids)
        return out

    def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()


def serve() -> grpc.Server:
    if os.path.exists(SOCK):
        os.unlink(SOCK)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pbg.add_DevicePluginServicer_to_server(Gadgets(), server)
    server.add_insecure_port("unix://" + SOCK)
    server.start()
    return server


def register() -> None:
    with grpc.insecure_channel("unix://" + KUBELET) as ch:
        pbg.RegistrationStub(ch).Register(pb.RegisterRequest(version="v1beta1", endpoint=NAME, resource_name=args.resource_name), timeout=10)


def identity(path: str):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


STATE.reload(read_health())
if BUG == "register-first":
    try:
        register()
    except grpc.RpcError as exc:
        print("gadget: register failed:", exc.details(), flush=True)
    time.sleep(1.0)
server = serve()
if BUG != "register-first":
    register()
print("gadget: registered", args.resource_name, "bug", BUG, flush=True)
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
    server.stop(0)
    server = serve()
    try:
        register()
        kubelet_seen = k
    except grpc.RpcError as exc:
        print("gadget: re-register failed (will retry):", exc.details(), flush=True)
server.stop(0)
sys.exit(0)
