"""How the embedded kubelet opens a gRPC channel to a plugin's or driver's Unix socket.

As the kubelet's ``grpc.Dial``/``grpc.NewClient`` does, every channel gets a connection of its own: gRPC Python's
channels otherwise share one subchannel per address across the process, so a new dial of a socket would inherit an
earlier channel's connection to it, and its reconnect back-off after that plugin went away.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

__all__ = ["plugin_channel"]


def plugin_channel(socket: str | Path) -> Any:
    """A new channel to ``unix://socket`` with its own subchannel (``:authority`` localhost, as Go's dialer)."""
    return grpc.insecure_channel(
        f"unix://{socket}", options=[("grpc.default_authority", "localhost"), ("grpc.use_local_subchannel_pool", 1)]
    )
