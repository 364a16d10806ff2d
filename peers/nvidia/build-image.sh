#!/usr/bin/env bash
# Build NVIDIA's device plugin image locally (no registry) and print its tag: peers/peer-image.sh with the binary
# from peers/build.sh. Deploy it with daemonset.yaml beside this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../peer-image.sh" "$here" "$here/../build.sh" nvidia-device-plugin devplug/nvidia-device-plugin:v0.19.1
