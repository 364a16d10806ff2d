#!/bin/sh
# pytest-devplug's stand-in for NVIDIA's nvidia-cdi-hook on a mock GPU node (the embedded kubelet's, and the kind
# image of NVIDIA's DRA driver): the hooks a CDI spec names have no root filesystem of a real container to edit, so
# the container toolkit's hook subcommands succeed and anything else is refused, naming itself.
case "$1" in
  create-symlinks|update-ldcache|enable-cuda-compat|disable-device-node-modification|chmod|create-soname-symlinks|--version|-v) exit 0 ;;
  *) echo "nvidia-cdi-hook (devplug stub): unknown command '$1'" >&2; exit 1 ;;
esac
