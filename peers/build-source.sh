#!/usr/bin/env bash
# Build the peers whose modules the Go module proxy refuses, from a source tarball or checkout the user points at:
#   sriovdp   k8snetworkplumbingwg/sriov-network-device-plugin (./cmd/sriovdp; dependencies from the Go module
#             proxy, ~3 min cold). Source: $DEVPLUG_SRIOV_SOURCE (a .tar.xz/.tar.gz of a tag, or a checkout), else
#             the snapshot in ../shared/peer-sources beside the repository when there is one.
#   gpu-kubelet-plugin  NVIDIA's DRA driver, sigs.k8s.io/dra-driver-nvidia-gpu (./cmd/gpu-kubelet-plugin; vendored,
#             cgo: go-nvml loads libnvidia-ml.so.1 at run time, ~5 min cold). Source: $DEVPLUG_NVIDIA_DRA_SOURCE, else
#             the v0.4.0 snapshot in ../shared/peer-sources.
#   compute-domain-kubelet-plugin  the same driver's ComputeDomain (IMEX) kubelet plugin
#             (./cmd/compute-domain-kubelet-plugin; same source, build and variable as gpu-kubelet-plugin). Its chart's
#             CRDs are kept beside the binary (<out>/crds): it serves only once the API server serves ComputeDomains.
#
# usage: peers/build-source.sh NAME...   Prints "NAME BINARY" per peer on stdout. With no source for NAME it prints
# "NAME -" and says why on stderr (exit 0): the tests then skip saying so, and fail under CI=true.
# Cached like the other peers ($DEVPLUG_CACHE_DIR/peers/<name>-<hash of the source and this script>/bin/<name>).
. "$(dirname "$0")/../kind-config/offline/lib.sh"

PEERS_CACHE="$CACHE_ROOT/peers"
SHARED_SOURCES="$(cd "$REPO_ROOT/.." && pwd)/shared/peer-sources"
KNOWN="sriovdp gpu-kubelet-plugin compute-domain-kubelet-plugin"
mkdir -p "$PEERS_CACHE"

peer_source() {  # peer_source NAME: its source (file or directory), or nothing
  case $1 in
    sriovdp) echo "${DEVPLUG_SRIOV_SOURCE:-$SHARED_SOURCES/sriov-network-device-plugin-v3.11.0.tar.xz}" ;;
    gpu-kubelet-plugin | compute-domain-kubelet-plugin) echo "${DEVPLUG_NVIDIA_DRA_SOURCE:-$SHARED_SOURCES/dra-driver-nvidia-gpu-v0.4.0.tar.xz}" ;;
    *) die "unknown source-built peer '$1' (known: $KNOWN)" ;;
  esac
}

peer_package() {  # peer_package NAME: the Go package to build in the source tree
  case $1 in
    sriovdp) echo ./cmd/sriovdp ;;
    gpu-kubelet-plugin | compute-domain-kubelet-plugin) echo "./cmd/$1" ;;
  esac
}

peer_env() {  # peer_env NAME: how its build is configured (a vendored tree builds offline from vendor/)
  case $1 in
    sriovdp) echo "GOFLAGS=-mod=mod CGO_ENABLED=0" ;;
    # go-nvml's cgo stubs leave NVML's symbols to the library loaded at run time
    gpu-kubelet-plugin | compute-domain-kubelet-plugin) echo "GOFLAGS=-mod=vendor CGO_ENABLED=1 CGO_LDFLAGS_ALLOW=-Wl,--unresolved-symbols=ignore-in-object-files" ;;
  esac
}

peer_keep() {  # peer_keep NAME: directories of the source tree kept in the cache beside bin/ (what running it needs)
  case $1 in
    compute-domain-kubelet-plugin) echo deployments/helm/dra-driver-nvidia-gpu/crds ;;
  esac
}

source_variable() {  # source_variable NAME: the environment variable that points at its source
  case $1 in
    sriovdp) echo DEVPLUG_SRIOV_SOURCE ;;
    gpu-kubelet-plugin | compute-domain-kubelet-plugin) echo DEVPLUG_NVIDIA_DRA_SOURCE ;;
  esac
}

source_hash() {  # source_hash SOURCE: what identifies it (a tarball's bytes; a checkout's commit, or its files)
  if [ -f "$1" ]; then
    sha256sum "$1" | cut -c1-12
  elif git -C "$1" rev-parse HEAD >/dev/null 2>&1 && [ -z "$(git -C "$1" status --porcelain)" ]; then
    git -C "$1" rev-parse HEAD | cut -c1-12
  else
    find "$1" -type f -name '*.go' -o -name go.mod -o -name go.sum | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12
  fi
}

unpack() {  # unpack SOURCE DIR: the source tree in DIR (a tarball's one top directory, or a copy of the checkout)
  local src=$1 dir=$2
  mkdir -p "$dir"
  if [ -f "$src" ]; then
    tar -xf "$src" -C "$dir" || die "cannot unpack $src"
    local top
    top=$(find "$dir" -mindepth 1 -maxdepth 1 -type d | head -1)
    [ -f "$top/go.mod" ] || die "$src: no go.mod at the top of the archive"
    echo "$top"
  else
    cp -r "$src" "$dir/src"
    echo "$dir/src"
  fi
}

build_peer() {
  local name=$1 src hash out tree
  src=$(peer_source "$name")
  if [ ! -e "$src" ]; then
    log "$name: no source at $src (set $(source_variable "$name") to a tarball or checkout of its tag)"
    echo "$name -"
    return 0
  fi
  hash=$( (source_hash "$src"; sha256sum "$0" "$OFFLINE_DIR/lib.sh") | sha256sum | cut -c1-12)
  out="$PEERS_CACHE/$name-$hash"
  lock "$(basename "$out")" "$PEERS_CACHE"
  if [ ! -f "$out/bin/.complete" ]; then
    rm -rf "$out"
    mkdir -p "$out/bin"
    tree=$(unpack "$src" "$out/work")
    step "build $name from $src" bash -c "cd '$tree' && env $(peer_env "$name") '$GO' build -trimpath -ldflags '-s -w' -o '$out/bin/$name' $(peer_package "$name")"
    for keep in $(peer_keep "$name"); do
      cp -r "$tree/$keep" "$out/" || die "$name: no $keep in $src"
    done
    rm -rf "$out/work"
    [ -x "$out/bin/$name" ] || die "$name: the build left no $out/bin/$name"
    touch "$out/bin/.complete"
  else
    touch "$out/bin/.complete"  # its last use, which prune_unused reads
    log "$name cached: $out/bin/$name"
  fi
  echo "$name $out/bin/$name"
}

[ -x "$GO" ] || die "no Go toolchain (go not on PATH, GO unset): the peers are built from Go source"
[ $# -gt 0 ] || set -- $KNOWN
for n in "$@"; do
  (build_peer "$n")
done
prune_unused "$PEERS_CACHE"
