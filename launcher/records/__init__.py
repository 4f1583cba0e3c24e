"""Run folders and the run record: what every run leaves in ``logs/<run-id>/`` (the bottom layer).

- folder.py: where run folders go, how one is made, and its layout;
- record.py: the typed ``run.json`` that runs write and the inspection commands read;
- livejson.py: its compact text for the rewrites while a run goes on, each task's text kept while it stays the same;
- states.py: the words the record uses (run status, task state, attempt outcome), durations and counts;
- exits.py: how a task ended, in the words every view uses (``exit code 1``, ``killed by SIGKILL``);
- metrics.py: the metric line tasks print, its parser, which task speaks for the run, and its training time;
- kerasepochs.py: the epoch lines Keras prints, read as epoch records for tasks that print no metric lines;
- metrictext.py: a metric record as the console shows it (and ``logs --grep`` matches it);
- lines.py: how task output is cut into lines and folded as a terminal shows it (merged.log, ``logs``);
- boundedlog.py: a log kept within its size limit (head, marker line, latest output), as it is written;
- logformat.py: such a log on disk: its marker lines, its part files, a live log's layout, and the stitch that closes it;
- logview.py: such a log read whole, by its tail or followed, also one a killed tflaunch left behind;
- slurm.py: ``slurm.json``, what a Slurm job adds to its folder;
- control.py: the folder's control socket while the run lasts: its protocol and the client that asks;
- files.py: files written in a folder others may be able to write: exclusively, never through a link;
- trace.py: tflaunch's own trace of its decisions, ``debug.log`` in the run folder when asked for.

Both sides import these: the run writes them, ``launcher.inspect`` reads them, and nothing here
imports either side.
"""
