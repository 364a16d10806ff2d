"""The shipped conformance suite: ``pytest --pyargs pytest_devplug.conformance`` or ``devplug conformance``.

It runs against whatever plugin the devplug options (or an overriding ``devplug_plugin_spec``
fixture) name, and judges it by what the kubelet and the device-plugin API require. Checks of one
plugin family's conventions (``test_convention_*``, marked ``devplug_convention``) run only for a
plugin that declares them (``--devplug-conventions``; the included plugin declares all). Fault tests
use the ``devplug_faults`` fixture (:mod:`pytest_devplug.faults`): the mock NVML, or the injector a
conftest provides; without one they skip naming the contract (``--devplug-missing-faults=fail``
makes them fail). Tests that need NUMA topology or ``pre_start_required`` skip, saying so, when the
plugin under test has neither; the several-resources checks skip for a plugin declared with one resource.
To run the suite inside your own test run (with your conftest.py), add a
module with ``from pytest_devplug.conformance.suite import *``.
"""
