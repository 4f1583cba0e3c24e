"""The run layer: a planned cluster started, supervised and recorded until it ends.

launch.py holds the entry points (run, dry_run, check); session.py the attempts, restarts and
the run record; supervisor.py the task states and the one shutdown protocol; signals.py the one
signal path; watchdog.py, pump.py, console.py, resources.py and summary.py what a run watches,
writes and shows; diagnose.py, preflight.py, mesh.py and isolation.py what it checks and seals.
"""
