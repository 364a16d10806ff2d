"""DRA device-health API v1alpha1 (generated stubs)."""
