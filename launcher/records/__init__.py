"""Run folders and the run record: what every run leaves in ``logs/<run-id>/`` (the bottom layer).

folder.py knows the folder's layout; record.py the typed ``run.json`` that runs write and the
inspection commands read.
"""
