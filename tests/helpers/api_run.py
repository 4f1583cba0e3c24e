"""Calls tflaunch's Python API the way a user's script would, for the API tests.

    python api_run.py LOG_DIR ACTION...

Runs ``launch(local=2, chief=True, command=[python, tests/helpers/task.py, ACTION...])`` in the main
thread, then prints one ``RESULT {json}`` line: how the call ended (returned or LaunchInterrupted),
the result's fields, and whether the SIGINT handler is Python's own again.
"""

import json
import os
import signal
import sys

from launcher import LaunchInterrupted, launch

TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "task.py")


def main(log_dir, actions):
    # Python's own handler, as in a script started from a terminal: a harness that started this one
    # in the background (nohup, "&" in a script) hands it SIGINT ignored instead.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result, ended = launch(local=2, chief=True, command=[sys.executable, TASK, *actions], log_dir=log_dir), "returned"
    except LaunchInterrupted as interrupted:
        result, ended = interrupted.result, "LaunchInterrupted"
    restored = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    print("RESULT " + json.dumps({"ended": ended, "exit_code": result.exit_code, "status": str(result.status),
                                  "run_dir": str(result.run_dir), "record_status": str(result.record.status),
                                  "tasks": {t.name: str(t.state) for t in result.record.tasks},
                                  "sigint_restored": restored}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
