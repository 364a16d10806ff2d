#!/usr/bin/env bash
# Build the peer device plugins the project's own tests run the conformance suite against, from
# their Go modules (Go module proxy only), once per machine:
#   sample-device-plugin  k8s.io/kubernetes/test/images/sample-device-plugin @ $KUBERNETES_VERSION
#   stub-plugin           peers/stub-plugin/main.go on upstream's device-plugin stub @ $KUBERNETES_VERSION
#   nvidia-device-plugin  github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin @ $NVIDIA_PLUGIN_VERSION
#   generic-device-plugin github.com/squat/generic-device-plugin @ $GENERIC_PLUGIN_VERSION
#
# usage: peers/build.sh [NAME...]   (default: all four). Prints "NAME BINARY" per peer on stdout.
# Each lands in $DEVPLUG_CACHE_DIR/peers/<name>-<version>-<hash>/bin/<name>, the hash over this
# script, lib.sh, versions.env and the peer's own sources; a cached build answers at once, a
# concurrent build of the same peer waits on its lock and then finds it cached.
. "$(dirname "$0")/../kind-config/offline/lib.sh"

NVIDIA_PLUGIN_VERSION=v0.19.1
# squat/generic-device-plugin tags no releases; the proxy's pseudo-version of its main branch of 2026-05-15.
GENERIC_PLUGIN_VERSION=v0.0.0-20260515115838-2cc50b05d4d2
PEERS_DIR="$REPO_ROOT/peers"
PEERS_CACHE="$CACHE_ROOT/peers"
mkdir -p "$PEERS_CACHE"

source_hash() {  # source_hash FILE...: short digest of the files that shape a build
  sha256sum "$@" | sha256sum | cut -c1-12
}

# peer_dir NAME: the cache dir of NAME's current build (version + source hash in its name).
peer_dir() {
  local srcs=("$PEERS_DIR/build.sh" "$OFFLINE_DIR/lib.sh" "$OFFLINE_DIR/versions.env" "$REPO_ROOT/src/pytest_devplug/controlplane/gobuild.sh")
  case $1 in
    sample-device-plugin) echo "$PEERS_CACHE/$1-$KUBERNETES_VERSION-$(source_hash "${srcs[@]}")" ;;
    stub-plugin) echo "$PEERS_CACHE/$1-$KUBERNETES_VERSION-$(source_hash "${srcs[@]}" "$PEERS_DIR"/stub-plugin/*.go)" ;;
    nvidia-device-plugin) echo "$PEERS_CACHE/$1-$NVIDIA_PLUGIN_VERSION-$(source_hash "${srcs[@]}")" ;;
    generic-device-plugin) echo "$PEERS_CACHE/$1-$GENERIC_PLUGIN_VERSION-$(source_hash "${srcs[@]}")" ;;
    *) die "unknown peer '$1' (known: sample-device-plugin stub-plugin nvidia-device-plugin generic-device-plugin)" ;;
  esac
}

# The k8s peers build in a local module requiring k8s.io/kubernetes (see write_k8s_gomod). The stub's
# main imports k8s.io/kubelet directly, which makes Go select the staging modules' own v0.x.y
# requirements; both peers require it, so they select the same versions and share compiled packages.
build_k8s_peer() {
  local name=$1 out=$2 pkg tags=providerless
  write_k8s_gomod "$out/mod" "devplug.local/peers/$name"
  printf '\nrequire k8s.io/kubelet v0.0.0\n' >> "$out/mod/go.mod"
  if [ "$name" = stub-plugin ]; then
    cp "$PEERS_DIR"/stub-plugin/*.go "$out/mod/"
    pkg=.
    # the stub took a logger and contexts from 1.35 on (stub.go); 1.34's signatures are stub_legacy.go's
    [ "$KUBERNETES_MINOR" = 1.34 ] && tags+=,devplug_stub_legacy
  else
    pkg=k8s.io/kubernetes/test/images/sample-device-plugin
  fi
  (cd "$out/mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -tags "$tags" \
      -ldflags "-s -w" -o "$out/bin/$name" "$pkg")
}

# module_source MODULE@VERSION OUT: the module's files from the proxy, writable, in OUT/src.
module_source() {
  local src
  src=$(cd "$PEERS_CACHE" && GOFLAGS=-mod=mod "$GO" mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$src" ] || die "could not download $1"
  rm -rf "$2/src"
  cp -r "$src" "$2/src"
  chmod -R u+w "$2/src"
}

# NVIDIA's module zip keeps only vendor/modules.txt, so its vendor/ goes and -mod=mod resolves from
# go.sum. go-nvml needs cgo (it dlopens libnvidia-ml.so.1 at run time; building needs no driver).
build_nvidia() {
  local out=$1
  module_source "github.com/NVIDIA/k8s-device-plugin@$NVIDIA_PLUGIN_VERSION" "$out"
  rm -rf "$out/src/vendor"
  # The version stamp as their Makefile sets it (go-nvml brings its own cgo link flags).
  (cd "$out/src" && CGO_ENABLED=1 "$GO" build -mod=mod -trimpath \
      -ldflags "-s -w -X github.com/NVIDIA/k8s-device-plugin/internal/info.version=$NVIDIA_PLUGIN_VERSION" \
      -o "$out/bin/nvidia-device-plugin" ./cmd/nvidia-device-plugin)
  "$out/bin/nvidia-device-plugin" --version | grep -q "$NVIDIA_PLUGIN_VERSION" \
    || die "nvidia-device-plugin does not report $NVIDIA_PLUGIN_VERSION"
}

# squat/generic-device-plugin: pure Go, built as its Dockerfile builds it (CGO off).
build_generic() {
  local out=$1
  module_source "github.com/squat/generic-device-plugin@$GENERIC_PLUGIN_VERSION" "$out"
  (cd "$out/src" && CGO_ENABLED=0 "$GO" build -mod=mod -trimpath -ldflags "-s -w" \
      -o "$out/bin/generic-device-plugin" .)
}

build_peer() {
  local name=$1 out
  out=$(peer_dir "$name")
  lock "$(basename "$out")" "$PEERS_CACHE"
  if [ ! -f "$out/bin/.complete" ]; then
    rm -rf "$out"
    mkdir -p "$out/bin"
    case $name in
      nvidia-device-plugin) step "build $name" build_nvidia "$out" ;;
      generic-device-plugin) step "build $name" build_generic "$out" ;;
      *) step "build $name" build_k8s_peer "$name" "$out" ;;
    esac
    [ -x "$out/bin/$name" ] || die "$name: the build left no $out/bin/$name"
    touch "$out/bin/.complete"
  else
    touch "$out/bin/.complete"  # its last use, which prune_unused reads
    log "$name cached: $out/bin/$name"
  fi
  echo "$name $out/bin/$name"
}

[ -x "$GO" ] || die "no Go toolchain (go not on PATH, GO unset): the peers are built from Go modules"
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(sample-device-plugin stub-plugin nvidia-device-plugin generic-device-plugin)
for n in "${names[@]}"; do
  # A subshell per peer, so each lock is released when its build is done.
  (build_peer "$n")
done
prune_unused "$PEERS_CACHE"
