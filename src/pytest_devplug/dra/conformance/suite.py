"""Every DRA conformance check in one namespace: ``from pytest_devplug.dra.conformance.suite import *`` in a test
module of your own project runs the suite with your conftest.py (e.g. your ``devplug_driver_spec``)."""

from .test_checkpoint import *  # noqa: F403
from .test_device_status import *  # noqa: F403
from .test_faults import *  # noqa: F403
from .test_prepare import *  # noqa: F403
from .test_registration import *  # noqa: F403
from .test_restarts import *  # noqa: F403
from .test_scheduling import *  # noqa: F403
from .test_slices import *  # noqa: F403
