#!/usr/bin/env bash
# Everything the kind tier needs on a machine with no container registry, cached:
#   kind (ensure-kind.sh), the offline node image (build-node-image.sh), the Python base image
#   (build-python-base.sh). Prints KEY=VALUE lines for the caller (e.g. `eval "$(build-all.sh)"`):
#   DEVPLUG_KIND_BIN, DEVPLUG_KIND_NODE_IMAGE, DEVPLUG_PYTHON_BASE.
. "$(dirname "$0")/lib.sh"

kind=$(step "kind" "$OFFLINE_DIR/ensure-kind.sh" | tail -1)
node=$(step "node image" "$OFFLINE_DIR/build-node-image.sh" | tail -1)
py=$(step "python base image" "$OFFLINE_DIR/build-python-base.sh" | tail -1)
log "all done in $(( $(date +%s) - _T0 ))s"
echo "DEVPLUG_KIND_BIN=$kind"
echo "DEVPLUG_KIND_NODE_IMAGE=$node"
echo "DEVPLUG_PYTHON_BASE=$py"
