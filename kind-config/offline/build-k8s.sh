#!/usr/bin/env bash
# Build the Kubernetes binaries (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl; then kubelet and
# kubeadm unless --control-plane) and etcd from their Go modules, statically, into the cache. Prints the bin dir.
#
# `go install k8s.io/kubernetes/cmd/...@v1.x` fails because k8s.io/kubernetes's go.mod has replace
# directives (staging modules), so we build from a tiny local module (lib.sh's write_k8s_gomod).
. "$(dirname "$0")/lib.sh"

lock k8s
K8S_BIN="$OFFLINE_CACHE/k8s/$KUBERNETES_VERSION/bin"
ETCD_BIN="$OFFLINE_CACHE/etcd/$ETCD_VERSION/bin"
# The control plane first (what --devplug-control-plane real runs; its own marker), then the node's binaries (what
# the kind node image needs too): a release whose kubelet cannot be built here (1.38.0-beta.0 needs a module the
# Go module proxy refuses, sigs.k8s.io/iptables-wrappers@v1.0.0) still has its control plane.
CONTROL_PLANE=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
NODE=(kubelet kubeadm)
ONLY="${1:-}"   # --control-plane: stop after the control plane

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
  log "go build $* (CGO_ENABLED=0; the long step of a cold build)"
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -tags providerless \
      -ldflags "$ld" -o "$K8S_BIN/" "${pkgs[@]}")
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
  local vpkg=go.etcd.io/etcd/api/v3/version
  log "go build go.etcd.io/etcd/server/v3 ($ETCD_VERSION)"
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -ldflags "-s -w" \
      -o "$ETCD_BIN/etcd" go.etcd.io/etcd/server/v3)
  "$ETCD_BIN/etcd" --version | grep -q "${ETCD_VERSION#v}" || die "etcd does not report ${ETCD_VERSION#v}"
  touch "$ETCD_BIN/.complete"
}

# .complete-control-plane: the control plane's four binaries; .complete: those and the node's (kubelet, kubeadm)
if [ -f "$K8S_BIN/.complete-control-plane" ] || [ -f "$K8S_BIN/.complete" ]; then log "kubernetes $KUBERNETES_VERSION control plane cached: $K8S_BIN"
else step "build the kubernetes $KUBERNETES_VERSION control plane" build_kubernetes .complete-control-plane "${CONTROL_PLANE[@]}"; fi
if [ -f "$ETCD_BIN/.complete" ]; then log "etcd $ETCD_VERSION cached: $ETCD_BIN"
else step "build etcd $ETCD_VERSION" build_etcd; fi
if [ "$ONLY" != --control-plane ]; then
  if [ -f "$K8S_BIN/.complete" ]; then log "kubernetes $KUBERNETES_VERSION node binaries cached: $K8S_BIN"
  else step "build the kubernetes $KUBERNETES_VERSION node binaries" build_kubernetes .complete "${NODE[@]}"; fi
fi
echo "$K8S_BIN"
echo "$ETCD_BIN"
