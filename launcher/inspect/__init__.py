"""Inspection of finished and running runs: ``runs``, ``logs``, ``status``, ``report``, ``compare``.

Everything here reads run folders (see :mod:`launcher.records`); only ``report --plot`` writes.
"""
