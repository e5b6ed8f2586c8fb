"""The Slurm backend: the job goes to Slurm through submitit; a dependent job merges it.

:mod:`.launcher` (:class:`SlurmLauncher`, the hooks of :class:`rankscope.launchers.base.Launcher`),
:mod:`.options` (what a job asks for, and the flags made from it), :mod:`.node` (what runs on
each node), :mod:`.records` (what is recorded about the job) and :mod:`.commands` (the
launcher's questions to Slurm and its words for the answers; the tools themselves run through
:mod:`rankscope.slurm.commands`, shared with the analysis' Slurm workers). The core of the
launchers (``base``, ``spec``, ``rundir``, ``torchrun``) never imports this folder; the launcher
is found by name.
"""
