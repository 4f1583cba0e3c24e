"""The run layer: a planned cluster started, supervised and recorded until it ends.

launch.py holds the entry points (run, dry_run, check); session.py the attempts, restarts and
the run record; supervisor.py the task states and the one shutdown protocol; signals.py the one
signal path; limits.py the open-files budget checked before anything starts.

What a run watches, writes and shows: pump.py (task output into the logs), progress.py (what
the metric lines say), watchdog.py (a cluster that never forms, or hangs), stragglers.py (the
task the others keep waiting for), hostpool.py (the hosts each attempt runs on), resources.py (CPU and
memory), console.py with terminal.py, render.py, twins.py, stopfold.py and metricview.py (the
terminal), summary.py (the closing table). What it checks and seals: preflight.py, versions.py
(the hosts' versions compared), mesh.py, isolation.py with outside.py (a sealed run's network
namespace and its outside network), and diagnose.py (known failures named).
A hang's culprit: pyspy.py reads the stacks, culprit.py compares them, and control.py serves
them to ``tflaunch stacks`` over the run's control socket.
"""
