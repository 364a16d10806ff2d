"""DRA drivers under test: fixtures, handles, assertion helpers and a conformance suite, like the device-plugin ones.

``objects`` makes and reads ``resource.k8s.io/v1`` objects (DeviceClasses, ResourceClaims, templates,
ResourceSlices) through the API server; ``handles`` reads the driver, its node's kubelet, claims and pods
naturally in a test; ``assertions`` holds the ``assert_*`` helpers; ``faults`` the fault-injection contract;
``plugin`` the pytest options and fixtures; ``conformance`` the shipped suite
(``devplug conformance --dra`` or ``pytest --pyargs pytest_devplug.dra.conformance``).
"""
