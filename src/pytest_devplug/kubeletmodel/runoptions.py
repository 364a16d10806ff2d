"""The kubelet's merge of a container's Allocate responses into what the runtime applies.

Upstream ``podDevices.deviceRunContainerOptions`` (``pkg/kubelet/cm/devicemanager/pod_devices.go``):
over the responses of every resource of the container, the first env var, device node (by container
path), mount (by container path) and annotation wins, a later one is skipped (a different value is
logged as a conflict); CDI device names are de-duplicated. So two device IDs sharing one ``/dev``
node (time-slicing replicas) reach the container as one device node. Both backends' views of a
container come from here: the sim's runtime record and the kind backend's checkpoint-derived view.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.kubeletmodel.views import ContainerRuntimeOptions, DeviceNodeSpec, MountSpec

__all__ = ["run_container_options"]


def run_container_options(
    responses: Iterable[pb.ContainerAllocateResponse], log: logging.Logger | None = None
) -> ContainerRuntimeOptions:
    """Merge ``responses`` (one per resource, in the kubelet's order) as the kubelet does."""
    opts = ContainerRuntimeOptions()
    devs: dict[str, str] = {}
    mounts: dict[str, str] = {}
    cdi: set[str] = set()
    for resp in responses:
        for k, v in sorted(resp.envs.items()):
            if k in opts.envs:
                if opts.envs[k] != v and log is not None:
                    log.error("Environment variable has conflicting setting envKey=%s expected=%s got=%s", k, v, opts.envs[k])
                continue
            opts.envs[k] = v
        for dev in resp.devices:
            if dev.container_path in devs:
                if devs[dev.container_path] != dev.host_path and log is not None:
                    log.error(
                        "Container device has conflicting mapping host devices containerPath=%s got=%s expected=%s",
                        dev.container_path, devs[dev.container_path], dev.host_path,
                    )  # fmt: skip
                continue
            devs[dev.container_path] = dev.host_path
            opts.devices.append(DeviceNodeSpec(dev.container_path, dev.host_path, dev.permissions))
        for m in resp.mounts:
            if m.container_path in mounts:
                if mounts[m.container_path] != m.host_path and log is not None:
                    log.error(
                        "Container mount has conflicting mapping host mounts containerPath=%s conflictingPath=%s hostPath=%s",
                        m.container_path, mounts[m.container_path], m.host_path,
                    )  # fmt: skip
                continue
            mounts[m.container_path] = m.host_path
            opts.mounts.append(MountSpec(m.container_path, m.host_path, m.read_only))
        for k, v in sorted(resp.annotations.items()):
            if k in opts.annotations:
                if opts.annotations[k] != v and log is not None:
                    log.error("Annotation has conflicting setting annotationKey=%s expected=%s got=%s", k, opts.annotations[k], v)
                continue
            opts.annotations[k] = v
        for c in resp.cdi_devices:
            if c.name not in cdi:
                cdi.add(c.name)
                opts.cdi_devices.append(c.name)
    return opts
