#!/usr/bin/env bash
# Build the node's container runtime tools from their Go modules, statically, into the cache:
#   containerd, containerd-shim-runc-v2 and ctr (github.com/containerd/containerd/v2 $CONTAINERD_VERSION) and
#   crictl (sigs.k8s.io/cri-tools $CRI_TOOLS_VERSION). Prints the bin dir.
#
# Why not Debian's containerd: bookworm ships 1.6, which has no CDI (containerd >= 1.7 resolves the CDI device
# names a plugin answers Allocate with). crictl drives the CRI the way upstream's node e2e tests do (a node
# "reboot" removes every pod sandbox through it). Both modules build with `go build` at their tag: neither
# go.mod has replace directives. The result is keyed by the versions and this script, so a changed build
# recipe builds again.
. "$(dirname "$0")/lib.sh"

lock containerd
KEY=$(cat "$OFFLINE_DIR/build-containerd.sh" <(echo "$CONTAINERD_VERSION $CRI_TOOLS_VERSION") | sha256sum | cut -c1-12)
BIN="$OFFLINE_CACHE/containerd/$CONTAINERD_VERSION-$KEY/bin"

# gomod DIR MODULE VERSION: a local module requiring only MODULE (each tool in a module of its own: together,
# Go's version selection would move cri-tools onto containerd's newer k8s.io libraries, which it does not build with)
gomod() {
  mkdir -p "$1"
  printf 'module devplug.local/offline-build\n\ngo 1.24\n\nrequire %s %s\n' "$2" "$3" > "$1/go.mod"
}

build() {
  local work="$OFFLINE_CACHE/containerd/$CONTAINERD_VERSION-$KEY"
  mkdir -p "$BIN"
  # Static and cgo-free, as containerd's release builds of the shim are; btrfs (cgo) is not needed: overlayfs.
  local ctd=github.com/containerd/containerd/v2
  local ld="-s -w -X $ctd/version.Version=$CONTAINERD_VERSION -X $ctd/version.Revision=devplug-offline"
  gomod "$work/containerd" "$ctd" "$CONTAINERD_VERSION"
  log "go build containerd, containerd-shim-runc-v2, ctr ($CONTAINERD_VERSION)"
  (cd "$work/containerd" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -tags "no_btrfs,no_devmapper,no_zfs" \
      -ldflags "$ld" -o "$BIN/" "$ctd/cmd/containerd" "$ctd/cmd/containerd-shim-runc-v2" "$ctd/cmd/ctr")
  gomod "$work/cri-tools" sigs.k8s.io/cri-tools "$CRI_TOOLS_VERSION"
  log "go build crictl ($CRI_TOOLS_VERSION)"
  (cd "$work/cri-tools" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath \
      -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION" \
      -o "$BIN/crictl" sigs.k8s.io/cri-tools/cmd/crictl)
  "$BIN/containerd" --version | grep -q "${CONTAINERD_VERSION}" || die "containerd does not report $CONTAINERD_VERSION"
  "$BIN/crictl" --version | grep -q "${CRI_TOOLS_VERSION#v}" || die "crictl does not report $CRI_TOOLS_VERSION"
  touch "$BIN/.complete"
}

if [ -f "$BIN/.complete" ]; then log "containerd $CONTAINERD_VERSION + crictl $CRI_TOOLS_VERSION cached: $BIN"
else step "build containerd $CONTAINERD_VERSION + crictl $CRI_TOOLS_VERSION" build; fi
echo "$BIN"
