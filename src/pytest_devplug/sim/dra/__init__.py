"""The kubelet's DRA side in the embedded kubelet: plugin watcher, DRA plugin clients, claim state.

Layout follows upstream ``pkg/kubelet/pluginmanager`` and ``pkg/kubelet/cm/dra``: ``watcher`` finds and
registers plugins on ``plugins_registry/``; ``plugins`` keeps the registered DRA plugins (version choice,
connection state, ResourceSlice wiping through a narrow API seam); ``client`` makes the
NodePrepareResources / NodeUnprepareResources calls; ``health`` reads the health stream; ``checkpoint``
is ``dra_manager_state``; ``manager`` prepares and unprepares pods' claims, which it reads through a
``ClaimSource`` (the real API server plugs in there).
"""
