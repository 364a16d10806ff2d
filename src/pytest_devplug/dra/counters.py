"""Partitionable devices (KEP-4815): the shared counters a driver's slices publish and what devices consume of them.

A ResourceSlice of a pool either lists devices or defines ``sharedCounters`` (counter sets: a physical GPU's memory
and compute), and each device names what it takes of them (``consumesCounters``). The scheduler allocates a set of
devices only when, for every counter, what they consume together is at most the counter's value
(``k8s.io/dynamic-resource-allocation/structured``): a GPU and its own partitions never all at once. A check that
claims "every device" must claim a set the counters allow; this module finds one and tells a set that overdraws.
Pure rules: slices in, names out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..kubeletmodel.quantity import parse_quantity

__all__ = ["Consumption", "CounterKey", "DeviceKey", "PoolCounters", "overdrawn", "together"]

#: (pool, device): a device as a claim's allocation names it.
DeviceKey = tuple[str, str]
#: (pool, counter set, counter).
CounterKey = tuple[str, str, str]
#: What one device takes: counter -> amount.
Consumption = Mapping[CounterKey, Fraction]


@dataclass(frozen=True)
class PoolCounters:
    """The counters of a driver's pools and what each device consumes of them (devices consuming none are absent)."""

    values: Mapping[CounterKey, Fraction]
    consumes: Mapping[DeviceKey, Consumption]

    @classmethod
    def of(cls, slices: Iterable[Mapping[str, Any]]) -> PoolCounters:
        """Read ``ResourceSlice`` objects (as the API server answers them)."""
        values: dict[CounterKey, Fraction] = {}
        consumes: dict[DeviceKey, dict[CounterKey, Fraction]] = {}
        for obj in slices:
            spec = obj.get("spec") or {}
            pool = str((spec.get("pool") or {}).get("name", ""))
            for counter_set in spec.get("sharedCounters") or []:
                for counter, c in (counter_set.get("counters") or {}).items():
                    values[(pool, str(counter_set.get("name", "")), counter)] = parse_quantity(c.get("value")).value
            for device in spec.get("devices") or []:
                taken: dict[CounterKey, Fraction] = {}
                for use in device.get("consumesCounters") or []:
                    for counter, c in (use.get("counters") or {}).items():
                        key = (pool, str(use.get("counterSet", "")), counter)
                        taken[key] = taken.get(key, Fraction(0)) + parse_quantity(c.get("value")).value
                if taken:
                    consumes[(pool, str(device.get("name", "")))] = taken
        return cls(values, consumes)

    @property
    def partitionable(self) -> bool:
        """Whether any device consumes shared counters."""
        return bool(self.consumes)

    def share(self, device: DeviceKey) -> Fraction:
        """How much of its counters ``device`` takes, summed over them as fractions of each counter's value."""
        shares = (amount / v if (v := self.values.get(key)) else Fraction(1) for key, amount in self.taken_by(device))
        return sum(shares, Fraction(0))

    def taken_by(self, device: DeviceKey) -> Iterable[tuple[CounterKey, Fraction]]:
        """What ``device`` consumes, counter by counter (nothing for a device outside every counter set)."""
        return (self.consumes.get(device) or {}).items()


def overdrawn(counters: PoolCounters, devices: Iterable[DeviceKey]) -> dict[CounterKey, tuple[Fraction, Fraction]]:
    """The counters ``devices`` together take more of than they hold (a counter no slice defines holds 0):
    counter -> (taken, value)."""
    taken: dict[CounterKey, Fraction] = {}
    for device in devices:
        for key, amount in counters.taken_by(device):
            taken[key] = taken.get(key, Fraction(0)) + amount
    return {
        k: (t, counters.values.get(k, Fraction(0))) for k, t in taken.items() if t > counters.values.get(k, Fraction(0))
    }


def together(counters: PoolCounters, devices: Sequence[DeviceKey]) -> list[DeviceKey]:
    """A largest set of ``devices`` the counters allow at once, found greedily: the devices that take the smallest
    share of their counters first (a GPU's partitions before the GPU), each kept when it still fits. Devices that
    consume no counter are always in it. Sorted like ``devices``."""
    chosen: list[DeviceKey] = []
    for device in sorted(devices, key=lambda d: (counters.share(d), devices.index(d))):
        if not overdrawn(counters, [*chosen, device]):
            chosen.append(device)
    return [d for d in devices if d in chosen]
