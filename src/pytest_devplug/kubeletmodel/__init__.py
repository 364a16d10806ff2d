"""The kubelet's data model and rules, without I/O: one copy for every backend.

The embedded kubelet (``sim/``) runs these rules and the real-cluster backends (``backends/``) read a real
kubelet's files and answers by the same ones, so both see a checkpoint, a quantity and what the runtime applied
to a container alike. Nothing here imports ``sim`` or ``backends``; both import from here.
"""
