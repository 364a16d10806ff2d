"""The checkpoint-survival check compares Allocate responses as the kubelet does, not byte for byte.

A real kubelet re-marshals the responses it restored when it writes its checkpoint again, and Go marshals a proto
map in random order: NVIDIA's device plugin (four envs) failed the check on kind with the same response re-ordered.
"""

from __future__ import annotations

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.assertions import _same_response


def _envs(**envs: str) -> bytes:
    return pb.ContainerAllocateResponse(envs=envs).SerializeToString()


def test_map_entries_in_another_order_are_the_same_response() -> None:
    # concatenated messages merge: the same map, its entries on the wire in two orders
    one, other = _envs(A="1") + _envs(B="2"), _envs(B="2") + _envs(A="1")
    assert one != other
    assert _same_response(one, other)


def test_a_changed_value_or_entry_is_another_response() -> None:
    before = _envs(NVIDIA_VISIBLE_DEVICES="GPU-0", NVIDIA_GDS="enabled")
    assert not _same_response(before, _envs(NVIDIA_VISIBLE_DEVICES="GPU-1", NVIDIA_GDS="enabled"))
    assert not _same_response(before, _envs(NVIDIA_VISIBLE_DEVICES="GPU-0"))


def test_bytes_that_are_no_response_compare_as_bytes() -> None:
    assert _same_response(b"\xff\xff", b"\xff\xff")
    assert not _same_response(b"\xff\xff", _envs(A="1"))
