#!/usr/bin/env bash
# Build the peer DRA kubelet plugins from their Go modules (Go module proxy only), once per machine:
#   dra-example-kubeletplugin  sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin @ $DRA_EXAMPLE_VERSION
#
# usage: peers/build-dra.sh [NAME...]   (default: all). Prints "NAME BINARY" per peer on stdout.
# A sibling of peers/build.sh with the same cache layout ($DEVPLUG_CACHE_DIR/peers/<name>-<version>-<hash>/
# bin/<name>) and locking; kept apart because build.sh's own hash keys every device-plugin peer, so an edit
# there would rebuild all of them (~13 min) on every machine.
. "$(dirname "$0")/../kind-config/offline/lib.sh"

DRA_EXAMPLE_VERSION=v0.2.1
PEERS_DIR="$REPO_ROOT/peers"
PEERS_CACHE="$CACHE_ROOT/peers"
mkdir -p "$PEERS_CACHE"

peer_dir() {  # peer_dir NAME: the cache dir of NAME's current build (version + hash of this script)
  local hash
  hash=$(sha256sum "$PEERS_DIR/build-dra.sh" "$OFFLINE_DIR/lib.sh" | sha256sum | cut -c1-12)
  case $1 in
    dra-example-kubeletplugin) echo "$PEERS_CACHE/$1-$DRA_EXAMPLE_VERSION-$hash" ;;
    *) die "unknown DRA peer '$1' (known: dra-example-kubeletplugin)" ;;
  esac
}

# The example driver's module pins everything in its go.sum; its kubelet plugin is pure Go.
build_dra_example() {
  local out=$1 src
  src=$(cd "$PEERS_CACHE" && GOFLAGS=-mod=mod "$GO" mod download -json \
        "sigs.k8s.io/dra-example-driver@$DRA_EXAMPLE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$src" ] || die "could not download sigs.k8s.io/dra-example-driver@$DRA_EXAMPLE_VERSION"
  rm -rf "$out/src"
  cp -r "$src" "$out/src"
  chmod -R u+w "$out/src"
  rm -rf "$out/src/vendor"
  (cd "$out/src" && CGO_ENABLED=0 "$GO" build -mod=mod -trimpath -ldflags "-s -w" \
      -o "$out/bin/dra-example-kubeletplugin" ./cmd/dra-example-kubeletplugin)
  rm -rf "$out/src"
}

build_peer() {
  local name=$1 out
  out=$(peer_dir "$name")
  lock "$(basename "$out")" "$PEERS_CACHE"
  if [ ! -f "$out/bin/.complete" ]; then
    rm -rf "$out"
    mkdir -p "$out/bin"
    step "build $name" build_dra_example "$out"
    [ -x "$out/bin/$name" ] || die "$name: the build left no $out/bin/$name"
    touch "$out/bin/.complete"
  else
    log "$name cached: $out/bin/$name"
  fi
  echo "$name $out/bin/$name"
}

[ -x "$GO" ] || die "no Go toolchain (go not on PATH, GO unset): the peers are built from Go modules"
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(dra-example-kubeletplugin)
for n in "${names[@]}"; do
  (build_peer "$n")
done
