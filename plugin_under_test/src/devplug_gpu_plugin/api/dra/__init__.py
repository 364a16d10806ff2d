"""DRA kubelet-plugin API v1 and v1beta1 (generated stubs)."""
