# Shared helpers for the offline kind build scripts (sourced, not run).
# Everything here is for machines with no container registry; users' machines never need it.
set -euo pipefail

OFFLINE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$OFFLINE_DIR/../.." && pwd)"
# shellcheck source=versions.env
. "$OFFLINE_DIR/versions.env"
# The release's pins (release_pins: the row of $DEVPLUG_KUBERNETES_VERSION, default the default row), the cache,
# Go, log/die/step/lock and write_k8s_gomod: the Go-module build the package ships (devplug control-plane build).
# shellcheck source=../../src/pytest_devplug/controlplane/gobuild.sh
. "$REPO_ROOT/src/pytest_devplug/controlplane/gobuild.sh"

# Repository part of the images built here (devplug/kind-node, devplug/python-base, ...).
IMAGE_PREFIX="${DEVPLUG_IMAGE_PREFIX:-devplug}"

ensure_docker() {
  if docker info >/dev/null 2>&1; then return 0; fi
  if [ -x "$REPO_ROOT/../shared/ci/ensure-docker" ]; then
    "$REPO_ROOT/../shared/ci/ensure-docker" >&2
  fi
  docker info >/dev/null 2>&1 || die "no working Docker engine (docker info fails)"
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
image_label() { docker image inspect -f "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }

# How long a build nothing used stays in the cache.
UNUSED_BUILD_DAYS=14

# prune_unused DIR: remove the builds under DIR (each a directory whose bin/.complete is touched whenever the build
# is used) not used for $UNUSED_BUILD_DAYS days, with their lock files: a build no script names any more is never
# used again. A build a concurrent run holds the lock of is left alone.
prune_unused() {
  local dir=$1 days=$UNUSED_BUILD_DAYS build fd
  for build in "$dir"/*/; do
    build=${build%/}
    [ -f "$build/bin/.complete" ] || continue
    [ -n "$(find "$build/bin/.complete" -mtime +"$days" 2>/dev/null)" ] || continue
    exec {fd}>"$build.lock"
    if flock -n "$fd"; then
      rm -rf "$build"
      rm -f "$build.lock"
      log "pruned $build (unused for over $days days)"
    fi
    exec {fd}>&-
  done
}

apt_ensure() {  # apt_ensure pkg... : install Debian packages on the build host when missing
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
