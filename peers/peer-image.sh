#!/usr/bin/env bash
# Build a peer's image locally (no registry): its binary, built and cached by a peers/ build script, copied onto
# $DEVPLUG_PYTHON_BASE (default: the offline devplug/python-base:bookworm-r1 where built, else python:3.12-slim;
# any glibc image does) with the Dockerfile of the peer's directory. Prints the image tag on stdout; the tag is
# keyed by the binary, the Dockerfile and the base, so a second call finds the image built.
#
# Usage: peer-image.sh PEER_DIR BUILD_SCRIPT BINARY REPOSITORY:VERSION [FILE...]
#   FILEs join the build context (and the tag's key) beside the binary, e.g. a stand-in program the image needs.
#   e.g. peer-image.sh peers/nvidia peers/build.sh nvidia-device-plugin devplug/nvidia-device-plugin:v0.19.1
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 PEER_DIR BUILD_SCRIPT BINARY REPOSITORY:VERSION [FILE...]" >&2
  exit 2
fi
dir=$1 builder=$2 name=$3 repo_version=$4
shift 4
extra=("$@")
for f in "${extra[@]}"; do [ -f "$f" ] || { echo "peer-image.sh: no file $f to add to the build context" >&2; exit 2; }; done
base=${DEVPLUG_PYTHON_BASE:-devplug/python-base:bookworm-r1}
docker image inspect "$base" >/dev/null 2>&1 || [ -n "${DEVPLUG_PYTHON_BASE:-}" ] || base=python:3.12-slim
binary=$(bash "$builder" "$name" | awk -v n="$name" '$1 == n {print $2}')
[ -x "$binary" ] || { echo "peer-image.sh: $builder printed no $name binary" >&2; exit 1; }
tag="$repo_version-$(cat "$binary" "$dir/Dockerfile" "${extra[@]}" <(echo "$base") | sha256sum | cut -c1-12)"
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  ctx=$(mktemp -d "${TMPDIR:-/tmp}/devplug-$name-image.XXXXXX")
  trap 'rm -rf "$ctx"' EXIT
  cp "$dir/Dockerfile" "$binary" "${extra[@]}" "$ctx/"
  docker build -q --build-arg "BASE=$base" -t "$tag" "$ctx" >&2
fi
echo "$tag"
