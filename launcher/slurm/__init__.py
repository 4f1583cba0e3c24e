"""Slurm: reading an allocation, the Slurm commands tflaunch runs, and ``tflaunch submit``.

- :mod:`.allocation`: SLURM_* variables -> nodes, slots and roles (pure but for hostlist expansion);
- :mod:`.commands`: ``scontrol``, ``srun``, ``sbatch``, ``squeue`` with timeouts and one-line errors;
- :mod:`.nodes`: Slurm's word on the job's nodes before a restart (down, drained, out of the job);
- :mod:`.section`: a cluster file's ``slurm:`` section, each key a twin of a ``submit`` option;
- :mod:`.script`: the commented sbatch script ``submit`` writes (pure);
- :mod:`.submit`: writing that script into a new run folder and submitting it;
- :mod:`.job`: a ``--slurm`` run inside the job: its run folder (also after a requeue), the
  warning signal that stops the tasks so they save, and requeueing the job.

The source (:mod:`launcher.sources.slurm`) and the transport (:mod:`launcher.transports.srun`)
build on these.
"""
