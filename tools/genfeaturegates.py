"""Generate ``src/pytest_devplug/kubeletmodel/featuregates_generated.py`` from upstream's feature-gate tables.

For every Kubernetes release the harness pins (``kubeletmodel/releases.tsv``), this downloads that release's
``k8s.io/kubernetes`` and ``k8s.io/apiserver`` modules through the Go module proxy (``go mod download``) and
reads their ``defaultVersionedKubernetesFeatureGates`` maps (``pkg/features/kube_features.go`` in each) and the
kubernetes module's ``defaultKubernetesFeatureGateDependencies``. Each gate's spec is resolved the way
``k8s.io/component-base/featuregate`` resolves it for a binary of that release: the last spec whose ``Version``
is at most the release and whose ``MinCompatibilityVersion`` (if any) is at most the release before it.

    python tools/genfeaturegates.py          # rewrite the generated module
    python tools/genfeaturegates.py --check  # exit 1 when the committed module differs (a drift test runs this)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "pytest_devplug" / "kubeletmodel" / "featuregates_generated.py"

_CONST = re.compile(r'^\s*(\w+)\s+featuregate\.Feature\s*=\s*"([^"]+)"', re.M)
_SPEC = re.compile(
    r'\{Version:\s*version\.MustParse\("(\d+)\.(\d+)"\),\s*Default:\s*(true|false),\s*PreRelease:\s*featuregate\.(\w+)'
    r'(?:,\s*LockToDefault:\s*(true|false))?(?:,\s*MinCompatibilityVersion:\s*version\.MustParse\("(\d+)\.(\d+)"\))?'
)


def _releases() -> dict[int, str]:
    """The pinned releases (kubeletmodel/releases.tsv): minor number -> k8s.io/kubernetes version."""
    rows = (ROOT / "src" / "pytest_devplug" / "kubeletmodel" / "releases.tsv").read_text().splitlines()
    cells = [r.split("\t") for r in rows if r.strip() and not r.startswith("#")]
    return {int(c[0].split(".")[1]): c[1] for c in cells}


def _source(module: str, version: str, path: str, workdir: Path) -> str:
    """A file of the module as the Go module proxy serves it (``go mod download``'s zip, read without extracting:
    a release whose go.mod needs a newer Go, 1.38's 1.27, is read with the Go installed here)."""
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": ""}
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    try:
        zip_path = json.loads(out.stdout)["Zip"]
        with zipfile.ZipFile(zip_path) as zf:
            return zf.read(f"{module}@{version}/{path}").decode()
    except (ValueError, KeyError, OSError) as exc:
        raise SystemExit(
            f"go mod download {module}@{version}: no {path} ({exc}): {out.stderr.strip() or out.stdout.strip()}"
        ) from None


def _block(text: str, opener: str) -> str:
    """The body of the Go composite literal that starts at ``opener`` (brace-matched)."""
    start = text.find(opener)
    if start < 0:
        return ""
    i = text.index("{", start + len(opener) - 1)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    raise SystemExit(f"unbalanced braces after {opener!r}")


def _entries(body: str) -> dict[str, str]:
    """Top-level ``Key: {...}`` entries of a Go map literal's body (comments removed)."""
    body = re.sub(r"//[^\n]*", "", body)
    out: dict[str, str] = {}
    for m in re.finditer(r"^\t([\w.]+):\s*\{", body, re.M):
        inner = _block(body[m.start() :], m.group(0).strip())
        out[m.group(1)] = inner
    return out


def _name(key: str, consts: dict[str, str]) -> str:
    ident = key.rsplit(".", 1)[-1]
    return consts.get(ident, ident)


def _resolve(specs: list[tuple[int, bool, str, bool, int | None]], minor: int) -> tuple[bool, str, bool] | None:
    chosen = None
    for since, default, pre, locked, min_compat in specs:
        if since <= minor and (min_compat is None or min_compat <= minor - 1):
            chosen = (default, pre, locked)
    return chosen


def _gates(texts: list[str], minor: int) -> tuple[dict[str, tuple[bool, str, bool]], dict[str, tuple[str, ...]]]:
    consts: dict[str, str] = {}
    for t in texts:
        consts.update(dict(_CONST.findall(t)))
    gates: dict[str, tuple[bool, str, bool]] = {}
    deps: dict[str, tuple[str, ...]] = {}
    for t in texts:
        for key, inner in _entries(_block(t, "defaultVersionedKubernetesFeatureGates = map[")).items():
            specs = [
                (int(s[1]), s[2] == "true", s[3], s[4] == "true", int(s[6]) if s[6] else None)
                for s in _SPEC.findall(inner)
            ]
            resolved = _resolve(specs, minor)
            if resolved is not None:
                gates[_name(key, consts)] = resolved
        dep_body = re.sub(r"//[^\n]*", "", _block(t, "defaultKubernetesFeatureGateDependencies = map["))
        for m in re.finditer(r"^\t([\w.]+):\s*\{([^}]*)\}", dep_body, re.M):
            needs = tuple(_name(k.strip(), consts) for k in m.group(2).split(",") if k.strip())
            if needs:
                deps[_name(m.group(1), consts)] = needs
    return gates, deps


def generate() -> str:
    lines = [
        '"""Feature gates of each pinned Kubernetes release: default, stage, locked; and their dependencies.',
        "",
        "Generated by ``python tools/genfeaturegates.py`` from upstream's ``pkg/features/kube_features.go`` "
        "(k8s.io/kubernetes",
        "and k8s.io/apiserver of each release); do not edit.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "#: minor -> gate -> (default, stage, locked to default)",
        "GATES: dict[int, dict[str, tuple[bool, str, bool]]] = {",
    ]
    dep_lines = [
        "#: minor -> gate -> the gates it needs enabled",
        "DEPENDENCIES: dict[int, dict[str, tuple[str, ...]]] = {",
    ]
    with tempfile.TemporaryDirectory(prefix="genfeaturegates-") as tmp:
        work = Path(tmp)
        for minor, version in sorted(_releases().items()):
            staging = "v0." + version.removeprefix("v1.")
            features = "pkg/features/kube_features.go"
            texts = [
                _source("k8s.io/kubernetes", version, features, work),
                _source("k8s.io/apiserver", staging, features, work),
            ]
            gates, deps = _gates(texts, minor)
            lines.append(f"    {minor}: {{")
            lines += [f"        {name!r}: {spec!r}," for name, spec in sorted(gates.items())]
            lines.append("    },")
            dep_lines.append(f"    {minor}: {{")
            dep_lines += [f"        {name!r}: {need!r}," for name, need in sorted(deps.items())]
            dep_lines.append("    },")
    return "\n".join([*lines, "}", "", *dep_lines, "}", ""])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed module differs from a fresh one")
    args = ap.parse_args()
    text = generate()
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python tools/genfeaturegates.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
