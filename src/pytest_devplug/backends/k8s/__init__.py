"""The real-cluster backend (``kind`` and ``cluster``): one :class:`~.backend.KubeBackend`, its provider decides
the rest.

- ``backend``: :class:`KubeBackend` (the protocol on the Kubernetes API) and the :class:`ClusterProvider` seam.
- ``api``: the Kubernetes API calls, JSON in and out.
- ``manifests``: the plugin's DaemonSets, rendered for a spec and owned by the run.
- ``node``: node operations (kubelet restart and journal, checkpoint, files, pod-resources) over a
  :class:`~pytest_devplug.backends.k8s.nodeops.NodeTransport`, the one seam through which a node is reached:
  ``docker exec`` into a kind node container (``kind/transport.py``), or a privileged host-PID pod on any cluster.
- ``hostpod``: that pod (:class:`HostPodTransport`), through the Kubernetes API only.
- ``ownership``: the run's labels and owner, removal of what dead runs left, SIGTERM handled as Ctrl-C.
"""
