"""dra.devplug.example: a small DRA kubelet plugin, written for the harness's own tests of the DRA suite.

It does what a driver built on ``k8s.io/dynamic-resource-allocation/kubeletplugin`` does, in Python: serves
``pluginregistration.Registration`` on ``<registry>/<driver>-reg.sock`` and ``v1.DRAPlugin`` +
``v1alpha1.DRAResourceHealth`` on ``<plugins>/<driver>/dra.sock``; publishes one ResourceSlice for its node (and
publishes it again when it is deleted); prepares a claim by reading it from the API server and writing a CDI spec
under ``--cdi-root``, idempotently. The API is reached the in-cluster way (service-account files, KUBERNETES_SERVICE_*)
unless ``--kubeconfig`` is given. Device names are opaque (``w-<hash>``).

``--control FILE`` (JSON, re-read on every call) injects faults: ``fail_prepare``, ``fail_unprepare`` (bools) and
``unhealthy`` (device names reported Unhealthy on the health stream, or with ``--health taints`` as a
``NoSchedule`` taint on the device in its ResourceSlice, with no health service, as NVIDIA's DRA driver reports
health). ``--break`` makes it wrong the way drivers are:

* ``prepare-not-idempotent``: a second prepare of a claim answers other CDI IDs;
* ``wrong-device``: prepares another device than the one allocated;
* ``no-republish``: never publishes its slice again after it was deleted;
* ``exit-on-refusal``: exits when the kubelet refuses its registration;
* ``unprepare-unknown-fails``: unpreparing a claim it does not know is an error;
* ``health-unlisted``: serves its health stream but lists no health service in GetInfo (a 1.37 kubelet ignores it);
* ``first-request-only``: prepares only the devices of a claim's first request;
* ``no-request-names``: answers its devices without the requests they were allocated for;
* ``unprepare-per-device``: keeps its preparations per device, so unpreparing a claim (an admin-access one beside
  a user's) also drops every other claim's preparation of its devices and their CDI spec files;
* ``keep-specs``: unprepares a claim without removing the CDI spec file its prepare wrote;
* ``sub-request-names``: names a device allocated for a prioritized list's sub-request (``gpu/one``) by that, not
  by the request a container names (``gpu``; the kubeletplugin library strips the sub-request, as the kubelet needs);
* ``forget-on-restart``: unprepares only the claims it prepared since it started (no checkpoint read back);
* ``spec-in-subdir``: writes its CDI specs in a subdirectory of the CDI root, which no runtime reads;
* ``no-reuse``: marks a prepared device in use and never frees it at unprepare, so a later claim for it fails;
* ``taint-effect-none`` (health by taints): taints an Unhealthy device with effect ``None``, which keeps no claim off;
* ``taint-every-device`` (health by taints): taints every device once one is Unhealthy;
* ``reboot-loses-spec``: keeps its prepared claims in a checkpoint (``<plugins>/<driver>/checkpoint.json``) and
  answers a claim found there without writing its CDI spec again, so after a reboot emptied ``/var/run/cdi`` the
  container's CDI devices resolve nowhere (dra-example-driver up to v0.4.0, kubernetes/kubernetes#141433);
* ``status-replaces`` (writes device status as ``--device-status`` does): sets the claim's ``status.devices``
  to its own entries, dropping what others wrote there (dra-example-driver v0.4.0 with ``--gpu-device-status``);
* ``stale-after-update``: once it updated its slice in place (putting back devices someone removed), a deletion
  within the next minute loses the slice for good, as upstream's ``kubeletplugin`` up to v0.37 does
  (kubernetes/kubernetes#140011).

Its slice holds its devices: one edited by someone else is put back in place.

``--device-status`` writes each prepared device's data (``{"name": ...}``) into its entry of the claim's
``status.devices``, keeping the rest of the entry and every other entry.
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
import kubernetes

from pytest_devplug.api.dra import v1_pb2 as pb
from pytest_devplug.api.dra import v1_pb2_grpc as pbg
from pytest_devplug.api.drahealth import v1alpha1_pb2 as hpb
from pytest_devplug.api.drahealth import v1alpha1_pb2_grpc as hpbg
from pytest_devplug.api.pluginregistration import v1_pb2 as rpb
from pytest_devplug.api.pluginregistration import v1_pb2_grpc as rpbg

parser = argparse.ArgumentParser()
parser.add_argument("--driver-name", default="dra.devplug.example")
parser.add_argument("--registry-dir", default="/var/lib/kubelet/plugins_registry")
parser.add_argument("--plugins-dir", default="/var/lib/kubelet/plugins")
parser.add_argument("--cdi-root", default="/var/run/cdi")
parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""))
parser.add_argument("--kubeconfig", default="")
parser.add_argument("--devices", type=int, default=3)
parser.add_argument("--control", default="")
parser.add_argument(
    "--break",
    dest="broken",
    default="none",
    choices=[
        "none",
        "prepare-not-idempotent",
        "wrong-device",
        "no-republish",
        "exit-on-refusal",
        "unprepare-unknown-fails",
        "health-unlisted",
        "first-request-only",
        "no-request-names",
        "sub-request-names",
        "unprepare-per-device",
        "keep-specs",
        "forget-on-restart",
        "spec-in-subdir",
        "reboot-loses-spec",
        "no-reuse",
        "taint-effect-none",
        "taint-every-device",
        "status-replaces",
        "stale-after-update",
    ],
)
parser.add_argument("--device-status", action="store_true")
parser.add_argument("--health", choices=["stream", "taints"], default="stream")
args = parser.parse_args()
TAINTS = args.health == "taints" or args.broken.startswith("taint-")
if not args.node_name:
    sys.exit("dra-widget: --node-name or NODE_NAME is required")

DRIVER, NODE = args.driver_name, args.node_name
VENDOR = "devplug.example/widget"
DEVICES = [f"w-{hashlib.sha256(f'{NODE}/{i}'.encode()).hexdigest()[:10]}" for i in range(args.devices)]
SLICE = f"{NODE}-{DRIVER.replace('.', '-')}"
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())

if args.kubeconfig:
    kubernetes.config.load_kube_config(config_file=args.kubeconfig)
else:
    kubernetes.config.load_incluster_config()
api = kubernetes.client.ApiClient()


def request(method, path, body=None):
    m, url, headers, data, _ = api.param_serialize(
        method,
        path,
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(m, url, header_params=headers, body=data, _request_timeout=10)
    raw = resp.read()
    if not 200 <= resp.status < 300:
        raise RuntimeError(f"{method} {path}: {resp.status} {raw[:300]!r}")
    return json.loads(raw) if raw else {}


def control():
    try:
        with open(args.control) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def log(message):
    print(f"dra-widget: {message}", file=sys.stderr, flush=True)


# -- ResourceSlice ------------------------------------------------------------------------------


def slice_body():
    devices = [{"name": d, "attributes": {"index": {"int": i}}} for i, d in enumerate(DEVICES)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": SLICE},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def wanted_taints():
    """device -> taint effect, from the control file's Unhealthy devices (--health taints)."""
    bad = set(control().get("unhealthy") or [])
    effect = "None" if args.broken == "taint-effect-none" else "NoSchedule"
    return {d: effect for d in (DEVICES if bad and args.broken == "taint-every-device" else sorted(bad))}


def retaint(obj):
    """Put the wanted taints on the slice's devices when they differ from what it has."""
    want = wanted_taints()
    have = {d["name"]: (d.get("taints") or [{}])[0].get("effect") for d in obj["spec"]["devices"] if d.get("taints")}
    if have == want:
        return
    for d in obj["spec"]["devices"]:
        d.pop("taints", None)
        if d["name"] in want:
            d["taints"] = [
                {
                    "key": f"{DRIVER}/unhealthy",
                    "value": "true",
                    "effect": want[d["name"]],
                    "timeAdded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            ]
    request("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{SLICE}", obj)
    log(f"tainted {sorted(want)}")


def correct(obj):
    """Put back the devices someone else removed from (or added to) the slice, in place; returns whether it did."""
    if sorted(d["name"] for d in obj["spec"].get("devices") or []) == sorted(DEVICES):
        return False
    body = slice_body()
    body["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
    request("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{SLICE}", body)
    log(f"updated {SLICE}: its devices were edited")
    return True


def publish_loop():
    published = False
    updated_at = None  # stale-after-update: when it last updated its slice in place
    lost = False  # stale-after-update: a deletion came within a minute of that update
    while not stop.is_set():
        try:
            obj = request("GET", f"/apis/resource.k8s.io/v1/resourceslices/{SLICE}")
            published = True
            if correct(obj):
                updated_at = time.monotonic()
            elif TAINTS:
                retaint(obj)
        except RuntimeError as exc:
            gone = " 404 " in str(exc)
            if gone and args.broken == "stale-after-update" and updated_at is not None:
                lost = lost or time.monotonic() - updated_at < 60.0
            if not gone:
                log(f"reading my slice: {exc}")
            elif not (published and args.broken == "no-republish") and not lost:
                try:
                    request("POST", "/apis/resource.k8s.io/v1/resourceslices", slice_body())
                    log(f"published {SLICE} with {len(DEVICES)} devices")
                    published = True
                except RuntimeError as err:
                    log(f"publishing: {err}")
        stop.wait(0.3)


# -- DRA service --------------------------------------------------------------------------------

prepared = {}  # claim uid -> [pb.Device]
in_use = {}  # no-reuse: device name -> the claim uid that prepared it
lock = threading.Lock()
serial = [0]
CHECKPOINT = os.path.join(args.plugins_dir, DRIVER, "checkpoint.json")


def load_checkpoint():
    """reboot-loses-spec: the claims prepared before this process started, as they were answered."""
    try:
        with open(CHECKPOINT) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return
    for uid, devices in saved.items():
        prepared[uid] = [
            pb.Device(
                request_names=d["requests"], pool_name=d["pool"], device_name=d["device"], cdi_device_ids=d["cdi"]
            )
            for d in devices
        ]


def save_checkpoint():
    if args.broken != "reboot-loses-spec":
        return
    doc = {
        uid: [
            {
                "requests": list(d.request_names),
                "pool": d.pool_name,
                "device": d.device_name,
                "cdi": list(d.cdi_device_ids),
            }
            for d in devices
        ]
        for uid, devices in prepared.items()
    }
    tmp = CHECKPOINT + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, CHECKPOINT)


def cdi_spec_path(uid):
    root = os.path.join(args.cdi_root, "widget") if args.broken == "spec-in-subdir" else args.cdi_root
    return os.path.join(root, f"devplug-widget-{uid}.json")


def write_device_status(claim, results):
    """Each device's data in its ``status.devices`` entry, merged into what is there (``status-replaces``: the list
    set to its own entries); a conflict reads the claim again."""
    path = f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
    keys = ("driver", "pool", "device", "shareID")
    for _ in range(5):
        obj = request("GET", path)
        entries = [] if args.broken == "status-replaces" else list((obj.get("status") or {}).get("devices") or [])
        for r in results:
            own = {k: r[k] for k in keys if k in r}
            entry = next((e for e in entries if all(e.get(k) == own.get(k) for k in keys)), None)
            if entry is None:
                entry = dict(own)
                entries.append(entry)
            entry["data"] = {"name": r["device"]}
        obj.setdefault("status", {})["devices"] = entries
        try:
            request("PUT", f"{path}/status", obj)
            return
        except RuntimeError as exc:
            if ": 409 " not in str(exc):
                raise
    raise RuntimeError(f"claim {claim.namespace}/{claim.name}: status.devices kept conflicting")


def prepare(claim):
    if control().get("fail_prepare"):
        raise RuntimeError("preparation failed on purpose (control file)")
    with lock:
        if claim.uid in prepared and args.broken != "prepare-not-idempotent":
            return prepared[claim.uid]
        obj = request("GET", f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}")
        if obj["metadata"]["uid"] != claim.uid:
            raise RuntimeError(
                f"claim {claim.namespace}/{claim.name} has uid {obj['metadata']['uid']}, not {claim.uid}"
            )
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise RuntimeError(f"claim {claim.namespace}/{claim.name} is not allocated")
        serial[0] += 1
        devices, cdi_devices = [], []
        results = allocation["devices"]["results"]
        for r in results:
            if r["driver"] != DRIVER:
                continue
            if args.broken == "first-request-only" and r["request"] != results[0]["request"]:
                continue
            name = r["device"]
            if args.broken == "no-reuse":
                if in_use.setdefault(name, claim.uid) != claim.uid:
                    raise RuntimeError(f"device {name} is in use by claim {in_use[name]}")
            if args.broken == "wrong-device":
                name = next(d for d in DEVICES if d != name)
            cdi_name = f"{claim.uid}-{name}" + (f"-{serial[0]}" if args.broken == "prepare-not-idempotent" else "")
            cdi_devices.append({"name": cdi_name, "containerEdits": {"env": [f"WIDGET_{DEVICES.index(name)}={name}"]}})
            request_name = r["request"] if args.broken == "sub-request-names" else r["request"].split("/", 1)[0]
            names = [] if args.broken == "no-request-names" else [request_name]
            devices.append(
                pb.Device(
                    request_names=names, pool_name=r["pool"], device_name=name, cdi_device_ids=[f"{VENDOR}={cdi_name}"]
                )
            )
        if args.device_status or args.broken == "status-replaces":
            write_device_status(claim, [r for r in results if r["driver"] == DRIVER])
        os.makedirs(os.path.dirname(cdi_spec_path(claim.uid)), exist_ok=True)
        tmp = cdi_spec_path(claim.uid) + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"cdiVersion": "0.6.0", "kind": VENDOR, "devices": cdi_devices}, f)
        os.replace(tmp, cdi_spec_path(claim.uid))
        prepared[claim.uid] = devices
        save_checkpoint()
        return devices


class DRA(pbg.DRAPluginServicer):
    def NodePrepareResources(self, request_, context):
        resp = pb.NodePrepareResourcesResponse()
        for claim in request_.claims:
            try:
                for d in prepare(claim):
                    resp.claims[claim.uid].devices.append(d)
                resp.claims[claim.uid].SetInParent()
            except Exception as exc:  # noqa: BLE001 - reported per claim, as kubeletplugin does
                resp.claims[claim.uid].error = str(exc)
        return resp

    def NodeUnprepareResources(self, request_, context):
        resp = pb.NodeUnprepareResourcesResponse()
        for claim in request_.claims:
            if control().get("fail_unprepare"):
                resp.claims[claim.uid].error = "unpreparation failed on purpose (control file)"
                continue
            with lock:
                if claim.uid not in prepared and args.broken == "unprepare-unknown-fails":
                    resp.claims[claim.uid].error = f"claim {claim.uid} is not prepared"
                    continue
                gone = prepared.pop(claim.uid, None)
                known = gone is not None
                if gone and args.broken == "unprepare-per-device":
                    names = {d.device_name for d in gone}
                    for other in [u for u, devs in prepared.items() if names & {d.device_name for d in devs}]:
                        del prepared[other]
                        os.unlink(cdi_spec_path(other))
                save_checkpoint()
                if not known and args.broken == "forget-on-restart":
                    resp.claims[claim.uid].SetInParent()
                    continue
                try:
                    if args.broken != "keep-specs":
                        os.unlink(cdi_spec_path(claim.uid))
                except FileNotFoundError:
                    pass
            resp.claims[claim.uid].SetInParent()
        return resp


class Health(hpbg.DRAResourceHealthServicer):
    def NodeWatchResources(self, request_, context):
        last = None
        while context.is_active() and not stop.is_set():
            bad = set(control().get("unhealthy") or [])
            now = [(d, hpb.UNHEALTHY if d in bad else hpb.HEALTHY) for d in DEVICES]
            if now != last:
                yield hpb.NodeWatchResourcesResponse(
                    devices=[
                        hpb.DeviceHealth(
                            device=hpb.DeviceIdentifier(pool_name=NODE, device_name=d),
                            health=h,
                            last_updated_time=int(time.time()),
                        )
                        for d, h in now
                    ]
                )
                last = now
            stop.wait(0.1)


class Registration(rpbg.RegistrationServicer):
    def __init__(self, endpoint):
        self.endpoint = endpoint

    def GetInfo(self, request_, context):
        services = (
            ["v1.DRAPlugin"]
            if args.broken == "health-unlisted" or TAINTS
            else ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
        )
        return rpb.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=self.endpoint, supported_versions=services)

    def NotifyRegistrationStatus(self, request_, context):
        if request_.plugin_registered:
            log("registered with the kubelet")
        else:
            log(f"registration refused: {request_.error}")
            if args.broken == "exit-on-refusal":
                os._exit(4)
        return rpb.RegistrationStatusResponse()


def main():
    sock_dir = os.path.join(args.plugins_dir, DRIVER)
    os.makedirs(sock_dir, exist_ok=True)
    os.makedirs(args.registry_dir, exist_ok=True)
    if args.broken == "reboot-loses-spec":
        load_checkpoint()
    dra_sock = os.path.join(sock_dir, "dra.sock")
    reg_sock = os.path.join(args.registry_dir, f"{DRIVER}-reg.sock")
    for path in (dra_sock, reg_sock):
        try:
            os.unlink(path)  # left by a killed predecessor
        except FileNotFoundError:
            pass
    dra = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pbg.add_DRAPluginServicer_to_server(DRA(), dra)
    if not TAINTS:
        hpbg.add_DRAResourceHealthServicer_to_server(Health(), dra)
    dra.add_insecure_port(f"unix://{dra_sock}")
    dra.start()
    threading.Thread(target=publish_loop, daemon=True).start()
    reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpbg.add_RegistrationServicer_to_server(Registration(dra_sock), reg)
    reg.add_insecure_port(f"unix://{reg_sock}")
    reg.start()
    log(f"serving {DRIVER} on {dra_sock}, registration on {reg_sock}")
    stop.wait()
    reg.stop(grace=None)
    for path in (reg_sock, dra_sock):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    dra.stop(grace=None)


main()
