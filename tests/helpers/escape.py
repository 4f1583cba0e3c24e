"""A task that leaves processes behind, for the containment tests.

    python escape.py MARKER [ACTION ...]

Every process it leaves carries MARKER in its command line. Actions run in order:
``escape`` starts one sleeper in a session of its own (setsid) and one by double-forking (its
parent exits, so it is orphaned), both outside the task's process group; ``hold-port:P`` leaves a
detached process listening on port P (only in attempt 1); ``bind:P`` listens on port P itself
(exit 5 if taken); ``ready`` prints READY; ``exit:N``; ``fail-first:N`` exits N in attempt 1 only;
``forever`` sleeps until killed.
"""

import os
import socket
import sys
import time

SLEEPER = "import time; time.sleep(600)"
HOLDER = ("import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
          "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(600)")


def detached(argv):
    """Start ``argv`` in a session of its own, by double-forking: it ends up nobody's child here."""
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, argv)
        os._exit(0)
    os.waitpid(middle, 0)


def main(marker, actions):
    attempt = os.environ.get("TFLAUNCH_ATTEMPT", "1")
    for action in actions:
        kind, _, arg = action.partition(":")
        if kind == "escape":
            if os.fork() == 0:
                os.setsid()
                os.execv(sys.executable, [sys.executable, "-c", SLEEPER, marker])
            detached([sys.executable, "-c", SLEEPER, marker])
        elif kind == "hold-port" and attempt == "1":
            detached([sys.executable, "-c", HOLDER, arg, marker])
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # held once a connection gets through
                try:
                    socket.create_connection(("127.0.0.1", int(arg)), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.02)
        elif kind == "bind":
            server = socket.socket()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                server.bind(("127.0.0.1", int(arg)))
            except OSError as exc:
                print("BIND FAILED %s: %s" % (arg, exc), flush=True)
                sys.exit(5)
            print("BOUND %s" % arg, flush=True)
            server.close()
        elif kind == "ready":
            print("READY", flush=True)
        elif kind == "exit":
            sys.exit(int(arg))
        elif kind == "fail-first" and attempt == "1":
            sys.exit(int(arg))
        elif kind == "forever":
            while True:
                time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
