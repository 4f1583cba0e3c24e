"""The console: what a run shows on the terminal while it goes on. It imports only records below it.

writer.py: the console itself, task lines for people, tflaunch's own messages and the live status line.
chatter.py: task text as the console shows it: TensorFlow's start-up chatter recognised, twin keys, the
lines that mean something.
twins.py: the same line from several tasks, printed once under all their names.
stopfold.py: what the other tasks print once a failure stops the cluster, folded to one line per task.
metricview.py: metric records as lines for people, each shown once.
terminal.py: the console's end of a stream, written straight to its file descriptor without blocking.
pyerror.py: a task's Python exception found in its last lines, as a failure summary shows it.
"""
