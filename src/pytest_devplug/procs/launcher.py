"""Starts one plugin process: parent-death signal, and optionally the node's private mount namespace.

Run as ``python launcher.py [--parent PID] [--scratch DIR --bind SRC DST...] -- ARGV...`` (by file path,
so that starting a plugin imports nothing but the standard library); it replaces itself with ``ARGV``.

* ``--parent PID``: the plugin gets SIGKILL when the thread that started it dies, so a killed test
  run leaves no plugin behind; if ``PID`` is already gone the launcher exits instead of starting it.
* ``--boot-id FILE``: in the namespace, ``FILE`` is bound over the kernel's boot ID (the node's own); where that
  bind fails the host's stays, said on stderr (the plugin log), and the plugin starts all the same.
* ``--boottime-origin SECONDS``: in the namespace, a time namespace of the process's own whose ``CLOCK_BOOTTIME``
  (so ``/proc/uptime``) counts from the host's ``SECONDS``: the node's boot (:mod:`~pytest_devplug.procs.boot`).
  A kernel without time namespaces (before 5.6) keeps the host's uptime, said on stderr (the plugin log).
* ``--bind SRC DST``: before the exec, the process enters a private mount namespace in which each
  ``SRC`` directory (or file: a stub device node such as ``/dev/nvidia0``) is bind-mounted at ``DST``; nobody
  outside sees these mounts, so each node's
  plugin finds *its* node's directories at the kubelet's standard paths
  (:data:`KUBELET_PATHS`). Root unshares the mount namespace directly; anyone else goes through an
  unprivileged user namespace (uid and gid mapped to themselves). ``/var/lib/kubelet`` is covered by
  a tmpfs first when a ``DST`` lies below it, so the host's kubelet files stay out of sight. Missing
  mount points are made without touching the host: the first missing directory's parent is shadowed
  by a tmpfs (made under ``--scratch DIR``) holding bind mounts of all of its entries plus the new
  directory (for a new directory at the top, such a layer becomes the process's root).

Exit status 126 with a message on stderr (the plugin log) when the namespace cannot be made, 127
when ``ARGV[0]`` cannot be executed. ``--probe`` makes the namespace and exits 0 without a command.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BOOT_ID_PATH",
    "KUBELET_PATHS",
    "NamespaceError",
    "enter_namespace",
    "enter_network_namespace",
    "enter_time_namespace",
    "main",
    "NO_NAMESPACE_HELP",
    "path_in_node",
]

#: A node's directory name -> where a kubelet on that node keeps it (``pkg/kubelet/apis``:
#: ``DevicePluginPath``, ``podresources`` socket dir; the plugin watcher's ``plugins_registry`` and the
#: plugins' own ``plugins`` dir, DRA drivers' sockets) and where a CDI-enabled runtime reads specs
#: (``/etc/cdi``, then ``/var/run/cdi``, which wins).
KUBELET_PATHS = {
    "device-plugins": "/var/lib/kubelet/device-plugins",
    "pod-resources": "/var/lib/kubelet/pod-resources",
    "plugins_registry": "/var/lib/kubelet/plugins_registry",
    "plugins": "/var/lib/kubelet/plugins",
    "cdi": "/var/run/cdi",
    "etc-cdi": "/etc/cdi",
}


def path_in_node(path: str, dirs: Mapping[str, Path]) -> Path:
    """The host path of ``path`` as a plugin in the node's namespace names it: ``dirs`` maps a standard path (a value
    of :data:`KUBELET_PATHS`) to the node's directory; any other path is the host's own."""
    for prefix, local in dirs.items():
        if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
            return local / path[len(prefix.rstrip("/")) + 1 :]
    return Path(path)


#: Where Linux shows the boot ID, a random UUID made at each boot (``random(4)``).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

#: Where the host's kubelet files are hidden behind a tmpfs inside the namespace.
_KUBELET_ROOT = "/var/lib/kubelet"

NO_NAMESPACE_HELP = (
    "a plugin command without {plugin_dir} runs in a private mount namespace with the node's directories at "
    "the kubelet's standard paths, which needs either root or unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in a container, one that "
    "allows unshare). Either run the tests as root / enable user namespaces, or pass the directory with a "
    "flag: put {plugin_dir} in the plugin command"
)

_CLONE_NEWNS = 0x00020000
_CLONE_NEWTIME = 0x00000080
_CLONE_NEWUSER = 0x10000000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class NamespaceError(Exception):
    """The private mount namespace could not be made (no root, no user namespaces, a failed mount)."""


class MountError(NamespaceError):
    """The namespace was made, but a mount in it failed: no permission problem, so no advice about one."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise NamespaceError(f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def b(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    if _libc.mount(b(src), b(target), b(fstype), ctypes.c_ulong(flags), b(data)) != 0:
        raise MountError(f"mount {src or fstype} on {target}: {os.strerror(ctypes.get_errno())}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _unshare() -> None:
    """A new mount namespace; through a user namespace mapping us to ourselves when root cannot do it."""
    if not hasattr(_libc, "unshare"):
        raise NamespaceError(f"mount namespaces are Linux-only (this is {sys.platform})")
    if os.geteuid() == 0 and _libc.unshare(_CLONE_NEWNS) == 0:
        return
    root_errno = ctypes.get_errno() if os.geteuid() == 0 else None
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        detail = f"unshare(CLONE_NEWUSER|CLONE_NEWNS) as uid {uid}: {os.strerror(err)}"
        if root_errno is not None:
            detail = f"unshare(CLONE_NEWNS) as root: {os.strerror(root_errno)}; {detail}"
        raise NamespaceError(detail)
    try:
        _write("/proc/self/setgroups", "deny")
    except FileNotFoundError:
        pass  # kernels before 3.19
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


class _Mounter:
    """Makes mount points inside the namespace without writing to the host: a directory is created
    only inside a tmpfs of ours; a missing one under a host directory gets that directory shadowed."""

    def __init__(self, scratch: str) -> None:
        self.scratch = scratch
        self.ours: set[str] = set()  # directories inside tmpfs mounts made here (safe to mkdir in)
        self.serial = 0
        _mount("tmpfs", scratch, "tmpfs", 0, "mode=700")

    def tmpfs(self, path: str) -> None:
        _mount("tmpfs", path, "tmpfs", 0, "mode=755")
        self.ours.add(path)

    def ensure_dir(self, path: str) -> None:
        if os.path.isdir(path):
            return
        parent, child = os.path.split(path)
        self.ensure_dir(parent)
        if parent in self.ours:
            os.mkdir(path)
        else:
            self._shadow(parent, child)
        self.ours.add(path)

    def ensure_file(self, path: str) -> None:
        """A file to bind a file over (e.g. ``/dev/nvidia0`` in ``/dev``), made inside a layer of ours."""
        if os.path.lexists(path):
            return
        parent, child = os.path.split(path)
        self.ensure_dir(parent)
        if parent in self.ours:
            open(path, "w").close()
        else:
            self._shadow(parent, child, is_file=True)

    def _shadow(self, parent: str, new_child: str, *, is_file: bool = False) -> None:
        """A tmpfs holding bind mounts of every entry of ``parent`` plus ``new_child`` goes over ``parent``."""
        self.serial += 1
        layer = os.path.join(self.scratch, str(self.serial))
        os.mkdir(layer)
        _mount("tmpfs", layer, "tmpfs", 0, "mode=755")
        for name in os.listdir(parent):
            src, dst = os.path.join(parent, name), os.path.join(layer, name)
            try:
                st = os.lstat(src)
            except FileNotFoundError:
                continue  # gone meanwhile
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dst)
                continue
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(dst)
            else:
                open(dst, "w").close()
            _mount(src, dst, None, _MS_BIND | _MS_REC)
        if is_file:
            open(os.path.join(layer, new_child), "w").close()
        else:
            os.mkdir(os.path.join(layer, new_child))
        if parent == "/":
            # A mount over "/" is not seen by this process, whose root stays the old one: the layer becomes the
            # root instead (a new top-level directory such as /driver-root, as a container's image has one).
            os.chroot(layer)
            os.chdir("/")
        else:
            _mount(layer, parent, None, _MS_BIND | _MS_REC)
        self.ours.add(parent)


def enter_namespace(binds: Sequence[tuple[str, str]], scratch: str) -> None:
    """Enter a private mount namespace where each ``(src, dst)`` directory is bind-mounted at ``dst``.

    ``scratch`` is an existing directory of ours; inside the namespace a tmpfs covers it and holds the
    layers that create missing mount points.
    """
    _unshare()
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    if not binds:
        return
    mounter = _Mounter(scratch)
    targets = [(src, os.path.realpath(dst)) for src, dst in binds]
    kubelet_root = os.path.realpath(_KUBELET_ROOT)
    if any(dst == kubelet_root or dst.startswith(kubelet_root + "/") for _, dst in targets):
        mounter.ensure_dir(kubelet_root)
        mounter.tmpfs(kubelet_root)
    for src, dst in targets:
        if os.path.isdir(src):
            mounter.ensure_dir(dst)
        else:
            mounter.ensure_file(dst)
        _mount(src, dst, None, _MS_BIND | _MS_REC)


def enter_time_namespace(origin: float) -> None:
    """A new time namespace whose ``CLOCK_BOOTTIME`` reads 0 at the host's ``origin``; the offsets must be written
    before a process enters it, and ``setns`` moves this (single-threaded) process in, not only its children."""
    _check(_libc.unshare(_CLONE_NEWTIME), "unshare(CLONE_NEWTIME)")
    whole = int(origin // 1)
    nanos = int(round((origin - whole) * 1e9))
    secs, nanos = (-whole, 0) if nanos == 0 else (-whole - 1, 1_000_000_000 - nanos)
    _write("/proc/self/timens_offsets", f"boottime {secs} {nanos}")
    fd = os.open("/proc/self/ns/time_for_children", os.O_RDONLY)
    try:
        _check(_libc.setns(fd, _CLONE_NEWTIME), "setns(time_for_children)")
    finally:
        os.close(fd)


_CLONE_NEWNET = 0x40000000
_TUNSETIFF, _TUNSETPERSIST = 0x400454CA, 0x400454CB
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _SIOCSIFHWADDR = 0x8913, 0x8914, 0x8924
_IFF_UP, _IFF_TAP, _IFF_NO_PI, _ARPHRD_ETHER = 0x1, 0x0002, 0x1000, 1


def _link_up(sock: Any, name: str) -> None:
    import fcntl
    import struct

    flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, struct.pack("16sH14x", name.encode(), 0)))[1]
    fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", name.encode(), flags | _IFF_UP))


def enter_network_namespace(netdevs: Sequence[tuple[str, str]]) -> None:
    """A network namespace of the plugin's own holding a tap link per ``(name, MAC)``, up, and ``lo``: what netlink
    shows a network device plugin of its node's netdevs. Taps (not dummies, not VFs): this kernel has them everywhere.
    The namespace, and the links with it, go when the plugin's last process exits."""
    import fcntl
    import socket
    import struct

    _check(_libc.unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _link_up(sock, "lo")
        for name, mac in netdevs:
            fd = os.open("/dev/net/tun", os.O_RDWR)
            try:
                fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TAP | _IFF_NO_PI))
                fcntl.ioctl(fd, _TUNSETPERSIST, 1)
            finally:
                os.close(fd)
            if mac:
                fcntl.ioctl(
                    sock,
                    _SIOCSIFHWADDR,
                    struct.pack("16sH6s8x", name.encode(), _ARPHRD_ETHER, bytes.fromhex(mac.replace(":", ""))),
                )
            _link_up(sock, name)


def _set_parent_death_signal(parent: int) -> None:
    if not hasattr(_libc, "prctl"):
        return  # not Linux: no parent-death signal; the run's signal handlers and atexit still stop plugins
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent:
        os._exit(0)  # the test run died before the signal was armed: start nothing


def main(args: Sequence[str]) -> int:
    args = list(args)
    if "--" in args:
        cut = args.index("--")
        opts, argv = args[:cut], args[cut + 1 :]
    else:
        opts, argv = args, []
    parent: int | None = None
    binds: list[tuple[str, str]] = []
    scratch = ""
    probe = False
    netdevs: list[tuple[str, str]] = []
    origin: float | None = None
    boot_id = ""
    i = 0
    while i < len(opts):
        opt = opts[i]
        if opt == "--parent":
            parent, i = int(opts[i + 1]), i + 2
        elif opt == "--bind":
            binds.append((opts[i + 1], opts[i + 2]))
            i += 3
        elif opt == "--scratch":
            scratch, i = opts[i + 1], i + 2
        elif opt == "--boot-id":
            boot_id, i = opts[i + 1], i + 2
        elif opt == "--boottime-origin":
            origin, i = float(opts[i + 1]), i + 2
        elif opt == "--probe":
            probe, i = True, i + 1
        elif opt == "--netdev":
            name, _, mac = opts[i + 1].partition("=")
            netdevs.append((name, mac))
            i += 2
        else:
            print(f"devplug launcher: unknown option {opt!r}", file=sys.stderr)
            return 2
    if binds and not scratch:
        print("devplug launcher: --bind needs --scratch DIR", file=sys.stderr)
        return 2
    if not argv and not probe:
        print("devplug launcher: no command after --", file=sys.stderr)
        return 2
    if binds or probe or boot_id or origin is not None:
        try:
            enter_namespace(binds, scratch)
        except MountError as exc:
            print(f"devplug launcher: cannot set up the node's mount namespace: {exc}", file=sys.stderr)
            return 126
        except (NamespaceError, OSError) as exc:
            print(
                f"devplug launcher: cannot make the node's mount namespace ({exc}); {NO_NAMESPACE_HELP}",
                file=sys.stderr,
            )
            return 126
    if probe:
        return 0
    if boot_id:
        try:
            _mount(boot_id, BOOT_ID_PATH, None, _MS_BIND)
        except MountError as exc:
            print(f"devplug launcher: the boot ID is the host's, not the node's: {exc}", file=sys.stderr)
    if origin is not None:
        try:
            enter_time_namespace(origin)
        except (NamespaceError, OSError) as exc:
            print(f"devplug launcher: /proc/uptime counts from the host's boot, not the node's: {exc}", file=sys.stderr)
    if netdevs:
        try:
            enter_network_namespace(netdevs)
        except (NamespaceError, OSError) as exc:
            print(
                "devplug launcher: cannot make the node's network namespace with links "
                f"{[n for n, _ in netdevs]} ({exc}); it needs root (CAP_NET_ADMIN and /dev/net/tun)",
                file=sys.stderr,
            )
            return 126
    if parent is not None:
        _set_parent_death_signal(parent)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"devplug launcher: cannot execute {argv[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 127  # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
