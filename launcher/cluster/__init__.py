"""The cluster layer: what a cluster is and how each of its tasks starts, and what that needs of this machine.

The pure core starts no process, opens no socket and changes nothing: a cluster file becomes a
validated :class:`~.spec.ClusterSpec` (reader.py on top of yamlfile.py, fields.py and checks.py),
and so does ``--local N`` (local.py); roles.py carves roles out of task slots (``-H``, hostfiles,
Slurm allocations); :func:`~.plan.plan_cluster` turns a spec into one :class:`~.plan.TaskLaunch` per
task with its argv and environment (ranks.py numbers the tasks as TensorFlow does; tfconfig.py
keeps a task's TF_CONFIG in parts, so that n tasks cost n, not n squared; commands.py says which
commands the note on tflaunch's Keras choice concerns, from a script's text its caller read). placement.py says where
each task of an attempt runs once hosts are left out: moved to a spare, or the cluster shrunk.

Beside it, three modules ask the system, and the pure core never imports them (a contract in
``.importlinter`` holds it to that): machine.py knows this machine (its names, cores, open-files
limit, which it raises for a run), ports.py reserves free ports (bound sockets and a lock file),
and exposure.py resolves the cluster's names to warn of tasks reachable from the internet.
probe.py and mesh_probe.py are standard-library scripts shipped to each host for checks.
"""
