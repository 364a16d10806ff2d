#!/usr/bin/env bash
# Build dra-example-driver's kubelet-plugin image locally (no registry): the binary from peers/build-dra.sh copied
# onto $DEVPLUG_PYTHON_BASE (default: the offline devplug/python-base:bookworm-r1 where built, else
# python:3.12-slim). Prints the image tag on stdout; the tag is keyed by the binary, this directory's Dockerfile
# and the base, so a second call finds the image built. Deploy it with kubeletplugin.yaml beside this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=${DEVPLUG_PYTHON_BASE:-devplug/python-base:bookworm-r1}
docker image inspect "$base" >/dev/null 2>&1 || [ -n "${DEVPLUG_PYTHON_BASE:-}" ] || base=python:3.12-slim
binary=$(bash "$here/../build-dra.sh" dra-example-kubeletplugin | awk '$1 == "dra-example-kubeletplugin" {print $2}')
[ -x "$binary" ] || { echo "build-image.sh: peers/build-dra.sh printed no dra-example-kubeletplugin binary" >&2; exit 1; }
tag="devplug/dra-example-kubeletplugin:v0.2.1-$(cat "$binary" "$here/Dockerfile" <(echo "$base") | sha256sum | cut -c1-12)"
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  ctx=$(mktemp -d "${TMPDIR:-/tmp}/devplug-dra-example-image.XXXXXX")
  trap 'rm -rf "$ctx"' EXIT
  cp "$here/Dockerfile" "$binary" "$ctx/"
  docker build -q --build-arg "BASE=$base" -t "$tag" "$ctx" >&2
fi
echo "$tag"
