"""pytest entry point of pytest-devplug (options, ini keys and fixtures)."""
