#!/usr/bin/env bash
# Build a kind node image with no container registry: every part is built or installed here.
#
#   kind-config/offline/build-node-image.sh        -> prints the image name (last line of stdout)
#
# Steps (each skipped when its result is already cached, keyed on versions.env and the inputs):
#   1. Docker (../shared/ci/ensure-docker where it exists)
#   2. Kubernetes binaries + etcd from their Go modules (build-k8s.sh)
#   3. the node's Debian rootfs from debootstrap (runc and CNI plugins from Debian; its containerd 1.6 is
#      replaced by containerd 2.x + crictl built from their Go modules, build-containerd.sh: CDI needs >= 1.7)
#   4. registry.k8s.io/{kube-apiserver,kube-controller-manager,kube-scheduler,etcd,pause} images:
#      `docker import` of a rootfs holding one static binary (pause is pause/pause.go)
#   5. the Python base image (build-python-base.sh): what test pods and the plugin images run on here
#   6. the node image: base + kubelet/kubeadm/kubectl + units/configs from node/ + those images
#      imported into containerd's k8s.io namespace; committed as devplug/kind-node:<k8s>-offline-r<rev>
#      (the Python base preloaded as kindest/node preloads its images: a node created from it starts with
#      it, where a `kind load` into each of seven nodes took ~30 s; `kind load` still skips a node that has it)
# Only for machines without a registry; elsewhere use kind's standard kindest/node image.
. "$(dirname "$0")/lib.sh"

NODE_REPO="$IMAGE_PREFIX/kind-node"
NODE_IMAGE="$NODE_REPO:$KUBERNETES_VERSION-offline-r$NODE_LAYOUT_REV"
NODE_PACKAGES="systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iptables,iproute2,util-linux,mount,kmod,procps,jq,ca-certificates,conntrack,ethtool,socat,libseccomp2,nftables,bash"
BASE_IMAGE="$IMAGE_PREFIX/kind-node-base:$DEBIAN_SUITE-$(printf '%s' "$NODE_PACKAGES" | sha256sum | cut -c1-10)"
REG=registry.k8s.io
CP_IMAGES=("$REG/kube-apiserver:$KUBERNETES_VERSION" "$REG/kube-controller-manager:$KUBERNETES_VERSION"
           "$REG/kube-scheduler:$KUBERNETES_VERSION" "$REG/etcd:$ETCD_IMAGE_TAG" "$REG/pause:$PAUSE_VERSION")
WORK="$OFFLINE_CACHE/work"
mkdir -p "$WORK"

inputs_hash() {  # PYTHON_BASE_IMAGE: everything the node image is made from, the preloaded Python base's image ID too
  { (cd "$OFFLINE_DIR" && cat versions.env build-node-image.sh build-k8s.sh build-containerd.sh lib.sh pause/pause.go node/*)
    cat "$REPO_ROOT/src/pytest_devplug/controlplane/gobuild.sh"
    docker image inspect -f '{{.Id}}' "$1"; } | sha256sum | cut -c1-16
}

build_base() {
  apt_ensure debootstrap
  local root="$WORK/node-rootfs"
  rm -rf "$root"; mkdir -p "$root"
  log "debootstrap $DEBIAN_SUITE (minbase + ${NODE_PACKAGES//,/ })"
  debootstrap --variant=minbase --include="$NODE_PACKAGES" "$DEBIAN_SUITE" "$root" "$DEBIAN_MIRROR" \
    > "$WORK/debootstrap-node.log" 2>&1 || { tail -30 "$WORK/debootstrap-node.log" >&2; die "debootstrap failed (log: $WORK/debootstrap-node.log)"; }
  # The systemd trimming kind's base image does: no tmpfiles-setup at sysinit, no enabled units
  # besides the ones we enable, no kmsg reading, binfmt masked.
  rm -f "$root"/lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service
  rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/*
  rm -f "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/basic.target.wants/*
  rm -f "$root"/lib/systemd/system/sockets.target.wants/*udev* "$root"/lib/systemd/system/sockets.target.wants/*initctl*
  echo "ReadKMsg=no" >> "$root/etc/systemd/journald.conf"
  ln -sf /dev/null "$root/etc/systemd/system/systemd-binfmt.service"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
  : > "$root/etc/machine-id"
  log "docker import -> $BASE_IMAGE"
  tar -C "$root" --numeric-owner -c . | docker import \
    --change 'ENV container=docker' \
    --change 'CMD ["/sbin/init"]' \
    --change "LABEL io.devplug.offline.packages=$NODE_PACKAGES" - "$BASE_IMAGE" >/dev/null
  rm -rf "$root"
}

# import_binary_image IMAGE BINARY [ENTRYPOINT_PATH]: a registry-less image holding one static binary
import_binary_image() {
  local image=$1 bin=$2 dest=${3:-/usr/local/bin/$(basename "$2")}
  local root; root=$(mktemp -d "$WORK/img.XXXXXX")
  mkdir -p "$root$(dirname "$dest")" "$root/etc" "$root/tmp" "$root/var/run"
  chmod 1777 "$root/tmp"
  install -m 0755 "$bin" "$root$dest"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
  tar -C "$root" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' --change "ENTRYPOINT [\"$dest\"]" \
    --change "LABEL io.devplug.offline=1" - "$image" >/dev/null
  rm -rf "$root"
  log "  $image"
}

build_component_images() {
  local k8s=$1 etcd=$2
  local pause_bin="$OFFLINE_CACHE/pause/pause"
  mkdir -p "$(dirname "$pause_bin")"
  (cd "$OFFLINE_DIR/pause" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$pause_bin" .)
  import_binary_image "$REG/pause:$PAUSE_VERSION" "$pause_bin" /pause
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    import_binary_image "$REG/$c:$KUBERNETES_VERSION" "$k8s/$c"
  done
  import_binary_image "$REG/etcd:$ETCD_IMAGE_TAG" "$etcd/etcd"
}

build_node() {
  local k8s=$1 ctd=$2 hash=$3 python_base=$4
  local ctr="devplug-node-build-$$"
  local tar="$WORK/cp-images.tar"
  docker save -o "$tar" "${CP_IMAGES[@]}" "$python_base"
  docker rm -f -v "$ctr" >/dev/null 2>&1 || true
  trap 'docker rm -f -v '"$ctr"' >/dev/null 2>&1 || true' EXIT
  # /build-ctd is a volume: containerd's overlayfs snapshotter cannot use the container's overlay root.
  docker run -d --name "$ctr" --privileged --entrypoint sleep --mount type=volume,dst=/build-ctd \
    "$BASE_IMAGE" infinity >/dev/null
  local n="$OFFLINE_DIR/node"
  docker exec "$ctr" mkdir -p /kind/bin /kind/cni /kind/manifests /etc/systemd/system/kubelet.service.d \
    /etc/containerd /etc/kubernetes/manifests /etc/cni/net.d /opt/cni/bin /var/lib/devplug /usr/local/sbin
  for b in kubelet kubeadm kubectl; do docker cp "$k8s/$b" "$ctr:/usr/bin/$b"; done
  # containerd 2.x, its runc shim, ctr and crictl in /usr/local/bin; Debian's containerd 1.6 binaries go, so
  # nothing finds them first (runc stays Debian's)
  docker exec "$ctr" rm -f /usr/bin/containerd /usr/bin/containerd-shim /usr/bin/containerd-shim-runc-v1 \
    /usr/bin/containerd-shim-runc-v2 /usr/bin/ctr /usr/bin/containerd-stress
  for b in containerd containerd-shim-runc-v2 ctr crictl; do docker cp "$ctd/$b" "$ctr:/usr/local/bin/$b"; done
  docker cp "$n/crictl.yaml" "$ctr:/etc/crictl.yaml"
  docker cp "$n/entrypoint" "$ctr:/usr/local/bin/entrypoint"
  docker cp "$n/devplug-runc" "$ctr:/usr/local/sbin/devplug-runc"
  sed "s/@PAUSE_VERSION@/$PAUSE_VERSION/" "$n/containerd-config.toml" > "$WORK/config.toml"
  docker cp "$WORK/config.toml" "$ctr:/etc/containerd/config.toml"
  docker cp "$n/containerd.service" "$ctr:/etc/systemd/system/containerd.service"
  docker cp "$n/kubelet.service" "$ctr:/etc/systemd/system/kubelet.service"
  docker cp "$n/kubelet.slice" "$ctr:/etc/systemd/system/kubelet.slice"
  docker cp "$n/10-kubeadm.conf" "$ctr:/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
  docker cp "$n/11-devplug.conf" "$ctr:/etc/systemd/system/kubelet.service.d/11-devplug.conf"
  docker cp "$n/kubelet.default" "$ctr:/etc/default/kubelet"
  docker cp "$n/sysctl-devplug.conf" "$ctr:/etc/sysctl.d/10-devplug.conf"
  docker cp "$n/10-devplug-ptp.conflist.in" "$ctr:/kind/cni/10-devplug-ptp.conflist.in"
  docker cp "$tar" "$ctr:/build-ctd/images.tar"
  docker exec -i "$ctr" bash -euo pipefail -s <<SH
chmod 0755 /usr/bin/kubelet /usr/bin/kubeadm /usr/bin/kubectl /usr/local/bin/entrypoint /usr/local/sbin/devplug-runc \
  /usr/local/bin/containerd /usr/local/bin/containerd-shim-runc-v2 /usr/local/bin/ctr /usr/local/bin/crictl
mkdir -p /etc/cdi /var/run/cdi
for p in host-local loopback ptp portmap bridge; do cp /usr/lib/cni/\$p /opt/cni/bin/; done
echo "$KUBERNETES_VERSION" > /kind/version
cat > /kind/manifests/default-cni.yaml <<'YAML'
# The offline node ships a static CNI config (/etc/cni/net.d/10-devplug-ptp.conflist, written by
# the entrypoint), so kind's default CNI step has nothing to install; this object only records that.
apiVersion: v1
kind: ConfigMap
metadata:
  name: devplug-offline-cni
  namespace: kube-system
data:
  cni: "static ptp + host-local + portmap, /etc/cni/net.d/10-devplug-ptp.conflist on each node"
YAML
systemctl enable containerd.service kubelet.service >/dev/null 2>&1
mkdir -p /run/ctd-build
# the node's config would start its CRI plugin here too: the import needs none of it
printf 'version = 3\n' > /run/ctd-build/config.toml
containerd --config /run/ctd-build/config.toml --root /build-ctd/root --state /run/ctd-build \
  --address /run/ctd-build/containerd.sock >/build-ctd/containerd.log 2>&1 &
pid=\$!
for i in \$(seq 1 50); do ctr --address /run/ctd-build/containerd.sock version >/dev/null 2>&1 && break; sleep 0.2; done
ctr --address /run/ctd-build/containerd.sock -n k8s.io images import --snapshotter overlayfs /build-ctd/images.tar >/dev/null
ctr --address /run/ctd-build/containerd.sock -n k8s.io images ls -q | grep -v '^sha256:' | sort | sed 's/^/  in node: /' >&2
kill \$pid; wait \$pid || true
mkdir -p /var/lib/containerd
cp -a /build-ctd/root/. /var/lib/containerd/
SH
  local old; old=$(docker image inspect -f '{{.Id}}' "$NODE_IMAGE" 2>/dev/null || true)
  docker commit \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
    --change 'ENV container=docker' \
    --change "LABEL io.devplug.offline.inputs=$hash io.devplug.offline.kubernetes=$KUBERNETES_VERSION" \
    "$ctr" "$NODE_IMAGE" >/dev/null
  docker rm -f -v "$ctr" >/dev/null
  trap - EXIT
  # the previous build of this tag is now untagged: remove it unless something still uses it
  [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$NODE_IMAGE")" ] && docker rmi "$old" >/dev/null 2>&1 || true
  rm -f "$tar"
}

main() {
  lock node-image
  step "docker" ensure_docker
  local python_base hash
  python_base=$("$OFFLINE_DIR/build-python-base.sh" | tail -1)
  hash=$(inputs_hash "$python_base")
  if [ "$(image_label "$NODE_IMAGE" io.devplug.offline.inputs)" = "$hash" ]; then
    log "node image $NODE_IMAGE is up to date (inputs $hash)"
    echo "$NODE_IMAGE"; return 0
  fi
  local bins k8s etcd ctd
  bins=$("$OFFLINE_DIR/build-k8s.sh")
  k8s=$(sed -n 1p <<<"$bins"); etcd=$(sed -n 2p <<<"$bins")
  ctd=$("$OFFLINE_DIR/build-containerd.sh")
  if image_exists "$BASE_IMAGE"; then log "base image $BASE_IMAGE cached"
  else step "node rootfs ($BASE_IMAGE)" build_base; fi
  local missing=0
  for i in "${CP_IMAGES[@]}"; do image_exists "$i" || missing=1; done
  if [ $missing = 0 ] && [ "$(image_label "$REG/pause:$PAUSE_VERSION" io.devplug.offline)" = 1 ]; then
    log "control-plane images cached"
  else step "control-plane images" build_component_images "$k8s" "$etcd"; fi
  step "node image $NODE_IMAGE" build_node "$k8s" "$ctd" "$hash" "$python_base"
  echo "$NODE_IMAGE"
}
main "$@"
