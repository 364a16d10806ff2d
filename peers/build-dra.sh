#!/usr/bin/env bash
# Build the peer DRA kubelet plugins from their Go modules (Go module proxy only), once per machine:
#   dra-example-kubeletplugin          sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin @ $DRA_EXAMPLE_VERSION
#   dra-example-kubeletplugin-patched  the same @ $DRA_EXAMPLE_VERSION + peers/dra-example/$DRA_EXAMPLE_PATCH: a
#                                      prepare answered from the checkpoint re-creates the claim's CDI spec
#                                      (kubernetes/kubernetes#141433; upstream fix: dra-example-driver PR #259)
#   dra-example-kubeletplugin-v040     the same @ $DRA_EXAMPLE_V040_VERSION as released (still has that bug;
#                                      its flags add --device-profile/--driver-name, default gpu / gpu.example.com)
#   dra-example-kubeletplugin-v040-lib038  the same @ $DRA_EXAMPLE_V040_VERSION on k8s.io/dynamic-resource-allocation
#                                      $DRA_LIBRARY_FIXED (Go $LIBRARY_TOOLCHAIN), + peers/dra-example/$DRA_LIBRARY_PATCH:
#                                      the library with kubernetes/kubernetes#140011 fixed, a positive control
#
# usage: peers/build-dra.sh [NAME...]   (default: all). Prints "NAME BINARY" per peer on stdout.
# A sibling of peers/build.sh with the same cache layout ($DEVPLUG_CACHE_DIR/peers/<name>-<version>-<hash>/
# bin/<name>) and locking; kept apart because build.sh's own hash keys every device-plugin peer, so an edit
# there would rebuild all of them (~13 min) on every machine.
. "$(dirname "$0")/../kind-config/offline/lib.sh"

DRA_EXAMPLE_VERSION=v0.2.1
DRA_EXAMPLE_V040_VERSION=v0.4.0   # its go.mod says go 1.26.0: the local Go 1.26 builds it
DRA_EXAMPLE_PATCH=recreate-cdi-spec-on-restored-claim.patch   # against $DRA_EXAMPLE_VERSION, applied with patch -p1
DRA_LIBRARY_FIXED=v0.38.0-beta.0   # the first k8s.io/dynamic-resource-allocation with kubernetes/kubernetes#140063
LIBRARY_TOOLCHAIN=go1.27.3         # v0.38 needs Go 1.27; the Go module proxy serves this toolchain
DRA_LIBRARY_PATCH=kubeletplugin-library-v0.38.patch   # against $DRA_EXAMPLE_V040_VERSION: compiles on that library
PEERS_DIR="$REPO_ROOT/peers"
PEERS_CACHE="$CACHE_ROOT/peers"
KNOWN="dra-example-kubeletplugin dra-example-kubeletplugin-patched dra-example-kubeletplugin-v040 dra-example-kubeletplugin-v040-lib038"
mkdir -p "$PEERS_CACHE"

peer_version() {  # peer_version NAME: the dra-example-driver release NAME is built from
  case $1 in
    dra-example-kubeletplugin|dra-example-kubeletplugin-patched) echo "$DRA_EXAMPLE_VERSION" ;;
    dra-example-kubeletplugin-v040|dra-example-kubeletplugin-v040-lib038) echo "$DRA_EXAMPLE_V040_VERSION" ;;
    *) die "unknown DRA peer '$1' (known: $KNOWN)" ;;
  esac
}

peer_patch() {  # peer_patch NAME: the patch applied to NAME's source (none: empty)
  case $1 in
    dra-example-kubeletplugin-patched) echo "$PEERS_DIR/dra-example/$DRA_EXAMPLE_PATCH" ;;
    dra-example-kubeletplugin-v040-lib038) echo "$PEERS_DIR/dra-example/$DRA_LIBRARY_PATCH" ;;
  esac
}

peer_dir() {  # peer_dir NAME: the cache dir of NAME's current build (version + hash of this script and its patch)
  local version patch hash
  version=$(peer_version "$1") || exit 1   # (set -e does not reach into $(...))
  patch=$(peer_patch "$1")
  hash=$(sha256sum "$PEERS_DIR/build-dra.sh" "$OFFLINE_DIR/lib.sh" ${patch:+"$patch"} | sha256sum | cut -c1-12)
  echo "$PEERS_CACHE/$1-$version-$hash"
}

# The example driver's module pins everything in its go.sum; its kubelet plugin is pure Go.
# build_dra_example OUT NAME VERSION [PATCH]: OUT/bin/NAME from dra-example-driver@VERSION (+ PATCH).
build_dra_example() {
  local out=$1 name=$2 version=$3 patch=${4:-} src
  src=$(cd "$PEERS_CACHE" && GOFLAGS=-mod=mod "$GO" mod download -json \
        "sigs.k8s.io/dra-example-driver@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$src" ] || die "could not download sigs.k8s.io/dra-example-driver@$version"
  rm -rf "$out/src"
  cp -r "$src" "$out/src"
  chmod -R u+w "$out/src"
  rm -rf "$out/src/vendor"
  if [ -n "$patch" ]; then
    [ -f "$patch" ] || die "$name: no patch file $patch"
    command -v patch >/dev/null || die "$name: the 'patch' command is missing (apt-get install patch)"
    # dry run first: a patch that does not apply cleanly to $version must stop the build, not half-apply
    (cd "$out/src" && patch -p1 --batch --forward --dry-run <"$patch" >&2) \
      || die "$name: $(basename "$patch") does not apply to dra-example-driver@$version"
    (cd "$out/src" && patch -p1 --batch --forward <"$patch" >&2) \
      || die "$name: applying $(basename "$patch") to dra-example-driver@$version failed"
  fi
  local go_env=()   # the toolchain: the environment's, but for the build on the newer library
  if [ "$name" = dra-example-kubeletplugin-v040-lib038 ]; then
    go_env=("GOTOOLCHAIN=$LIBRARY_TOOLCHAIN")
    (cd "$out/src" && env "${go_env[@]}" GOFLAGS=-mod=mod "$GO" get \
        "k8s.io/dynamic-resource-allocation@$DRA_LIBRARY_FIXED" >&2) \
      || die "$name: could not upgrade k8s.io/dynamic-resource-allocation to $DRA_LIBRARY_FIXED"
  fi
  (cd "$out/src" && env "${go_env[@]}" CGO_ENABLED=0 "$GO" build -mod=mod -trimpath -ldflags "-s -w" \
      -o "$out/bin/$name" ./cmd/dra-example-kubeletplugin)
  rm -rf "$out/src"
}

build_peer() {
  local name=$1 version patch out
  version=$(peer_version "$name")
  patch=$(peer_patch "$name")
  out=$(peer_dir "$name")
  lock "$(basename "$out")" "$PEERS_CACHE"
  if [ ! -f "$out/bin/.complete" ]; then
    rm -rf "$out"
    mkdir -p "$out/bin"
    step "build $name" build_dra_example "$out" "$name" "$version" "$patch"
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
[ ${#names[@]} -gt 0 ] || read -r -a names <<<"$KNOWN"
for n in "${names[@]}"; do
  (build_peer "$n")
done
prune_unused "$PEERS_CACHE"
