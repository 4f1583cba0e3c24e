"""Run folders and the run record: what every run leaves in ``logs/<run-id>/`` (the bottom layer).

- folder.py: where run folders go, how one is made, and its layout;
- record.py: the typed ``run.json`` that runs write and the inspection commands read;
- states.py: the words the record uses (run status, task state, attempt outcome);
- metrics.py: the metric line tasks print, its parser, and which task speaks for the run.
"""
