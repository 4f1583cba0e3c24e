"""The cluster layer (pure, no processes): what a cluster is and how each of its tasks starts.

A cluster file becomes a validated :class:`~.spec.ClusterSpec` (reader.py on top of yamlfile.py,
fields.py and checks.py), and so does ``--local N`` (local.py); :func:`~.plan.plan_cluster` turns
a spec into one :class:`~.plan.TaskLaunch` per task with its argv and environment. machine.py
knows this machine (its names, cores, open-files limit), exposure.py warns of tasks reachable from
the internet, ports.py reserves free ports, and probe.py and mesh_probe.py are the stdlib scripts
that run on each host for checks.
"""
