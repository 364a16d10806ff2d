#!/usr/bin/env bash
# Build the Kubernetes binaries (kubelet, kubeadm, kubectl, kube-apiserver, kube-controller-manager,
# kube-scheduler) and etcd from their Go modules, statically, into the cache. Prints the bin dir.
#
# `go install k8s.io/kubernetes/cmd/...@v1.x` fails because k8s.io/kubernetes's go.mod has replace
# directives (staging modules), so we build from a tiny local module (lib.sh's write_k8s_gomod).
. "$(dirname "$0")/lib.sh"

lock k8s
K8S_BIN="$OFFLINE_CACHE/k8s/$KUBERNETES_VERSION/bin"
ETCD_BIN="$OFFLINE_CACHE/etcd/$ETCD_VERSION/bin"
CMDS=(kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler)

build_kubernetes() {
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
  for c in "${CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  log "go build ${CMDS[*]} (CGO_ENABLED=0; the long step of a cold build)"
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -tags providerless \
      -ldflags "$ld" -o "$K8S_BIN/" "${pkgs[@]}")
  "$K8S_BIN/kubeadm" version -o short | grep -qx "$KUBERNETES_VERSION" || die "kubeadm does not report $KUBERNETES_VERSION"
  touch "$K8S_BIN/.complete"
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

if [ -f "$K8S_BIN/.complete" ]; then log "kubernetes $KUBERNETES_VERSION binaries cached: $K8S_BIN"
else step "build kubernetes $KUBERNETES_VERSION" build_kubernetes; fi
if [ -f "$ETCD_BIN/.complete" ]; then log "etcd $ETCD_VERSION cached: $ETCD_BIN"
else step "build etcd $ETCD_VERSION" build_etcd; fi
echo "$K8S_BIN"
echo "$ETCD_BIN"
