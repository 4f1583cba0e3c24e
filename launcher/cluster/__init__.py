"""The cluster layer (pure, no processes): what a cluster is and how each of its tasks starts.

A cluster file or ``--local N`` becomes a validated :class:`~.spec.ClusterSpec` (reader.py on
top of fields.py, checks.py, local.py); :func:`~.plan.plan_cluster` turns a spec into one
:class:`~.plan.TaskLaunch` per task with its argv and environment. ports.py reserves free
ports, probe.py and mesh_probe.py are the stdlib scripts that run on each host for checks.
"""
