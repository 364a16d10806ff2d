from pytest_devplug.conformance.suite import *  # noqa: F403
