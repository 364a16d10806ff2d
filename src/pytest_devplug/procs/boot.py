"""The machine boot a node's processes see: a boot ID of the node's own and an uptime counted from the node's boot.

Drivers tell a node reboot from a restart of their own by the kernel's boot ID: NVIDIA's DRA driver keeps it in
its checkpoint and, when ``/proc/sys/kernel/random/boot_id`` reads otherwise at start, drops the checkpoint and
prepares every claim afresh (``pkg/bootid``, ``cmd/gpu-kubelet-plugin/device_state.go``, v0.4.0). A simulated reboot
must therefore change it, and only for that node: the launcher binds :attr:`NodeBoot.id_file` over the boot ID
(``launcher.BOOT_ID_PATH``) in
the process's private mount namespace and starts ``CLOCK_BOOTTIME`` (so ``/proc/uptime``) at :attr:`NodeBoot.origin`
in a time namespace of its own.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

__all__ = ["NodeBoot"]


class NodeBoot:
    """One node's boot: its boot ID file and when it booted (the host's ``CLOCK_BOOTTIME`` seconds)."""

    def __init__(self, id_file: Path) -> None:
        self.id_file = Path(id_file)
        self.origin = 0.0
        self.renew()

    @property
    def boot_id(self) -> str:
        return self.id_file.read_text().strip()

    def renew(self) -> None:
        """The node booted (again): a new boot ID, uptime from now. The file is rewritten in place, so a bind
        mount of it (which follows the inode) shows the new ID to processes started after the reboot."""
        self.id_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.id_file, "w") as f:
            f.write(f"{uuid.uuid4()}\n")
        self.origin = time.clock_gettime(time.CLOCK_BOOTTIME)
