"""``python -m devplug_gpu_plugin``: same as the ``devplug-gpu-plugin`` console script."""

import sys

from .cli import main

sys.exit(main())
