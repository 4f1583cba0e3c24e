"""A run's faults: a cluster that never forms or hangs, a straggler, a failure, each named.

watchdog.py: the watchdogs of one attempt, a cluster that never forms and a cluster that hangs.
hang_verdict.py: which task holds a hung cluster up, every task's stacks compared and the one that
differs named.
pyspy.py: the text of ``py-spy dump`` read into processes, threads and frames.
stacks_server.py: the run's control socket served, so that ``tflaunch stacks`` gets every task's stacks.
stragglers.py: the straggler rule, the training task the others keep waiting for, named while the run goes on.
readings.py: each task's recent readings, as the watchdogs and the straggler rule read them over a window.
diagnose.py: a failed task explained from the tail of its output: which known problem it hit, and the fix.
"""
