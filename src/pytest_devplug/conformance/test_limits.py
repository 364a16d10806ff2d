"""The API server's and scheduler's rules for an extended resource (limits, requests, integers, fit)."""

from __future__ import annotations

import pytest

from pytest_devplug import PodFactory, PodRejectedError, assert_limit_rules


def test_limit_rules_table(devplug_pod: PodFactory) -> None:
    """Every row of the table at once (see ``assert_limit_rules``)."""
    assert_limit_rules(devplug_pod)


def test_requests_only_rejected_with_upstream_message(devplug_pod: PodFactory) -> None:
    with pytest.raises(PodRejectedError) as err:
        devplug_pod(requests=1)
    assert err.value.status == 422
    assert "Limit must be set for non overcommitable resources" in err.value.message


def test_more_than_allocatable_stays_pending(devplug_pod: PodFactory) -> None:
    """The scheduler leaves the pod Pending with ``Insufficient <resource>``; it is never bound."""
    alloc = devplug_pod.backend.get_node(devplug_pod.node)["status"]["allocatable"][devplug_pod.resource_name]
    pod = devplug_pod(gpus=int(alloc) + 1)
    msg = pod.wait_event(f"FailedScheduling: .*Insufficient {devplug_pod.resource_name}")
    assert pod.phase == "Pending" and pod.node_name is None, f"{pod.phase} on {pod.node_name}; {msg}"
    unsched = [c for c in pod.conditions if c.get("type") == "PodScheduled"]
    assert unsched and unsched[0].get("status") == "False" and unsched[0].get("reason") == "Unschedulable", unsched
