"""The gadget plugin's project conftest: its spec (two resources, the rolling-update convention declared) and the
suite's fault contract over its health file."""

import json
import os
import sys
from pathlib import Path

import pytest

from pytest_devplug import FaultInjector, FaultNotSupportedError, PluginSpec

HERE = Path(__file__).resolve().parent
COUNT = 4
INITIAL = {"count": COUNT, "unhealthy": [], "fail": False, "prestart_fail": False}
#: The last gadget is served as a second resource by the same process.
MINI = "example.com/gadget-mini"


@pytest.fixture(scope="session")
def health_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gadget") / "health.json"
    path.write_text(json.dumps(INITIAL))
    return path


@pytest.fixture(scope="session")
def devplug_plugin_spec(health_file: Path) -> PluginSpec:
    return PluginSpec(
        resource_name="example.com/gadget",
        extra_resource_names=(MINI,),
        argv=[
            sys.executable,
            str(HERE / "gadget_plugin.py"),
            "--plugin-dir",
            "{plugin_dir}",
            "--health-file",
            str(health_file),
            "--second-resource",
            f"{MINI}=1",
        ],
        env={"GADGET_BUG": os.environ.get("GADGET_BUG", "none"), "PYTHONPATH": os.pathsep.join(sys.path)},
        gpus=COUNT,
        conventions=frozenset({"rolling-update"}),
    )


class HealthFileFaults:
    """Faults by editing the health file (written atomically); IDs are read from the node, whatever they are."""

    def __init__(self, path: Path, plugin) -> None:
        self.path, self.plugin = path, plugin

    def _edit(self, fn) -> None:
        h = json.loads(self.path.read_text())
        fn(h)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(h))
        os.replace(tmp, self.path)

    @property
    def device_ids(self) -> list[str]:
        return sorted(set(self.plugin.node.device_ids(self.plugin.resource_name)))

    @staticmethod
    def _slot(device_id: str) -> str:
        return "gadget-" + device_id.rsplit("-", 1)[1]

    def set_unhealthy(self, device_id: str) -> None:
        self._edit(lambda h: h["unhealthy"].append(self._slot(device_id)))

    def set_healthy(self, device_id: str) -> None:
        self._edit(lambda h: h.__setitem__("unhealthy", [d for d in h["unhealthy"] if d != self._slot(device_id)]))

    def fail_allocate(self, device_id: str | None = None) -> None:
        self._edit(lambda h: h.__setitem__("fail", True))

    def fail_pre_start(self, device_id: str | None = None) -> None:
        self._edit(lambda h: h.__setitem__("prestart_fail", True))

    def add_device(self) -> str:
        raise FaultNotSupportedError("gadgets are soldered on")

    def remove_device(self, device_id: str) -> None:
        raise FaultNotSupportedError("gadgets are soldered on")


@pytest.fixture
def devplug_faults(devplug_plugin, health_file: Path) -> FaultInjector:
    yield HealthFileFaults(health_file, devplug_plugin)
    health_file.write_text(json.dumps(INITIAL))
