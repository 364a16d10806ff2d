"""Processes the harness starts and the work dirs they live in, for any layer that runs one.

A plugin or driver on the embedded kubelet, the real control plane's components, a mock-NVML helper: each is a
:class:`~pytest_devplug.procs.process.PluginProcess` (its own process group, a parent-death signal, one log),
started through the mount-namespace :mod:`~pytest_devplug.procs.launcher`, under a short work dir from
:mod:`~pytest_devplug.procs.workdir` that a killed run's successor sweeps away. Below ``sim`` and ``controlplane``:
neither the embedded kubelet nor the control plane owns it.
"""
