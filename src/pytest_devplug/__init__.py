"""pytest-devplug: end-to-end tests for Kubernetes device plugins."""
