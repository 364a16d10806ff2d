#!/usr/bin/env bash
# Build a local Python base image (the stand-in for python:3.12-slim where nothing can be pulled):
# Debian from debootstrap + python3 + pip, imported with `docker import`. Prints the image name.
#
#   img=$(kind-config/offline/build-python-base.sh)
#   docker build --build-arg BASE_IMAGE="$img" plugin_under_test
#
# Containers on the CI machines reach PyPI's address but cannot verify its TLS chain (the machine's
# intercepting CA is in the host's trust store only), so nothing here relies on pip inside
# `docker build`: the plugin's Dockerfile installs from dist/, filled on the host with
# `pip wheel --no-deps` (the plugin) + `pip download --only-binary=:all: --python-version <image's>`
# (its dependencies) -- what tests/kind/test_smoke.py does. pip in the image works where PyPI is
# reachable normally.
. "$(dirname "$0")/lib.sh"

PY_PACKAGES="python3,python3-pip,python3-venv,python-is-python3,ca-certificates,tzdata,netbase"
PY_IMAGE="$IMAGE_PREFIX/python-base:$DEBIAN_SUITE-r$PYTHON_BASE_REV"
KEY=$(printf '%s|%s|%s' "$PY_PACKAGES" "$DEBIAN_SUITE" "$PYTHON_BASE_REV" | sha256sum | cut -c1-16)

build() {
  apt_ensure debootstrap
  local root="$OFFLINE_CACHE/work/python-rootfs"
  rm -rf "$root"; mkdir -p "$root"
  log "debootstrap $DEBIAN_SUITE (minbase + ${PY_PACKAGES//,/ })"
  debootstrap --variant=minbase --include="$PY_PACKAGES" "$DEBIAN_SUITE" "$root" "$DEBIAN_MIRROR" \
    > "$OFFLINE_CACHE/work/debootstrap-python.log" 2>&1 \
    || { tail -30 "$OFFLINE_CACHE/work/debootstrap-python.log" >&2; die "debootstrap failed"; }
  # behave like the official python images: `pip install` works system-wide without a venv
  rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
  # the host's resolver settings are not part of the image; Docker provides /etc/resolv.conf
  : > "$root/etc/resolv.conf"
  local pyver; pyver=$(chroot "$root" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  log "python $pyver; docker import -> $PY_IMAGE"
  tar -C "$root" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
    --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' --change 'ENV PIP_ROOT_USER_ACTION=ignore' \
    --change 'CMD ["python3"]' \
    --change "LABEL io.devplug.offline.python-base=$KEY io.devplug.offline.python=$pyver" \
    - "$PY_IMAGE" >/dev/null
  rm -rf "$root"
}

lock python-base
step "docker" ensure_docker
if [ "$(image_label "$PY_IMAGE" io.devplug.offline.python-base)" = "$KEY" ]; then
  log "python base $PY_IMAGE is up to date"
else
  step "python base image $PY_IMAGE" build
fi
echo "$PY_IMAGE"
