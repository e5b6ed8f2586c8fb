"""``python -m rankscope`` is the ``rankscope`` command."""

import sys

from rankscope.orchestrator.cli import main

sys.exit(main())
