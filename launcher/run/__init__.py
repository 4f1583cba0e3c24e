"""The run layer: a planned cluster started, supervised and recorded until it ends.

One folder per concern, each importing only the ones below it (``.importlinter``, run-layers):

- lifecycle/: the entry points (launch.py), the session with its attempts and restarts, the
  supervisor and a task's live record (task.py), the signal path, the open-files budget, the hosts
  each attempt runs on, run.json while the run goes on, the closing text, and a run inside a Slurm job;
- faults/: what goes wrong, named: the watchdogs, the hang verdict, py-spy's text, the stacks server
  behind ``tflaunch stacks``, the straggler rule, and the diagnosis of a failed task;
- output/: what the tasks print and use, read while the run goes on: the output pump, the progress
  their metric lines report, their CPU and memory;
- checks/: what a run checks of its hosts (preflight, versions, the mesh probe) and the sealed
  network it makes (isolation, outside); they import nothing else of the run;
- console/: what the terminal shows: the writer, TensorFlow's chatter recognised, twin and stop
  folding, the metric view, the terminal end of a stream; it shows records only.

Each folder's ``__init__.py`` names its modules, one line each.
"""
