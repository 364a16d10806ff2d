"""The real-cluster backend (``kind`` and ``cluster``): one :class:`~.backend.KubeBackend`, its provider decides
the rest.

- ``backend``: :class:`~.backend.KubeBackend` (the protocol on the Kubernetes API) and the
  :class:`~.backend.ClusterProvider` seam.
- ``api``: the Kubernetes API calls, JSON in and out.
- ``manifests``: the plugin's DaemonSets, rendered for a spec and owned by the run.
- ``daemonsets``: a workload of the run pinned to a node by DaemonSets: its pods, logs, stop, kill and start.
- ``dra``, ``dramanifests``, ``dralog``: the DRA side (:class:`~.dra.KubeDRA`): the driver's objects and
  DaemonSet, the kubelet's DRA state read from its journal.
- ``nodeops``: node operations (kubelet restart and journal, checkpoint, files, pod-resources) over a
  :class:`~.nodeops.NodeTransport`, the one seam through which a node is reached: ``docker exec`` into a kind
  node container (``kind/transport.py``), or a privileged host-PID pod on any cluster.
- ``hostpod``: that pod (:class:`~.hostpod.HostPodTransport`), through the Kubernetes API only.
- ``gpunode``: a mock GPU node made as files on a node that is a container (kind).
- ``ownership``: the run's labels and owner, removal of what dead runs left, SIGTERM handled as Ctrl-C.
"""
