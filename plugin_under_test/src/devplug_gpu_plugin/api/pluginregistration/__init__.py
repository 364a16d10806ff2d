"""pluginregistration v1: the plugin watcher's registration API (generated stubs)."""
