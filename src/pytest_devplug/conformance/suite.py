"""Every conformance test in one namespace: ``from pytest_devplug.conformance.suite import *`` in a
test module of your own project runs the suite with your conftest.py (e.g. your ``devplug_plugin_spec``)."""

from .test_allocate import *  # noqa: F403
from .test_checkpoint import *  # noqa: F403
from .test_health import *  # noqa: F403
from .test_init_containers import *  # noqa: F403
from .test_lifecycle import *  # noqa: F403
from .test_limits import *  # noqa: F403
from .test_nvml import *  # noqa: F403
from .test_podresources import *  # noqa: F403
from .test_prestart import *  # noqa: F403
from .test_registration import *  # noqa: F403
from .test_resources import *  # noqa: F403
from .test_restarts import *  # noqa: F403
from .test_rolling_update import *  # noqa: F403
from .test_sharing import *  # noqa: F403
from .test_soak import *  # noqa: F403
from .test_topology import *  # noqa: F403
