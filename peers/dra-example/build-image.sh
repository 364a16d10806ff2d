#!/usr/bin/env bash
# Build dra-example-driver's kubelet-plugin image locally (no registry) and print its tag: peers/peer-image.sh with
# the binary from peers/build-dra.sh. Deploy it with kubeletplugin.yaml beside this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../peer-image.sh" "$here" "$here/../build-dra.sh" dra-example-kubeletplugin \
  devplug/dra-example-kubeletplugin:v0.2.1
