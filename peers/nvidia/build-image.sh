#!/usr/bin/env bash
# Build NVIDIA's device plugin image locally (no registry): the binary from peers/build.sh copied onto
# $DEVPLUG_PYTHON_BASE (default: the offline devplug/python-base:bookworm-r1 where built, else
# python:3.12-slim; any glibc image does). Prints the image tag on stdout; the tag
# is keyed by the binary and this directory's Dockerfile, so a second call finds the image built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=${DEVPLUG_PYTHON_BASE:-devplug/python-base:bookworm-r1}
docker image inspect "$base" >/dev/null 2>&1 || [ -n "${DEVPLUG_PYTHON_BASE:-}" ] || base=python:3.12-slim
binary=$(bash "$here/../build.sh" nvidia-device-plugin | awk '$1 == "nvidia-device-plugin" {print $2}')
[ -x "$binary" ] || { echo "build-image.sh: peers/build.sh printed no nvidia-device-plugin binary" >&2; exit 1; }
tag="devplug/nvidia-device-plugin:v0.17.4-$(cat "$binary" "$here/Dockerfile" <(echo "$base") | sha256sum | cut -c1-12)"
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  ctx=$(mktemp -d "${TMPDIR:-/tmp}/devplug-nvidia-image.XXXXXX")
  trap 'rm -rf "$ctx"' EXIT
  cp "$here/Dockerfile" "$binary" "$ctx/"
  docker build -q --build-arg "BASE=$base" -t "$tag" "$ctx" >&2
fi
echo "$tag"
