"""``pluginregistration.Registration`` on ``<driver>-reg.sock``: what the kubelet's plugin watcher asks.

``GetInfo`` names the plugin type ``DRAPlugin``, the driver, the DRA socket (a path the kubelet can open)
and the services that socket serves, newest first, as the Go helper lists them (the kubelet picks the
first DRA service it supports). ``NotifyRegistrationStatus`` is the kubelet's verdict; a refusal is
logged with the kubelet's reason and, as in the Go helper, answered with an error.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from ..api.pluginregistration import v1_pb2 as rpb
from ..api.pluginregistration import v1_pb2_grpc as rpb_grpc

__all__ = ["PLUGIN_TYPE", "SUPPORTED_SERVICES", "RegistrationService"]

log = logging.getLogger("devplug_gpu_plugin.dra.registration")

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


class RegistrationService(rpb_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self._lock = threading.Lock()
        self._status: rpb.RegistrationStatus | None = None

    @property
    def status(self) -> rpb.RegistrationStatus | None:
        """The kubelet's last verdict; None before the first."""
        with self._lock:
            return self._status

    def GetInfo(self, request: rpb.InfoRequest, context: Any) -> rpb.PluginInfo:
        return rpb.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint, supported_versions=SUPPORTED_SERVICES
        )

    def NotifyRegistrationStatus(self, request: rpb.RegistrationStatus, context: Any) -> rpb.RegistrationStatusResponse:
        with self._lock:
            self._status = request
        if not request.plugin_registered:
            log.error("registration refused by the kubelet: %s", request.error)
            context.abort(grpc.StatusCode.UNKNOWN, f"failed registration process: {request.error}")
        log.info("registered with the kubelet as %s (endpoint %s)", self.driver, self.endpoint)
        return rpb.RegistrationStatusResponse()
