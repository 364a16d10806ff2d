#!/usr/bin/env bash
# Print the path of a `kind` binary: the one on PATH when there is one, otherwise one built with
# `go install sigs.k8s.io/kind@$KIND_VERSION` into the cache (built once, reused after).
. "$(dirname "$0")/lib.sh"

if [ -n "${KIND_BIN:-}" ] && [ -x "$KIND_BIN" ]; then echo "$KIND_BIN"; exit 0; fi
if command -v kind >/dev/null 2>&1; then command -v kind; exit 0; fi

lock kind
bin="$CACHE_ROOT/bin/kind-$KIND_VERSION"
if [ ! -x "$bin/kind" ]; then
  [ -x "$GO" ] || die "no kind on PATH and no Go toolchain to build it with"
  mkdir -p "$bin"
  step "go install sigs.k8s.io/kind@$KIND_VERSION" \
    env GOBIN="$bin" CGO_ENABLED=0 "$GO" install "sigs.k8s.io/kind@$KIND_VERSION"
fi
"$bin/kind" version >&2
echo "$bin/kind"
