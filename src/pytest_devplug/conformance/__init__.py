"""The shipped conformance suite: ``pytest --pyargs pytest_devplug.conformance`` or ``devplug conformance``.

It runs against whatever plugin the devplug options (or an overriding ``devplug_plugin_spec``
fixture) name. Tests marked ``devplug_mock`` inject faults through the mock-NVML state file; for a
plugin without it they are skipped with that reason (``--devplug-missing-mock=fail`` makes them
fail). Tests that need NUMA topology or ``pre_start_required`` skip, saying so, when the plugin
under test has neither. To run the suite inside your own test run (with your conftest.py), add a
module with ``from pytest_devplug.conformance.suite import *``.
"""
