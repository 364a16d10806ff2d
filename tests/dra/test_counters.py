"""Shared counters of partitionable devices, read as the scheduler reads them: which devices fit together."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from pytest_devplug.dra.counters import PoolCounters, overdrawn, together


def _use(counter_set: str, memory: str, compute: str) -> dict[str, Any]:
    return {"counterSet": counter_set, "counters": {"memory": {"value": memory}, "compute": {"value": compute}}}


def _slices(gpus: int, parts: int) -> list[dict[str, Any]]:
    """As dra-example-driver v0.4.0 publishes ``--gpu-partitions``: a counters slice, then every GPU whole and in
    ``parts`` partitions, each consuming its GPU's counter set; plus a device that consumes nothing."""
    sets = [
        {"name": f"gpu-{i}-counter-set", "counters": {"memory": {"value": "80Gi"}, "compute": {"value": "8"}}}
        for i in range(gpus)
    ]
    devices: list[dict[str, Any]] = [{"name": "nic-0"}]
    for i in range(gpus):
        cs = f"gpu-{i}-counter-set"
        devices.append({"name": f"gpu-{i}", "consumesCounters": [_use(cs, "80Gi", "8")]})
        devices += [
            {"name": f"gpu-{i}-partition-{j}", "consumesCounters": [_use(cs, f"{80 // parts}Gi", str(8 // parts))]}
            for j in range(parts)
        ]
    pool = {"name": "node-1", "generation": 1, "resourceSliceCount": 2}
    return [{"spec": {"pool": pool, "sharedCounters": sets}}, {"spec": {"pool": pool, "devices": devices}}]


def test_partitions_fit_together_and_their_gpu_does_not() -> None:
    counters = PoolCounters.of(_slices(2, 2))
    names = [("node-1", d["name"]) for d in _slices(2, 2)[1]["spec"]["devices"]]
    assert counters.partitionable
    got = together(counters, names)
    assert got == [("node-1", n) for n in ("nic-0", "gpu-0-partition-0", "gpu-0-partition-1")] + [
        ("node-1", n) for n in ("gpu-1-partition-0", "gpu-1-partition-1")
    ], got
    assert not overdrawn(counters, got)


def test_a_gpu_with_its_own_partition_overdraws_its_counters() -> None:
    counters = PoolCounters.of(_slices(1, 2))
    over = overdrawn(counters, [("node-1", "gpu-0"), ("node-1", "gpu-0-partition-1")])
    assert over == {
        ("node-1", "gpu-0-counter-set", "memory"): (Fraction(120 * 2**30), Fraction(80 * 2**30)),
        ("node-1", "gpu-0-counter-set", "compute"): (Fraction(12), Fraction(8)),
    }
    assert not overdrawn(counters, [("node-1", "gpu-0")])


def test_no_counters_means_every_device() -> None:
    slices = [{"spec": {"pool": {"name": "p"}, "devices": [{"name": "a"}, {"name": "b"}]}}]
    counters = PoolCounters.of(slices)
    assert not counters.partitionable
    assert together(counters, [("p", "a"), ("p", "b")]) == [("p", "a"), ("p", "b")]
