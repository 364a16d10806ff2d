"""API-server rules for extended resources, with upstream's messages and field paths."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pytest_devplug.sim.apiserver import admit_pod, decode_quantity, is_extended_resource, parse_quantity
from pytest_devplug.errors import ApiError

from ._helpers import GPU, pod


@pytest.mark.parametrize(
    ("raw", "value", "canonical"),
    [
        ("1", 1, "1"),
        (1, 1, "1"),
        ("500m", Fraction(1, 2), "500m"),
        (0.5, Fraction(1, 2), "500m"),
        ("2000", 2000, "2k"),
        ("1.5", Fraction(3, 2), "1500m"),
        ("1Ki", 1024, "1Ki"),
        ("1536", 1536, "1536"),
        ("2e3", 2000, "2e3"),
        ("0", 0, "0"),
    ],
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
    with pytest.raises(
        ApiError, match=r'requests: Invalid value: "1500m": must be less than or equal to cpu limit of 1'
    ):
        admit_pod(bad)


def test_init_container_paths_and_missing_fields() -> None:
    p = pod("p", 1, init=[{"name": "i", "image": "x", "resources": {"limits": {GPU: "0.5"}}}])
    with pytest.raises(
        ApiError, match=r'spec.initContainers\[0\].resources.limits\[nvidia.com/gpu\]: Invalid value: "500m"'
    ):
        admit_pod(p)
    with pytest.raises(ApiError, match=r"spec.containers\[0\].image: Required value"):
        admit_pod({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}})
    with pytest.raises(ApiError, match=r"metadata.name: Required value: name or generateName is required"):
        admit_pod({"metadata": {}, "spec": {"containers": [{"name": "c", "image": "x"}]}})


def test_generate_name_and_v1pod_models() -> None:
    from kubernetes import client

    model = client.V1Pod(
        metadata=client.V1ObjectMeta(generate_name="gpu-"),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(name="c", image="x", resources=client.V1ResourceRequirements(limits={GPU: "1"}))
            ]
        ),
    )
    p = admit_pod(model)
    assert p["metadata"]["name"].startswith("gpu-") and len(p["metadata"]["name"]) == 9
    assert p["spec"]["containers"][0]["resources"]["requests"] == {GPU: "1"}


# --- names and quantities a real API server refuses (issue 11) -----------------------------------

_QUALIFIED = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_NOT_EXTENDED = "doesn't follow extended resource name standard"


def _with_limit(name: str) -> dict[str, object]:
    manifest = pod("p", None)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {name: "1"}}
    return manifest


@pytest.mark.parametrize(
    ("name", "messages"),
    [
        ("example.com/has space", [_QUALIFIED, _NOT_EXTENDED]),
        ("example.com/gpu\n", [_QUALIFIED, _NOT_EXTENDED]),
        ("EXAMPLE.com/gpu", ["prefix part " + _SUBDOMAIN, _NOT_EXTENDED]),
        ("example.com/" + "g" * 64, ["name part must be no more than 63 characters", _NOT_EXTENDED]),
        ("e" * 254 + "/gpu", ["prefix part must be no more than 253 characters", _NOT_EXTENDED]),
        ("gpu", ["must be a standard resource type or fully qualified", "must be a standard resource for containers"]),
    ],
)
def test_limit_names_are_validated_like_upstream(name: str, messages: list[str]) -> None:
    with pytest.raises(ApiError) as ei:
        admit_pod(_with_limit(name))
    for msg in messages:
        assert msg in ei.value.message
    assert ei.value.status == 422


def test_limit_name_with_three_parts_is_not_a_qualified_name() -> None:
    with pytest.raises(ApiError) as ei:
        admit_pod(_with_limit("example.com/a/b"))
    assert (
        'limits[example.com/a/b]: Invalid value: "example.com/a/b": a qualified name must consist of'
        in ei.value.message
    )


@pytest.mark.parametrize("name", ["pod\n", "Pod", "p_d", "-p", "p" * 254])
def test_pod_names_are_dns1123_subdomains(name: str) -> None:
    with pytest.raises(ApiError) as ei:
        admit_pod(pod(name))
    assert ei.value.status == 422 and "metadata.name: Invalid value: " in ei.value.message
    if name == "pod\n":
        assert 'Invalid value: "pod\\n"' in ei.value.message  # Go's %q


@pytest.mark.parametrize("raw", ["1\n", "\t1", "1 Gi", "", "0x1", "١"])
def test_quantities_with_escaped_white_space_are_refused(raw: str) -> None:
    """The Python client sends ``json.dumps`` text: a newline or tab arrives escaped, and the API
    server's ``strings.TrimSpace`` does not remove an escape."""
    with pytest.raises(ApiError) as ei:
        decode_quantity(raw)
    assert ei.value.status == 400
    with pytest.raises(ValueError, match="is not a quantity"):
        parse_quantity(raw)  # the model's parser says what is wrong, for readers other than the API server


def test_quantity_spaces_around_are_trimmed_as_upstream() -> None:
    """``Quantity.UnmarshalJSON`` calls ``strings.TrimSpace`` (upstream keeps it with a TODO)."""
    assert str(parse_quantity(" 1 ")) == "1"
