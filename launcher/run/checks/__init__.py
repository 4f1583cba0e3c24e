"""What a run checks of its hosts before and while it runs, and the sealed network it makes. It
imports nothing else of the run.

preflight.py: every host of a planned cluster checked in parallel (``tflaunch check``).
versions.py: which hosts' task Python would import another Python, TensorFlow or Keras than the others.
mesh.py: the all-pairs mesh probe, can every host reach every task at its TF_CONFIG address.
isolation.py: sealed and isolated runs, every task of a run in one network namespace of its own.
inside.py: what a sealed or isolated run's tasks find inside its namespace (this machine's names, the outside
network), as --dry-run and check say it.
outside.py: the outside network of a sealed run's namespace, through slirp4netns or pasta.
"""
