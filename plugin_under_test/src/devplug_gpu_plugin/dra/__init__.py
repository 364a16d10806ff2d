"""The GPU plugin as a DRA driver (``devplug-gpu-plugin --dra``): the same NVML layer, inventory and health loop.

One responsibility per module: ``kubeapi`` talks to the API server (claims, the Node, ResourceSlices);
``slices`` keeps the node's ResourceSlice equal to the GPU inventory; ``prepare`` turns an allocated
ResourceClaim into prepared devices; ``cdi`` writes and removes the per-claim CDI spec; ``service`` serves
``NodePrepareResources`` / ``NodeUnprepareResources`` (v1 and v1beta1); ``health`` streams device health;
``registration`` answers the kubelet's plugin watcher; ``server`` keeps both sockets served; ``driver``
wires them together. Mirrors ``k8s.io/dynamic-resource-allocation/kubeletplugin`` as
``sigs.k8s.io/dra-example-driver``'s kubelet plugin uses it.
"""
