"""The embedded kubelet: a faithful device manager with a small control plane around it."""
