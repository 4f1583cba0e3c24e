"""A run's output: what its tasks print and what they use, read while the run goes on.

pump.py: each task's log read back into ``merged.log``, ``metrics.jsonl`` and the console.
merged.py: ``merged.log`` and ``metrics.jsonl``, the lines prefixed and the records completed, written a sweep at a time.
progress.py: what the tasks' metric lines say about progress, written by the pump, read by the
watchdog and the session.
resources.py: CPU and memory use of a run's tasks, collected on a thread into ``resources.json``.
"""

# Descriptors the pump keeps open at once: the logs that grew most recently, so a run of thousands
# of tasks reads them all within a small, fixed number of descriptors. Here, not in pump.py, so that
# the run's budget of open files (launcher.run.lifecycle.limits) counts them without loading the pump
# before the hosts' connections open.
OPEN_FILES = 64
