#!/usr/bin/env bash
# Build a Kubernetes release's binaries (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl; then
# kubelet and kubeadm unless --control-plane) and etcd from their Go modules, statically, into the cache; print the
# two bin dirs. Part of the package, so `devplug control-plane build` works from a wheel; the offline kind build
# (kind-config/offline) sources it for the same helpers and runs it for the node's binaries.
#
#   DEVPLUG_KUBERNETES_VERSION=1.36 bash gobuild.sh --control-plane
#
# `go install k8s.io/kubernetes/cmd/...@v1.x` fails because k8s.io/kubernetes's go.mod has replace directives
# (staging modules), so we build from a tiny local module (write_k8s_gomod).
set -euo pipefail

GOBUILD_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

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

# release_pins [MINOR]: the releases.tsv row of MINOR (default: the default row) into the pin variables.
release_pins() {
  local table="$GOBUILD_DIR/../kubeletmodel/releases.tsv" want=${1:-} row
  want=${want#v}; want=$(cut -d. -f1-2 <<<"$want")
  if [ -n "$want" ]; then row=$(awk -F'\t' -v m="$want" '!/^#/ && $1 == m' "$table")
  else row=$(awk -F'\t' '!/^#/ && $8 == "default"' "$table"); fi
  if [ -z "$row" ]; then
    echo "pytest-devplug: Kubernetes '${1:-}' is not a supported version; choose one of: $(awk -F'\t' '!/^#/ {printf "%s ", $1}' "$table")" >&2
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

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOFLAGS="${GOFLAGS:-}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

# lock NAME [DIR]: hold an exclusive lock (DIR/NAME.lock, DIR defaults to the offline cache) for the rest of this
# script (two builds at once would share work dirs); a second caller waits, then finds the result cached.
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

# go_progress WHAT: reads `go build -v`'s output; logs how many packages are compiled every 20 s (a cold build
# runs for minutes without a word otherwise) and passes every other line (the compiler's errors) through.
go_progress() {
  local n=0 last=$SECONDS line
  while IFS= read -r line; do
    if [[ $line == *" "* || $line == "#"* ]]; then printf '%s\n' "$line" >&2; continue; fi
    n=$((n + 1))
    if (( SECONDS - last >= 20 )); then log "$1: $n packages compiled so far ($line)"; last=$SECONDS; fi
  done
  log "$1: $n packages compiled"
}

# build_kubernetes MARKER CMD...: build the commands into $K8S_BIN, then touch $K8S_BIN/MARKER
build_kubernetes() {
  local marker=$1; shift
  local mod="$OFFLINE_CACHE/k8s/$KUBERNETES_VERSION/mod"
  mkdir -p "$mod" "$K8S_BIN"
  local major minor patch
  IFS=. read -r major minor patch <<<"${KUBERNETES_VERSION#v}"

  write_k8s_gomod "$mod" devplug.local/k8s-offline-build
  log "generated $mod/go.mod ($(grep -c '=>' "$mod/go.mod") staging replaces)"

  local commit="0000000000000000000000000000000000000000"
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitVersion=$KUBERNETES_VERSION"
    ld+=" -X $pkg.gitCommit=$commit -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  local pkgs=()
  for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  log "go build $* (CGO_ENABLED=0; the long step of a cold build: minutes, progress every 20 s)"
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -v -trimpath -tags providerless \
      -ldflags "$ld" -o "$K8S_BIN/" "${pkgs[@]}" 2>&1) | go_progress "go build $*"
  "$K8S_BIN/$1" --version | grep -q "$KUBERNETES_VERSION" || die "$1 does not report $KUBERNETES_VERSION"
  touch "$K8S_BIN/$marker"
}

build_etcd() {
  local mod="$OFFLINE_CACHE/etcd/$ETCD_VERSION/mod"
  mkdir -p "$mod" "$ETCD_BIN"
  cat > "$mod/go.mod" <<GOMOD
module devplug.local/etcd-offline-build

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  log "go build go.etcd.io/etcd/server/v3 ($ETCD_VERSION)"
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -v -trimpath -ldflags "-s -w" \
      -o "$ETCD_BIN/etcd" go.etcd.io/etcd/server/v3 2>&1) | go_progress "go build etcd"
  "$ETCD_BIN/etcd" --version | grep -q "${ETCD_VERSION#v}" || die "etcd does not report ${ETCD_VERSION#v}"
  touch "$ETCD_BIN/.complete"
}

# gobuild_main [--control-plane]: the release's control plane and etcd (cached: instant), then, without
# --control-plane, the node's binaries; prints the two bin dirs.
gobuild_main() {
  local only="${1:-}"
  lock k8s
  K8S_BIN="$OFFLINE_CACHE/k8s/$KUBERNETES_VERSION/bin"
  ETCD_BIN="$OFFLINE_CACHE/etcd/$ETCD_VERSION/bin"
  # The control plane first (what --devplug-control-plane real runs; its own marker), then the node's binaries
  # (what the kind node image needs too): a release whose kubelet cannot be built here (1.38.0-beta.0 needs a
  # module the Go module proxy refuses, sigs.k8s.io/iptables-wrappers@v1.0.0) still has its control plane.
  local control_plane=(kube-apiserver kube-controller-manager kube-scheduler kubectl) node=(kubelet kubeadm)
  # .complete-control-plane: the control plane's four binaries; .complete: those and the node's (kubelet, kubeadm)
  if [ -f "$K8S_BIN/.complete-control-plane" ] || [ -f "$K8S_BIN/.complete" ]; then
    log "kubernetes $KUBERNETES_VERSION control plane cached: $K8S_BIN"
  else
    step "build the kubernetes $KUBERNETES_VERSION control plane" \
      build_kubernetes .complete-control-plane "${control_plane[@]}"
  fi
  if [ -f "$ETCD_BIN/.complete" ]; then log "etcd $ETCD_VERSION cached: $ETCD_BIN"
  else step "build etcd $ETCD_VERSION" build_etcd; fi
  if [ "$only" != --control-plane ]; then
    if [ -f "$K8S_BIN/.complete" ]; then log "kubernetes $KUBERNETES_VERSION node binaries cached: $K8S_BIN"
    else step "build the kubernetes $KUBERNETES_VERSION node binaries" build_kubernetes .complete "${node[@]}"; fi
  fi
  echo "$K8S_BIN"
  echo "$ETCD_BIN"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  gobuild_main "$@"
fi
