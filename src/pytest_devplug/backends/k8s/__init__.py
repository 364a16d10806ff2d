"""What the real-cluster backends (``kind`` and ``cluster``) share: the Kubernetes API and node operations.

- ``api``: the Kubernetes API calls, JSON in and out.
- ``node``: node operations (kubelet restart and journal, checkpoint, files, pod-resources) over a
  :class:`~pytest_devplug.backends.k8s.node.NodeTransport`, the one seam through which a node is reached:
  ``docker exec`` into a kind node container, or a privileged host-PID pod on any cluster.
- ``hostpod``: that pod (:class:`HostPodTransport`), through the Kubernetes API only.
"""
