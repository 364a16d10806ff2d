#!/usr/bin/env bash
# Everything the kind tier needs on a machine with no container registry, cached:
#   kind (ensure-kind.sh), the offline node image (build-node-image.sh), the Python base image
#   (build-python-base.sh). Prints KEY=VALUE lines for the caller (e.g. `eval "$(build-all.sh)"`):
#   DEVPLUG_KIND_BIN, DEVPLUG_KIND_NODE_IMAGE, DEVPLUG_PYTHON_BASE.
#
#   --auto   build only where images cannot be pulled: first try `docker pull` of a tiny image
#            (registry.k8s.io/pause); when that works, print nothing and leave kind's standard path alone.
. "$(dirname "$0")/lib.sh"

if [ "${1:-}" = "--auto" ]; then
  ensure_docker
  probe="registry.k8s.io/pause:$PAUSE_VERSION"
  if [ "$(image_label "$probe" io.devplug.offline)" != 1 ] && timeout 60 docker pull -q "$probe" >/dev/null 2>&1; then
    log "a container registry is reachable: using kind's standard images (nothing built)"
    exit 0
  fi
  log "no container registry reachable: building the offline kind images"
fi

kind=$(step "kind" "$OFFLINE_DIR/ensure-kind.sh" | tail -1)
node=$(step "node image" "$OFFLINE_DIR/build-node-image.sh" | tail -1)
py=$(step "python base image" "$OFFLINE_DIR/build-python-base.sh" | tail -1)
log "all done in $(( $(date +%s) - _T0 ))s"
echo "DEVPLUG_KIND_BIN=$kind"
echo "DEVPLUG_KIND_NODE_IMAGE=$node"
echo "DEVPLUG_PYTHON_BASE=$py"
