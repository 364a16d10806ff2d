# Shared helpers for the offline kind build scripts (sourced, not run).
# Everything here is for machines with no container registry; users' machines never need it.
set -euo pipefail

OFFLINE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$OFFLINE_DIR/../.." && pwd)"
# shellcheck source=versions.env
. "$OFFLINE_DIR/versions.env"

# release_pins [MINOR]: the releases.tsv row of MINOR (default: the default row) into the pin variables.
release_pins() {
  local table="$REPO_ROOT/src/pytest_devplug/kubeletmodel/releases.tsv" want=${1:-} row
  want=${want#v}; want=$(cut -d. -f1-2 <<<"$want")
  if [ -n "$want" ]; then row=$(awk -F'\t' -v m="$want" '!/^#/ && $1 == m' "$table")
  else row=$(awk -F'\t' '!/^#/ && $8 == "default"' "$table"); fi
  if [ -z "$row" ]; then
    echo "kind-config/offline: Kubernetes '${1:-}' is not a supported version; choose one of: $(awk -F'\t' '!/^#/ {printf "%s ", $1}' "$table")" >&2
    exit 2
  fi
  IFS=$'\t' read -r KUBERNETES_MINOR KUBERNETES_VERSION ETCD_VERSION ETCD_IMAGE_TAG PAUSE_VERSION COREDNS_VERSION RELEASE_GO _ <<<"$row"
  export KUBERNETES_MINOR KUBERNETES_VERSION ETCD_VERSION ETCD_IMAGE_TAG PAUSE_VERSION COREDNS_VERSION
  # a release whose go.mod needs a newer Go than the installed one builds with the toolchain the proxy serves
  if [ "$RELEASE_GO" != local ] && [ -z "${GOTOOLCHAIN:-}" ]; then export GOTOOLCHAIN=$RELEASE_GO; fi
}
release_pins "${DEVPLUG_KUBERNETES_VERSION:-}"

CACHE_ROOT="${DEVPLUG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-devplug}"
OFFLINE_CACHE="$CACHE_ROOT/offline"
mkdir -p "$OFFLINE_CACHE"

# Repository part of the images built here (devplug/kind-node, devplug/python-base, ...).
IMAGE_PREFIX="${DEVPLUG_IMAGE_PREFIX:-devplug}"

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOFLAGS="${GOFLAGS:-}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

_T0=$(date +%s)
_prog="$(basename "$0" .sh)"
log() { printf '[%s +%4ss] %s\n' "$_prog" "$(( $(date +%s) - _T0 ))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# step NAME CMD...: runs CMD with a start line and an elapsed-time line.
step() {
  local name=$1; shift
  local s; s=$(date +%s)
  log "==> $name"
  "$@"
  log "<== $name done in $(( $(date +%s) - s ))s"
}

# lock NAME [DIR]: hold an exclusive lock (DIR/NAME.lock, DIR defaults to the offline cache) for the
# rest of this script (two builds at once would share work dirs and image tags); a second caller
# waits, then finds the result cached.
lock() {
  local f="${2:-$OFFLINE_CACHE}/$1.lock" fd
  exec {fd}>"$f"
  if ! flock -n "$fd"; then
    log "waiting for another build holding $f"
    flock "$fd"
  fi
}

# write_k8s_gomod DIR MODULE: DIR/go.mod for a local module MODULE that requires k8s.io/kubernetes
# $KUBERNETES_VERSION and replaces each staging module (k8s.io/api, k8s.io/kubelet, ...) with its
# published v0.<minor>.<patch> release: k8s.io/kubernetes's own go.mod points them at ./staging/...,
# which a dependent module cannot use. The list comes from that go.mod's `=> ./staging/` lines.
write_k8s_gomod() {
  local dir=$1 module=$2 major minor patch gomod goline
  IFS=. read -r major minor patch <<<"${KUBERNETES_VERSION#v}"
  mkdir -p "$dir"
  gomod=$(cd "$dir" && GOFLAGS=-mod=mod "$GO" mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
          | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -f "$gomod" ] || die "could not download k8s.io/kubernetes@$KUBERNETES_VERSION's go.mod"
  goline=$(awk '$1=="go"{print $2; exit}' "$gomod")
  {
    echo "module $module"
    echo
    echo "go $goline"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    echo "replace ("
    awk '/=> \.\/staging\/src\// {print "\t" $1 " => " $1 " v0.'"$minor.$patch"'"}' "$gomod"
    echo ")"
  } > "$dir/go.mod"
}

ensure_docker() {
  if docker info >/dev/null 2>&1; then return 0; fi
  if [ -x "$REPO_ROOT/../shared/ci/ensure-docker" ]; then
    "$REPO_ROOT/../shared/ci/ensure-docker" >&2
  fi
  docker info >/dev/null 2>&1 || die "no working Docker engine (docker info fails)"
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
image_label() { docker image inspect -f "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }

apt_ensure() {  # apt_ensure pkg... : install Debian packages on the build host when missing
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
