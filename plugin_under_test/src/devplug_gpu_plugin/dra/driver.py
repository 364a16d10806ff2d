"""``devplug-gpu-plugin --dra``: the DRA kubelet plugin wired from the shared inventory and health loop.

The same :class:`~devplug_gpu_plugin.devices.DeviceState` the device plugin streams feeds the node's
ResourceSlice (:mod:`.slices`), ``NodePrepareResources`` (:mod:`.service`) and the health stream
(:mod:`.health`); :mod:`.server` serves the sockets at the Go helper's paths:
``<registrar dir>/<driver>-reg.sock`` and ``<plugins dir>/<driver>/dra.sock``.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..allocation import ensure_dev_nodes
from ..api.dra import v1_pb2_grpc as pb_grpc
from ..api.dra import v1beta1_pb2_grpc as pb_beta_grpc
from ..api.drahealth import v1_pb2_grpc as hpb1_grpc
from ..api.drahealth import v1alpha1_pb2_grpc as hpb_grpc
from ..api.pluginregistration import v1_pb2_grpc as rpb_grpc
from ..devices import DeviceState
from .cdi import CdiLayout
from .health import V1, HealthService
from .kubeapi import KubeApi
from .prepare import PreparedClaim
from .registration import RegistrationService
from .server import DriverServer, Socket
from .service import DraService, DraServiceV1beta1
from .slices import SlicePublisher, slice_devices
from .status import report_device_status

__all__ = ["DRA_SOCKET", "Driver", "registration_socket"]

log = logging.getLogger("devplug_gpu_plugin.dra")

DRA_SOCKET = "dra.sock"


def registration_socket(registrar_dir: str, driver: str) -> str:
    return os.path.join(registrar_dir, f"{driver}-reg.sock")


class Driver:
    """One driver process's parts; :meth:`run` blocks until :meth:`request_stop`."""

    def __init__(
        self,
        args: argparse.Namespace,
        api: KubeApi,
        state: DeviceState,
        fault: Callable[[str], str | None] | None,
        stopping: threading.Event,
    ) -> None:
        self.args = args
        self.state = state
        node, driver = args.node_name, args.driver_name
        self.dra_path = os.path.join(args.kubelet_plugins_dir, driver, DRA_SOCKET)
        layout = CdiLayout(driver, args.cdi_root, args.dev_root, args.driver_lib_dir)
        self.publisher = SlicePublisher(api, driver, node, lambda: slice_devices(state.snapshot().gpus))
        self.registration = RegistrationService(driver, self.dra_path)

        def report(claim: Mapping[str, Any], prepared: PreparedClaim) -> bool:
            return report_device_status(api, claim, driver, prepared)

        dra = DraService(api, state, layout, node, fault, report=report if args.device_status else None)
        health = HealthService(state, node, stopping)
        health_v1 = HealthService(state, node, stopping, api=V1)

        def dra_services(server: Any) -> None:
            pb_grpc.add_DRAPluginServicer_to_server(dra, server)  # type: ignore[no-untyped-call]
            pb_beta_grpc.add_DRAPluginServicer_to_server(DraServiceV1beta1(dra), server)  # type: ignore[no-untyped-call]
            hpb_grpc.add_DRAResourceHealthServicer_to_server(health, server)  # type: ignore[no-untyped-call]
            hpb1_grpc.add_DRAResourceHealthServicer_to_server(health_v1, server)  # type: ignore[no-untyped-call]

        def registration_services(server: Any) -> None:
            rpb_grpc.add_RegistrationServicer_to_server(self.registration, server)  # type: ignore[no-untyped-call]

        self.server = DriverServer(
            [
                Socket(self.dra_path, "DRA", dra_services),
                Socket(registration_socket(args.kubelet_registrar_dir, driver), "registration", registration_services),
            ],
            stopping,
        )

    def on_change(self) -> None:
        """The inventory changed: stand-in device nodes (mock nodes), then the slice."""
        if self.args.create_dev_nodes:
            try:
                ensure_dev_nodes(self.args.dev_root, [g.info.minor for g in self.state.snapshot().gpus])
            except OSError as exc:
                log.error("cannot create device nodes: %s", exc)
        self.publisher.devices_changed()

    def run(self) -> None:
        log.info("DRA driver %s on node %s", self.args.driver_name, self.args.node_name)
        os.makedirs(self.args.cdi_root, exist_ok=True)
        self.publisher.start()
        self.server.run()

    def request_stop(self) -> None:
        self.server.request_stop()

    def stop(self) -> None:
        self.server.stop()
        self.publisher.stop()
