"""DRA-layer tests: the kubelet's DRA side against fake drivers."""
