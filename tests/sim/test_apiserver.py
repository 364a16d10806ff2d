"""API-server rules for extended resources, with upstream's messages and field paths."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pytest_devplug.sim.apiserver import admit_pod, is_extended_resource, parse_quantity
from pytest_devplug.sim.errors import ApiError

from _helpers import GPU, pod


@pytest.mark.parametrize(
    ("raw", "value", "canonical"),
    [("1", 1, "1"), (1, 1, "1"), ("500m", Fraction(1, 2), "500m"), (0.5, Fraction(1, 2), "500m"),
     ("2000", 2000, "2k"), ("1.5", Fraction(3, 2), "1500m"), ("1Ki", 1024, "1Ki"), ("1536", 1536, "1536"),
     ("2e3", 2000, "2e3"), ("0", 0, "0")],
)
def test_quantity_parsing_and_canonical_form(raw: object, value: object, canonical: str) -> None:
    q = parse_quantity(raw)
    assert q.value == value
    assert str(q) == canonical


def test_bad_quantity_is_a_400() -> None:
    with pytest.raises(ApiError) as ei:
        admit_pod(pod("p", "two"))
    assert ei.value.status == 400 and "quantities must match the regular expression" in ei.value.message


def test_extended_resource_names() -> None:
    assert is_extended_resource(GPU) and is_extended_resource("example.com/fpga")
    assert not is_extended_resource("cpu")
    assert not is_extended_resource("kubernetes.io/foo") and not is_extended_resource("requests.nvidia.com/gpu")


def test_defaulting_copies_limit_into_requests_and_fills_identity() -> None:
    p = admit_pod(pod("p", 2))
    assert p["spec"]["containers"][0]["resources"]["requests"] == {GPU: "2"}
    assert p["metadata"]["namespace"] == "default"
    assert len(p["metadata"]["uid"]) == 36 and p["metadata"]["creationTimestamp"].endswith("Z")
    assert p["spec"]["restartPolicy"] == "Always"


def test_non_integer_is_rejected_with_unquoted_quantity() -> None:
    with pytest.raises(ApiError) as ei:
        admit_pod(pod("p", "500m"))
    e = ei.value
    assert (e.status, e.reason) == (422, "Invalid")
    # the limit is copied into requests first, so both paths fail (as on a real API server)
    assert e.message == (
        'Pod "p" is invalid: [spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "500m": '
        'must be an integer, spec.containers[0].resources.requests[nvidia.com/gpu]: Invalid value: "500m": '
        "must be an integer]"
    )


def test_requests_only_is_rejected() -> None:
    with pytest.raises(ApiError) as ei:
        admit_pod(pod("p", None, requests=1))
    assert ei.value.message == (
        'Pod "p" is invalid: spec.containers[0].resources.limits: Required value: '
        "Limit must be set for non overcommitable resources"
    )


def test_request_not_equal_limit_is_rejected() -> None:
    with pytest.raises(ApiError) as ei:
        admit_pod(pod("p", 1, requests="2"))
    assert ei.value.message == (
        'Pod "p" is invalid: spec.containers[0].resources.requests: Invalid value: "2": '
        "must be equal to nvidia.com/gpu limit of 1"
    )


def test_cpu_may_overcommit_but_not_exceed_limit() -> None:
    ok = pod("p", None)
    ok["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}}
    admit_pod(ok)
    bad = pod("p", None)
    bad["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}, "requests": {"cpu": "1500m"}}
    with pytest.raises(ApiError, match=r'requests: Invalid value: "1500m": must be less than or equal to cpu limit of 1'):
        admit_pod(bad)


def test_init_container_paths_and_missing_fields() -> None:
    p = pod("p", 1, init=[{"name": "i", "image": "x", "resources": {"limits": {GPU: "0.5"}}}])
    with pytest.raises(ApiError, match=r'spec.initContainers\[0\].resources.limits\[nvidia.com/gpu\]: Invalid value: "500m"'):
        admit_pod(p)
    with pytest.raises(ApiError, match=r"spec.containers\[0\].image: Required value"):
        admit_pod({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}})
    with pytest.raises(ApiError, match=r"metadata.name: Required value: name or generateName is required"):
        admit_pod({"metadata": {}, "spec": {"containers": [{"name": "c", "image": "x"}]}})


def test_generate_name_and_v1pod_models() -> None:
    from kubernetes import client

    model = client.V1Pod(
        metadata=client.V1ObjectMeta(generate_name="gpu-"),
        spec=client.V1PodSpec(containers=[client.V1Container(
            name="c", image="x", resources=client.V1ResourceRequirements(limits={GPU: "1"}))]),
    )
    p = admit_pod(model)
    assert p["metadata"]["name"].startswith("gpu-") and len(p["metadata"]["name"]) == 9
    assert p["spec"]["containers"][0]["resources"]["requests"] == {GPU: "1"}
