"""``python -m rankscope.launchers.slurm prepare …``: the entry of ``slurm/rankscope.sbatch``
(the sbatch template people copy names the backend's package, so it keeps working whichever
module of the backend holds the code: :func:`rankscope.launchers.slurm.launcher.main`)."""

from __future__ import annotations

import sys

from rankscope.launchers.slurm.launcher import main

sys.exit(main())
