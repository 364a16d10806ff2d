"""The plugin watcher and the DRA plugin manager against fake drivers over real gRPC sockets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .dra_fakes import FakeDriver, FakeWiper, pod

from pytest_devplug.waiting import wait_for

T = 10.0


def _registered(k: Any, name: str) -> Callable[[], list[str]]:
    return lambda: k.plugins.registered().get(name, [])


def test_driver_registers_and_is_told_so(dra_kubelet: Any, dra_drivers: Callable[..., FakeDriver]) -> None:
    d = dra_drivers()
    seen = wait_for(_registered(dra_kubelet, d.name), bool, timeout=T, what="the driver registered")
    assert seen == [str(d.dra_socket)]
    wait_for(lambda: d.calls.statuses, bool, timeout=T, what="NotifyRegistrationStatus sent")
    assert d.calls.statuses == [(True, "")]
    plugin = dra_kubelet.plugins.get_plugin(d.name)
    assert plugin.chosen_service == "v1.DRAPlugin"
    kinds = wait_for(
        lambda: [e.kind for e in dra_kubelet.watcher.events_for(d.reg_socket)],
        bool,
        timeout=T,
        what="the outcome recorded",
    )
    assert kinds == ["registered"]


def test_first_supported_service_of_the_plugins_list_wins(
    dra_kubelet: Any, dra_drivers: Callable[..., FakeDriver], dra_claims: Any
) -> None:
    d = dra_drivers(versions=("v1alpha4.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin"), serve=("v1beta1",))
    wait_for(_registered(dra_kubelet, d.name), bool, timeout=T, what="the driver registered")
    assert dra_kubelet.plugins.get_plugin(d.name).chosen_service == "v1beta1.DRAPlugin"
    # the calls then go to the v1beta1 service (the fake serves only that one)
    p = pod("p", "pod-1", "c")
    dra_claims.claim("c", "claim-1", d.name, p)
    wait_for(lambda: dra_kubelet.plugins.usable(d.name), bool, timeout=T, what="the driver connected")
    dra_kubelet.manager.prepare_resources(p)
    assert d.calls.dra == [("v1beta1", "prepare", ["claim-1"])]


def test_unsupported_versions_are_refused_with_upstreams_text(
    dra_kubelet: Any, dra_drivers: Callable[..., FakeDriver]
) -> None:
    d = dra_drivers(versions=("v1alpha3.DRAPlugin",))
    wait_for(lambda: d.calls.statuses, bool, timeout=T, what="a registration verdict")
    ok, error = d.calls.statuses[0]
    assert not ok
    assert error == (
        "RegisterPlugin error -- plugin validation failed with err: "
        "invalid supported gRPC versions of DRA driver plugin "
        f'{d.name} at endpoint {d.dra_socket}: none of services supported by the plugin (["v1alpha3.DRAPlugin"]) '
        'are supported by the kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
    )
    assert dra_kubelet.plugins.registered() == {}


def test_empty_version_list_and_unknown_plugin_type(dra_kubelet: Any, dra_drivers: Callable[..., FakeDriver]) -> None:
    a = dra_drivers("a.example.com", versions=())
    b = dra_drivers("b.example.com", plugin_type="CSIPlugin")
    wait_for(lambda: a.calls.statuses and b.calls.statuses, bool, timeout=T, what="both verdicts")
    assert a.calls.statuses[0][0] is False and "empty list of supported gRPC services" in a.calls.statuses[0][1]
    assert b.calls.statuses[0] == (
        False,
        f"RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket {b.reg_socket}",
    )


def test_empty_endpoint_means_the_registration_socket(
    dra_kubelet: Any, dra_drivers: Callable[..., FakeDriver], dra_claims: Any
) -> None:
    d = dra_drivers(endpoint="")
    assert wait_for(_registered(dra_kubelet, d.name), bool, timeout=T, what="registered") == [str(d.reg_socket)]
    p = pod("p", "pod-1", "c")
    dra_claims.claim("c", "claim-1", d.name, p)
    dra_kubelet.manager.prepare_resources(p)
    assert d.calls.dra == [("v1", "prepare", ["claim-1"])]


def test_failed_registration_is_retried_until_it_works(
    dra_kubelet: Any, dra_drivers: Callable[..., FakeDriver]
) -> None:
    d = FakeDriver(dra_kubelet.root, "late.example.com")
    d.get_info_failures = 2  # GetInfo answers Unavailable twice; the watcher backs off (0.5 s, 1 s) and asks again
    d.start()
    try:
        wait_for(_registered(dra_kubelet, d.name), bool, timeout=T, what="registered after retries")
        assert d.calls.get_info == 3
        kinds = wait_for(
            lambda: [e.kind for e in dra_kubelet.watcher.events_for(d.reg_socket)],
            lambda k: "registered" in k,
            timeout=T,
            what="the outcomes recorded",
        )
        assert kinds == ["failed", "failed", "registered"]
        assert "failed to get plugin info using RPC GetInfo" in dra_kubelet.watcher.events_for(d.reg_socket)[0].detail
    finally:
        d.stop()


def test_refused_driver_recovers_when_it_comes_back_fixed(dra_kubelet: Any, dra_root: Any) -> None:
    bad = FakeDriver(dra_root, "fix.example.com", versions=("v0.DRAPlugin",)).start()
    try:
        wait_for(lambda: bad.calls.statuses, bool, timeout=T, what="the refusal")
    finally:
        bad.stop()
    good = FakeDriver(dra_root, "fix.example.com").start()
    try:
        wait_for(_registered(dra_kubelet, good.name), bool, timeout=T, what="the fixed driver registered")
        # the verdict is sent just after the handler accepted the plugin
        assert wait_for(lambda: good.calls.statuses, bool, timeout=T, what="the verdict") == [(True, "")]
    finally:
        good.stop()


def test_socket_removal_deregisters_and_wipes_slices_after_the_delay(
    dra_kubelet_factory: Callable[..., Any], dra_drivers: Callable[..., FakeDriver], dra_wiper: FakeWiper
) -> None:
    k = dra_kubelet_factory(wiping_delay=0.3)
    wait_for(lambda: k.plugins.wiped, bool, timeout=T, what="the startup wipe")
    assert dra_wiper.calls == [("node-1", None)]  # every slice of the node, once, at kubelet start
    d = dra_drivers()
    wait_for(lambda: k.plugins.usable(d.name), bool, timeout=T, what="the driver connected")
    d.stop()
    wait_for(_registered(k, d.name), lambda r: r == [], timeout=T, what="deregistered")
    wait_for(lambda: k.plugins.wiped, lambda w: d.name in w, timeout=T, what="the driver's slices wiped")
    assert k.plugins.wiped == [None, d.name]
    assert ("node-1", d.name) in dra_wiper.calls
    assert [e.kind for e in k.watcher.events_for(d.reg_socket)] == ["registered", "deregistered"]


def test_quick_driver_restart_keeps_its_slices(
    dra_kubelet_factory: Callable[..., Any], dra_root: Any, dra_wiper: FakeWiper
) -> None:
    k = dra_kubelet_factory(wiping_delay=30.0)
    d = FakeDriver(dra_root).start()
    try:
        wait_for(lambda: k.plugins.usable(d.name), bool, timeout=T, what="connected")
        d.stop()
        wait_for(lambda: k.plugins.usable(d.name), lambda u: not u, timeout=T, what="disconnect noticed")
        assert k.plugins.pending_wipes() == [d.name]
        d = FakeDriver(dra_root).start()
        wait_for(lambda: k.plugins.usable(d.name), bool, timeout=T, what="the restarted driver connected")
        assert k.plugins.pending_wipes() == [], "the pending wipe was not cancelled"
        assert (("node-1", d.name)) not in dra_wiper.calls
    finally:
        d.stop()


def test_replaced_socket_registers_again(
    dra_kubelet: Any, dra_drivers: Callable[..., FakeDriver], dra_root: Any
) -> None:
    d = dra_drivers()
    wait_for(_registered(dra_kubelet, d.name), bool, timeout=T, what="registered")
    d.stop()
    d2 = dra_drivers()
    wait_for(lambda: d2.calls.statuses, bool, timeout=T, what="the new socket registered")
    assert d2.calls.statuses == [(True, "")]
    assert dra_kubelet.plugins.registered()[d.name] == [str(d2.dra_socket)]


def test_reregisters_after_kubelet_restart(dra_kubelet: Any, dra_drivers: Callable[..., FakeDriver]) -> None:
    d = dra_drivers()
    wait_for(lambda: d.calls.statuses, bool, timeout=T, what="first registration")
    dra_kubelet.restart()
    wait_for(lambda: len(d.calls.statuses), lambda n: n == 2, timeout=T, what="registered again by the new kubelet")
    assert d.calls.statuses == [(True, ""), (True, "")]


def test_hidden_and_non_socket_files_are_ignored(dra_kubelet: Any, dra_root: Any) -> None:
    reg = dra_root / "plugins_registry"
    reg.mkdir(exist_ok=True)
    (reg / "notes.txt").write_text("not a socket")
    d = FakeDriver(dra_root, ".hidden").start()
    try:
        other = FakeDriver(dra_root, "seen.example.com").start()
        try:
            wait_for(_registered(dra_kubelet, other.name), bool, timeout=T, what="the visible driver registered")
            assert ".hidden" not in dra_kubelet.plugins.registered() and d.calls.get_info == 0
        finally:
            other.stop()
    finally:
        d.stop()
