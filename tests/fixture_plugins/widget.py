"""example.com/widget: a small device plugin that, like most shipped plugins, hard-codes the kubelet's
directory (``--plugin-dir`` only overrides it). ``--fault`` makes it break the way real plugins do:

* ``allocate-empty``: ``Allocate`` answers with no container responses at all;
* ``exit-at-start``: prints a reason and exits 3 before serving anything;
* ``panic-at-start``: dies as a Go plugin does, its fatal line first and then a long goroutine dump (exit 2);
* ``control-ids``: lists device IDs made of control characters (a ``string(uint)`` bug in Go);
* ``node-of-another``: with ``--host-nodes``, the second device's ``Allocate`` names the first device's host node;
* ``cdi-spec-once``: with ``--cdi-root``, writes its CDI spec only on its first start on the node (a marker file in
  the plugin directory, which survives a reboot, says it did), as a plugin whose spec an install step generates.

``--cdi-root DIR`` makes ``Allocate`` answer CDI devices (``example.com/widget=<id>``) from a spec the widget writes
there when it starts.

``--exit-on-kubelet-restart`` makes it exit when kubelet.sock goes or changes, as plugins do that count on their
DaemonSet to restart them (with neither it nor ``--retry`` a failed ``Register`` at start exits 1 as well).

``--shared`` makes every ID a share of one device (``/dev/widget`` in every container): a scheduling budget, as
plugins that share a device by design advertise it.

``--socket-per-start-second`` names its socket after the second the process started in and never removes a stale
one, retrying every second while the name is taken, as squat's generic-device-plugin does (``gdp-<resource>-<unix
seconds>.sock``): fine on a node, where two starts of a plugin come a second apart or more (but for one that
dies within its first second).

``--registration plugins_registry`` puts its socket in ``--registry-dir`` instead, serving ``Registration`` beside
``DevicePlugin`` (an empty endpoint: the kubelet dials that same socket), as SR-IOV's and RDMA's plugins do; it then
never calls ``Register``. ``--info-version`` is the version its ``GetInfo`` names (a wrong one is a seeded bug).
"""

import argparse
import json
import os
import signal
import sys
import threading
from concurrent import futures

import grpc

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pbg
from pytest_devplug.api.pluginregistration import v1_pb2 as rpb
from pytest_devplug.api.pluginregistration import v1_pb2_grpc as rpbg

parser = argparse.ArgumentParser()
parser.add_argument("--plugin-dir", default="/var/lib/kubelet/device-plugins")
parser.add_argument("--resource-name", default="example.com/widget")
parser.add_argument("--count", type=int, default=3)
parser.add_argument("--retry", action="store_true", help="retry a failed registration every 0.5 s (else exit 1)")
parser.add_argument("--exit-on-kubelet-restart", action="store_true", help="exit 0 when kubelet.sock goes or changes")
parser.add_argument(
    "--fault",
    choices=[
        "none",
        "allocate-empty",
        "exit-at-start",
        "panic-at-start",
        "control-ids",
        "cdi-spec-once",
        "node-of-another",
    ],
    default="none",
)
parser.add_argument("--cdi-root", default="", help="answer CDI devices, from a spec written here at start")
parser.add_argument("--registration", choices=["kubelet.sock", "plugins_registry"], default="kubelet.sock")
parser.add_argument("--shared", action="store_true", help="every ID is a share of one device: /dev/widget for all")
parser.add_argument("--host-nodes", action="store_true", help="each ID its own host node /dev/<id> (not /dev/null)")
parser.add_argument("--registry-dir", default="/var/lib/kubelet/plugins_registry")
parser.add_argument(
    "--socket-per-start-second", action="store_true", help="socket widget-<unix seconds>.sock, stale ones kept"
)
parser.add_argument("--info-version", default="v1beta1", help="the version GetInfo names (plugins_registry)")
args = parser.parse_args()

if args.fault == "exit-at-start":
    print("widget: cannot open /dev/widgetctl: no such device", file=sys.stderr, flush=True)
    sys.exit(3)
if args.fault == "panic-at-start":
    print("I1201 10:00:00.000000       1 main.go:42] Starting widget plugin", file=sys.stderr)
    print(
        "panic: listen unix /var/lib/kubelet/device-plugins/widget.sock: bind: address already in use", file=sys.stderr
    )
    print("\ngoroutine 1 [running]:", file=sys.stderr)
    for i in range(60):
        print(f"main.frame{i}(...)\n\t/src/widget/main.go:{100 + i} +0x{i:x}", file=sys.stderr)
    sys.stderr.flush()
    sys.exit(2)


def start_second() -> int:
    """The Unix second this process started in (/proc: boot time + its start in clock ticks), as a Go plugin reads
    the clock first thing; the clock read here would come after gRPC's import, a good part of a second later."""
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rpartition(")")[2].split()[19])
    return boot + ticks // os.sysconf("SC_CLK_TCK")


NAME = f"widget-{start_second()}.sock" if args.socket_per_start_second else "widget.sock"
WATCHED = args.registration == "plugins_registry"
SOCK = os.path.join(args.registry_dir if WATCHED else args.plugin_dir, NAME)
KUBELET = os.path.join(args.plugin_dir, "kubelet.sock")
IDS = [chr(i) for i in range(args.count)] if args.fault == "control-ids" else [f"widget-{i}" for i in range(args.count)]
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())


class Widgets(pbg.DevicePluginServicer):
    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request, context):
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy") for i in IDS])
        while context.is_active() and not stop.wait(0.2):
            pass

    def Allocate(self, request, context):
        out = pb.AllocateResponse()
        if args.fault == "allocate-empty":
            return out
        for c in request.container_requests:
            r = out.container_responses.add()
            r.envs["WIDGET_IDS"] = ",".join(c.devices_ids)
            for d in c.devices_ids:
                host = f"/dev/{d}" if args.host_nodes else "/dev/null"
                if args.fault == "node-of-another" and d == IDS[1]:
                    host = f"/dev/{IDS[0]}"  # the bug: the second device answered with the first one's node
                r.devices.add(
                    container_path="/dev/widget" if args.shared else f"/dev/{d}", host_path=host, permissions="rw"
                )
                if args.cdi_root:
                    r.cdi_devices.add(name=f"{CDI_KIND}={d}")
        return out

    def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()


class Registration(rpbg.RegistrationServicer):
    def GetInfo(self, request, context):
        return rpb.PluginInfo(type="DevicePlugin", name=args.resource_name, supported_versions=[args.info_version])

    def NotifyRegistrationStatus(self, request, context):
        print(
            "widget: the plugin watcher says", "registered" if request.plugin_registered else request.error, flush=True
        )
        return rpb.RegistrationStatusResponse()


def serve() -> grpc.Server:
    if args.socket_per_start_second:
        # Go's net.Listen refuses a path that exists (gRPC's C core would unlink it): wait for it to go.
        while os.path.exists(SOCK):
            print(f"widget: listen unix {SOCK}: bind: address already in use; trying again in 1 s", flush=True)
            if stop.wait(1.0):
                sys.exit(0)
    elif os.path.exists(SOCK):
        os.unlink(SOCK)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pbg.add_DevicePluginServicer_to_server(Widgets(), server)
    if WATCHED:
        rpbg.add_RegistrationServicer_to_server(Registration(), server)
    server.add_insecure_port("unix://" + SOCK)
    server.start()
    return server


def register() -> None:
    with grpc.insecure_channel("unix://" + KUBELET) as ch:
        pbg.RegistrationStub(ch).Register(
            pb.RegisterRequest(version="v1beta1", endpoint=NAME, resource_name=args.resource_name), timeout=10
        )


CDI_KIND = "example.com/widget"


def write_cdi_spec() -> None:
    marker = os.path.join(args.plugin_dir, ".widget-cdi-installed")
    if args.fault == "cdi-spec-once" and os.path.exists(marker):
        print("widget: CDI spec installed before, not written again", flush=True)
        return
    os.makedirs(args.cdi_root, exist_ok=True)
    devices = [{"name": i, "containerEdits": {"env": [f"WIDGET_CDI_{n}={i}"]}} for n, i in enumerate(IDS)]
    path = os.path.join(args.cdi_root, "example.com-widget.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"cdiVersion": "0.6.0", "kind": CDI_KIND, "devices": devices}, f)
    os.replace(path + ".tmp", path)
    open(marker, "w").close()
    print("widget: wrote CDI spec", path, flush=True)


print("widget: plugin dir holds", sorted(os.listdir(args.plugin_dir)), flush=True)
if args.cdi_root:
    write_cdi_spec()
server = serve()
if WATCHED:  # the kubelet's plugin watcher does the rest, after each of its restarts too
    print("widget: serving", SOCK, "for the plugin watcher", flush=True)
    stop.wait()
    server.stop(0)
    os.unlink(SOCK)
    sys.exit(0)
while True:
    try:
        register()
        break
    except grpc.RpcError as exc:
        print("widget: register failed:", exc.code(), exc.details(), flush=True)
        if not args.retry:
            sys.exit(1)
        if stop.wait(0.5):
            sys.exit(0)
print("widget: registered", args.resource_name, flush=True)


def kubelet_identity() -> tuple[int, int] | None:
    """kubelet.sock's inode and change time: a new socket may reuse the old one's inode number."""
    try:
        st = os.stat(KUBELET)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


# Like upstream's stub: a new kubelet.sock means a restarted kubelet, which deleted our socket too (reacting
# to our own socket's removal instead races the kubelet's clean-up and can register over a socket it deletes).
seen = kubelet_identity()
while not stop.wait(0.1):
    now = kubelet_identity()
    if now != seen and args.exit_on_kubelet_restart:
        print("widget: kubelet.sock", "is gone" if now is None else "changed", "- exiting to be restarted", flush=True)
        server.stop(0)
        sys.exit(0)
    if now is None or now == seen:
        continue
    server.stop(0)
    server = serve()
    try:
        register()
        seen = now
    except grpc.RpcError as exc:
        print("widget: re-register failed (will retry):", exc.details(), flush=True)
server.stop(0)
