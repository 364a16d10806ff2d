#!/usr/bin/env bash
# Build NVIDIA's DRA driver's kubelet-plugin image locally (no registry) and print its tag: peers/peer-image.sh with
# the binary from peers/build-source.sh (its source: DEVPLUG_NVIDIA_DRA_SOURCE or ../shared). Deploy it with
# kubeletplugin.yaml beside this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../peer-image.sh" "$here" "$here/../build-source.sh" gpu-kubelet-plugin \
  devplug/gpu-kubelet-plugin:v0.4.0 "$here/../../src/pytest_devplug/sim/nvidia-cdi-hook.sh"
