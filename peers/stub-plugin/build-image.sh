#!/usr/bin/env bash
# Build the stub peer's image locally (no registry) and print its tag: peers/peer-image.sh with the binary from
# peers/build.sh. Deploy it with daemonset-one-device.yaml beside this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../peer-image.sh" "$here" "$here/../build.sh" stub-plugin devplug/stub-plugin:dev
