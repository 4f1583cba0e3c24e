"""A run's lifecycle: a launch request started, its attempts supervised and restarted, its record
kept, until the run ends.

launch.py: the entry points, ``run``, ``dry_run`` and ``check`` for a launch request.
planner.py: a launch request, and its plans made in one place, from its spec and ports to each attempt's plan.
session.py: one run from its first attempt to its final run record, its attempts and restarts.
supervisor.py: one attempt, every task started, watched and stopped by one protocol.
task.py: a task's live record and its one state change, a watchdog's trip, and what an attempt comes to.
wakeups.py: when the supervisor looks at its tasks, which to poll and how long to sleep in between.
signals.py: the one signal path, SIGINT, SIGTERM, SIGHUP and SIGQUIT handled in one place.
limits.py: the open-files budget, raised and checked before anything starts.
recovery.py: between two attempts, the failure diagnosed and compared, the hosts checked, the next cluster decided.
hostpool.py: which hosts the next attempt runs on, the hosts a run leaves out, why, and when they may rejoin.
liverecord.py: run.json and the console's status line, kept up with the tasks while the run goes on.
summary.py: text for people about plans and results (the CLI prints it).
slurmjob.py: ``tflaunch --slurm`` inside a job, the run in the job's folder and the signal that requeues it.
"""
