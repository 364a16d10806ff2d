"""The kubelet's ``dra_manager_state``: what it stored of the driver's answers, in a file a kubelet can read back.

The checkpoint holds, for each claim, the pods using it and each driver's prepared devices with their request
names and CDI device IDs, exactly as the driver returned them; its checksum (crc32 of the Data string) must
verify, or the next kubelet refuses to start its DRA manager.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pytest_devplug.cli import main as devplug
from pytest_devplug.dra.assertions import assert_claim_prepared
from pytest_devplug.dra.handles import ClaimFactory, DriverHandle
from pytest_devplug.kubeletmodel import dracheckpoint as cp


def test_checkpoint_contents(devplug_claims: ClaimFactory, devplug_driver: DriverHandle, capsys: object) -> None:
    """The entry of a prepared claim: its UID, name and namespace, the pod's UID, a DriverState for this driver only,
    with the allocated devices, each carrying the request it was allocated for and the CDI IDs the driver returned;
    the file reads back byte for byte and ``devplug checkpoint verify`` accepts it."""
    claim = devplug_claims.claim()
    pod = devplug_claims.pod([claim], wait=True)
    (prepared,) = assert_claim_prepared(pod, devplug_driver)
    assert (prepared.claim_uid, prepared.claim_name, prepared.namespace) == (claim.uid, claim.name, claim.namespace)
    assert prepared.pod_uids == {pod.uid}, f"pods {sorted(prepared.pod_uids)}, want {pod.uid}"
    assert set(prepared.devices) == {devplug_driver.name}, f"DriverState for {sorted(prepared.devices)}"
    requests = {(a.pool, a.device): a.request for a in claim.allocated}
    for d in prepared.devices[devplug_driver.name]:
        assert requests.get((d.pool, d.device)) in d.requests, (
            f"device {d.pool}/{d.device} checkpointed for requests {d.requests}, allocated for {requests}"
        )
    raw = devplug_driver.node.dra.read_dra_checkpoint(devplug_driver.node.name)
    assert raw is not None
    decoded = cp.decode(raw)
    kube = devplug_driver.node.kube
    assert cp.encode(decoded.entries, kube) == raw, (
        f"dra_manager_state does not re-encode to the same bytes as a kubelet of {kube.name}"
    )
    with tempfile.TemporaryDirectory(prefix="devplug-dra-cp-") as tmp:
        path = Path(tmp) / cp.CHECKPOINT_NAME
        path.write_bytes(raw)
        assert devplug(["checkpoint", "verify", str(path)]) == 0, f"devplug checkpoint verify refused {raw[:300]!r}"
