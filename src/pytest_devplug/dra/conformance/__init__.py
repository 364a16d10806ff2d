"""The shipped DRA conformance suite: ``devplug conformance --dra`` or ``pytest --pyargs pytest_devplug.dra.conformance
--devplug-control-plane real``.

It judges the DRA driver the options (or an overriding ``devplug_driver_spec`` fixture) name by what the kubelet
and the ``resource.k8s.io/v1`` API require, in the scenarios of upstream's ``test/e2e_node/dra_test.go``
(``docs/explanation/upstream-dra-scenarios.md`` maps each ``It()`` to its check): registration and
re-registration, slices published and wiped, prepare and unprepare (idempotent, retried, across kubelet restarts
and pods deleted meanwhile), scheduling, shared claims, the kubelet's checkpoint and device health in the pod
status. Checks that need a fault
use the ``devplug_dra_faults`` fixture (:mod:`pytest_devplug.dra.faults`); without an injector they skip naming
the contract. To run the suite inside your own test run, add a module with
``from pytest_devplug.dra.conformance.suite import *``.
"""
