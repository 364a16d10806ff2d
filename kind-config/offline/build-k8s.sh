#!/usr/bin/env bash
# Build the Kubernetes binaries (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl; then kubelet and
# kubeadm unless --control-plane) and etcd from their Go modules, statically, into the cache. Prints the bin dirs.
# The build itself is the package's (src/pytest_devplug/controlplane/gobuild.sh, what `devplug control-plane build`
# runs), so a wheel and the offline kind build share one cache and one recipe.
. "$(dirname "$0")/lib.sh"
gobuild_main "$@"
