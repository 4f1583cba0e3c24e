"""Inspection of finished and running runs: ``runs``, ``logs``, ``status``, ``report``, ``compare``, ``stacks``.

Everything here reads run folders (see :mod:`launcher.records`); only ``report --plot`` writes, and
``stacks`` asks a running run's tflaunch over its control socket (:mod:`launcher.run.control`).
"""
