"""Inspection of finished and running runs: ``runs``, ``logs``, ``status``, ``report``, ``compare``, ``stacks``.

The read side: everything here reads run folders through :mod:`launcher.records` and imports
nothing of the run, its transports or Slurm (a contract in ``.importlinter`` holds it to that).
Only ``report --plot`` writes; ``stacks`` asks a running run's tflaunch over the folder's control
socket (:mod:`launcher.records.control`). What only a live system can say comes from the caller:
Slurm's view of a job (``summarize(job_state=...)``) and the CPU and memory of live local tasks
(``run_status(measure=...)``).

runs.py finds the runs of a log directory and reads what they left; status.py what `status`
shows of one (each task's state, and live tasks' CPU and memory); report.py makes what the
commands show (tables, status, per-epoch reports, plots); compare.py the throughput of several runs
side by side; runlogs.py a run's logs as lines, filtered, read once or followed; stacks.py asks a
running run for every task's stacks and says which task differs.
"""
