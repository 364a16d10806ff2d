"""CDI (Container Device Interface) resolution: what a CDI-enabled runtime does with a device name.

A plugin answering ``Allocate`` with CDI names (``CDIDevices``, or ``cdi.k8s.io/*`` annotations) writes spec
files to ``/etc/cdi`` or ``/var/run/cdi``; the runtime (containerd >= 1.7 with CDI on, CRI-O) reads them
and applies each named device's edits — the spec's own ``containerEdits`` once, then the device's — to
the container, and refuses to create the container when a name resolves to no device. This module
follows ``tags.cncf.io/container-device-interface`` (``pkg/cdi``, ``pkg/parser``):

- spec files are ``*.json`` and ``*.yaml`` in the spec directories; a later directory has the higher
  priority (``/var/run/cdi`` over ``/etc/cdi``), and the same device in two specs of one priority is a
  conflict that leaves it unresolvable; a spec file that fails to parse or validate contributes nothing;
- a spec has a known ``cdiVersion``, a ``kind`` ``vendor/class`` (vendor and class start with a letter,
  end with a letter or digit, and hold letters, digits, ``_ - .``), at least one device, unique device
  names (start and end with a letter or digit; letters, digits, ``_ - . :``), every device non-empty
  edits, and no unknown fields (upstream parses strictly);
- edits: ``env`` entries ``NAME=value`` (name non-empty), ``deviceNodes`` with a ``path``, a type of
  ``b c u p`` or none, no negative major/minor, permissions of ``rwm`` (or ``none``), ``mounts`` with
  both paths, ``hooks`` with a known ``hookName`` and a ``path``.

``resolve(names, spec_dirs)`` resolves names; ``apply_edits(view, spec_dirs)`` is what the runtime makes of a
container's options with them (the sim's runtime when it starts a container, the real-cluster backends' view of
what a container should have).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ..kubeletmodel.views import ContainerView, DeviceNodeView, MountView
from ..errors import CdiSpecError, UnresolvableCdiDevicesError

__all__ = [
    "SPEC_DIRS",
    "CdiEdits",
    "CdiRegistry",
    "load_specs",
    "resolve",
    "apply_edits",
    "names_from_annotations",
]

#: Where a runtime reads spec files, lowest priority first (a device in both: ``/var/run/cdi`` wins).
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
#: The released CDI spec versions (``specs-go/version.go``); 0.3.0 is the earliest upstream reads.
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
#: Container annotations a CDI-enabled runtime reads device names from (comma-separated values).
ANNOTATION_PREFIX = "cdi.k8s.io/"
_HOOK_NAMES = frozenset({"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"})
_SPEC_KEYS = frozenset({"cdiVersion", "kind", "annotations", "devices", "containerEdits"})
_DEVICE_KEYS = frozenset({"name", "annotations", "containerEdits"})
_EDIT_KEYS = frozenset({"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices"})
_NODE_KEYS = frozenset({"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"})
_MOUNT_KEYS = frozenset({"hostPath", "containerPath", "options", "type"})
_HOOK_KEYS = frozenset({"hookName", "path", "args", "env", "timeout"})


@dataclass
class CdiEdits:
    """The edits a container gets from its CDI devices, in the order the runtime applies them."""

    env: dict[str, str] = field(default_factory=dict)
    device_nodes: list[DeviceNodeView] = field(default_factory=list)
    mounts: list[MountView] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)  # "hookName path"; the sim runs none

    def add(self, raw: Mapping[str, Any]) -> None:
        for entry in raw.get("env") or ():
            name, _, value = str(entry).partition("=")
            self.env[name] = value  # a later value wins, as in the OCI spec's process env
        for d in raw.get("deviceNodes") or ():
            perms = str(d.get("permissions") or "rwm")
            node = DeviceNodeView(str(d["path"]), str(d.get("hostPath") or d["path"]), "" if perms == "none" else perms)
            self.device_nodes = [n for n in self.device_nodes if n.container_path != node.container_path] + [node]
        for m in raw.get("mounts") or ():
            mount = MountView(str(m["containerPath"]), str(m["hostPath"]), "ro" in (m.get("options") or ()))
            self.mounts = [x for x in self.mounts if x.container_path != mount.container_path] + [mount]
        self.hooks += [f"{h['hookName']} {h['path']}" for h in raw.get("hooks") or ()]


def _alnum(c: str) -> bool:
    return c.isascii() and c.isalnum()


def _check_vendor_or_class(text: str, what: str) -> None:
    if not (text[0].isascii() and text[0].isalpha()):
        raise ValueError(f"invalid {what} {text!r}: should start with a letter")
    bad = [c for c in text[1:-1] if not (_alnum(c) or c in "_-.")]
    if bad:
        raise ValueError(f"invalid {what} {text!r}: invalid character {bad[0]!r}")
    if not _alnum(text[-1]):
        raise ValueError(f"invalid {what} {text!r}: should end with a letter or digit")


def _check_device_name(text: str) -> None:
    if not text or not _alnum(text[0]) or not _alnum(text[-1]):
        raise ValueError(f"invalid device name {text!r}: should start and end with a letter or digit")
    bad = [c for c in text[1:-1] if not (_alnum(c) or c in "_-.:")]
    if bad:
        raise ValueError(f"invalid device name {text!r}: invalid character {bad[0]!r}")


def _unknown(raw: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    extra = sorted(set(raw) - allowed)
    if extra:
        raise ValueError(f"unknown field(s) {extra} in {where}")


def _check_edits(raw: Any, where: str) -> None:
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: containerEdits must be a mapping")
    _unknown(raw, _EDIT_KEYS, where)
    for entry in raw.get("env") or ():
        if not isinstance(entry, str) or entry.find("=") <= 0:
            raise ValueError(f"{where}: invalid environment variable {entry!r}")
    for d in raw.get("deviceNodes") or ():
        _unknown(d, _NODE_KEYS, f"{where} deviceNode")
        if not d.get("path"):
            raise ValueError(f"{where}: invalid (empty) device path")
        if d.get("type", "") not in ("", "b", "c", "u", "p"):
            raise ValueError(f"{where}: device {d['path']!r}: invalid type {d['type']!r}")
        if int(d.get("major") or 0) < 0 or int(d.get("minor") or 0) < 0:
            raise ValueError(f"{where}: device {d['path']!r}: invalid (negative) device number")
        perms = str(d.get("permissions") or "")
        if perms not in ("", "none") and perms.strip("rwm"):
            raise ValueError(f"{where}: device {d['path']!r}: invalid permissions {perms!r}")
    for m in raw.get("mounts") or ():
        _unknown(m, _MOUNT_KEYS, f"{where} mount")
        if not m.get("hostPath"):
            raise ValueError(f"{where}: invalid mount, empty host path")
        if not m.get("containerPath"):
            raise ValueError(f"{where}: invalid mount, empty container path")
    for h in raw.get("hooks") or ():
        _unknown(h, _HOOK_KEYS, f"{where} hook")
        if h.get("hookName") not in _HOOK_NAMES:
            raise ValueError(f"{where}: invalid hook name {h.get('hookName')!r}")
        if not h.get("path"):
            raise ValueError(f"{where}: invalid hook {h['hookName']!r} with empty path")


def _empty(raw: Any) -> bool:
    return not raw or not any(raw.get(k) for k in _EDIT_KEYS)


@dataclass(frozen=True)
class _Spec:
    path: str
    priority: int
    kind: str
    edits: Mapping[str, Any]
    devices: Mapping[str, Mapping[str, Any]]  # unqualified name -> its containerEdits


def _parse(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CdiSpecError(f"{path}: cannot parse: {exc}") from None


def _read_spec(path: Path, priority: int) -> _Spec:
    try:
        raw = _parse(path)
    except CdiSpecError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CdiSpecError(f"{path}: cannot parse: {exc}") from None
    try:
        if not isinstance(raw, dict):
            raise ValueError("no spec data (want a mapping)")
        _unknown(raw, _SPEC_KEYS, "the spec")
        version = str(raw.get("cdiVersion", ""))
        if version not in KNOWN_VERSIONS:
            raise ValueError(f"invalid version {version!r} (known: {', '.join(KNOWN_VERSIONS)})")
        kind = str(raw.get("kind", ""))
        vendor, slash, cls = kind.partition("/")
        if not slash or not vendor or not cls:
            raise ValueError(f"invalid kind {kind!r}: want vendor/class")
        _check_vendor_or_class(vendor, "vendor")
        _check_vendor_or_class(cls, "class")
        _check_edits(raw.get("containerEdits"), "the spec's containerEdits")
        devices: dict[str, Mapping[str, Any]] = {}
        for d in raw.get("devices") or ():
            if not isinstance(d, dict):
                raise ValueError("a device must be a mapping")
            _unknown(d, _DEVICE_KEYS, f"device {d.get('name')!r}")
            name = str(d.get("name", ""))
            _check_device_name(name)
            if name in devices:
                raise ValueError(f"invalid spec, multiple device {name!r}")
            _check_edits(d.get("containerEdits"), f"device {name!r}")
            if _empty(d.get("containerEdits")):
                raise ValueError(f"invalid device {name!r}, empty device edits")
            devices[name] = d.get("containerEdits") or {}
        if not devices:
            raise ValueError("invalid spec, no devices")
    except (ValueError, TypeError, AttributeError) as exc:
        raise CdiSpecError(f"{path}: invalid CDI spec: {exc}") from None
    return _Spec(str(path), priority, kind, raw.get("containerEdits") or {}, devices)


@dataclass
class CdiRegistry:
    """The devices the spec files define (qualified name -> spec, edits) and what each file gave."""

    devices: dict[str, tuple[_Spec, Mapping[str, Any]]]
    seen: dict[str, str]  # spec file -> what it gave (its kind and devices) or why it gave nothing


def load_specs(spec_dirs: Sequence[Path]) -> CdiRegistry:
    """Every spec file of ``spec_dirs`` (lowest priority first), as a runtime's CDI cache refresh does."""
    devices: dict[str, tuple[_Spec, Mapping[str, Any]]] = {}
    conflicts: set[str] = set()
    seen: dict[str, str] = {}
    for priority, directory in enumerate(spec_dirs):
        if not directory.is_dir():
            continue
        for path in sorted(p for p in directory.iterdir() if p.suffix in (".json", ".yaml") and p.is_file()):
            try:
                spec = _read_spec(path, priority)
            except CdiSpecError as exc:
                seen[str(path)] = f"ignored ({exc})"
                continue
            seen[str(path)] = f"{spec.kind} devices {sorted(spec.devices)}"
            for name, edits in spec.devices.items():
                qualified = f"{spec.kind}={name}"
                old = devices.get(qualified)
                if old is not None and old[0].priority == priority:
                    conflicts.add(qualified)
                    seen[str(path)] += f"; conflicting device {qualified!r} (also in {old[0].path})"
                    continue
                devices[qualified] = (spec, edits)
    for name in conflicts:
        devices.pop(name, None)
    return CdiRegistry(devices, seen)


def names_from_annotations(annotations: Mapping[str, str]) -> list[str]:
    """The CDI device names in container annotations (``cdi.k8s.io/<key>: a,b``), in key order."""
    out: list[str] = []
    for key in sorted(annotations):
        if key.startswith(ANNOTATION_PREFIX):
            out += [n.strip() for n in annotations[key].split(",") if n.strip()]
    return out


def resolve(names: Iterable[str], spec_dirs: Sequence[Path]) -> CdiEdits:
    """The edits of CDI devices ``names`` from the specs in ``spec_dirs`` (later directories win); raises
    :class:`UnresolvableCdiDevicesError` naming every name no valid spec resolves and the spec files seen."""
    wanted = list(dict.fromkeys(names))
    registry = load_specs(spec_dirs)
    missing = [n for n in wanted if n not in registry.devices]
    if missing:
        if not registry.seen:
            registry.seen.update({str(d): "no spec files" for d in spec_dirs})
        raise UnresolvableCdiDevicesError(missing, registry.seen)
    edits = CdiEdits()
    applied: set[str] = set()
    for name in wanted:
        spec, device_edits = registry.devices[name]
        if spec.path not in applied:  # a spec's own edits once, before its first device's
            applied.add(spec.path)
            edits.add(spec.edits)
        edits.add(device_edits)
    return edits


def apply_edits(view: ContainerView, spec_dirs: Sequence[Path]) -> ContainerView:
    """What a CDI-enabled runtime applies on top of the kubelet's options: the edits of the CDI devices named in
    ``CDIDevices`` and ``cdi.k8s.io/*`` annotations, from the spec files in ``spec_dirs`` (later ones win): their
    env over the options' env, their device nodes and mounts replacing the options' at the same container path.

    Raises :class:`UnresolvableCdiDevicesError` for a name no spec resolves (the runtime refuses the container)."""
    names = [*view.cdi_devices, *names_from_annotations(view.annotations)]
    if not names:
        return view
    edits = resolve(names, spec_dirs)
    nodes = {d.container_path for d in edits.device_nodes}
    paths = {m.container_path for m in edits.mounts}
    return replace(
        view,
        envs={**view.envs, **edits.env},
        devices=(*(d for d in view.devices if d.container_path not in nodes), *edits.device_nodes),
        mounts=(*(m for m in view.mounts if m.container_path not in paths), *edits.mounts),
    )
