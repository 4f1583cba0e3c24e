"""The agent tflaunch runs on a remote host, in front of each remote task (standard library only).

Closing an ssh channel does not kill the remote process, so every remote task runs under this
agent, which tflaunch sends as ``python -c <source> <spec>`` (the spec is base64 JSON: argv, env,
grace, heartbeat timeout; no value of it passes through a shell). The agent:

- starts the task in its own session with the given env, its stdout and stderr both on the
  channel's stdout, and reports ``TFLAUNCH_AGENT started <pid>`` on its own stderr;
- reads commands on stdin: an empty line is a heartbeat, ``TERM``/``KILL`` signal the task's
  process group, ``SIG <n>`` signals the task's main process, ``DUMP`` writes the task's Python
  stacks (``py-spy dump``, when installed on the host) to stderr between ``stacks-begin`` and
  ``stacks-end`` marks;
- stops the task's group (SIGTERM, ``grace`` seconds, SIGKILL) when stdin reaches EOF (tflaunch
  or its ssh client died, or the connection closed) or when no heartbeat came for ``timeout``
  seconds (the link to tflaunch is down);
- ends with ``TFLAUNCH_AGENT exit code=<n>`` or ``signal=<n>`` on stderr and exits with the
  task's exit code (128+n for a signal).

Python 3.6+ compatible on purpose: it runs on whatever interpreter the remote host has.
"""

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

MARK = "TFLAUNCH_AGENT"


def report(text):
    sys.stderr.write("%s %s\n" % (MARK, text))
    sys.stderr.flush()


def signal_group(pid, signum):
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class Agent(object):
    def __init__(self, spec):
        self.spec = spec
        self.child = None
        self.last_heartbeat = time.monotonic()
        self.stop_reason = None
        self.report_lock = threading.Lock()

    def start(self):
        env = dict(os.environ)
        env.update(self.spec["env"])
        try:
            self.child = subprocess.Popen(self.spec["argv"], env=env, stdin=subprocess.DEVNULL,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            report("error cannot start %r: %s" % (self.spec["argv"][0], exc.strerror))
            os._exit(127)
        report("started %d" % self.child.pid)

    def read_commands(self):
        # Raw reads on fd 0: a buffered reader's lock held by this daemon thread would make
        # interpreter shutdown fail.
        pending = b""
        while True:
            chunk = os.read(0, 4096)
            if not chunk:
                self.stop_reason = "eof"
                return
            self.last_heartbeat = time.monotonic()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self.handle(line.strip().decode("ascii", "replace"))

    def handle(self, command):
        if command == "TERM":
            signal_group(self.child.pid, signal.SIGTERM)
        elif command == "KILL":
            signal_group(self.child.pid, signal.SIGKILL)
        elif command == "DUMP":
            threading.Thread(target=self.dump_stacks).start()
        elif command.startswith("SIG "):
            try:
                os.kill(self.child.pid, int(command[4:]))
            except (ValueError, ProcessLookupError):
                pass

    def dump_stacks(self):
        tool = os.path.join(os.path.dirname(sys.executable), "py-spy")
        if not os.path.exists(tool):
            tool = shutil.which("py-spy")
        if tool is None:
            text = "no stack dump: py-spy is not installed on this host (pip install py-spy)\n"
        else:
            done = subprocess.run([tool, "dump", "--pid", str(self.child.pid), "--subprocesses"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            text = done.stdout.decode("utf-8", "replace")
        with self.report_lock:
            sys.stderr.write("%s stacks-begin\n%s%s stacks-end\n" % (MARK, text, MARK))
            sys.stderr.flush()

    def supervise(self):
        reader = threading.Thread(target=self.read_commands)
        reader.daemon = True
        reader.start()
        timeout = self.spec["timeout"]
        while self.child.poll() is None:
            if self.stop_reason is None and time.monotonic() - self.last_heartbeat > timeout:
                self.stop_reason = "no heartbeat"
            if self.stop_reason is not None:
                self.stop_child()
                break
            time.sleep(0.05)
        returncode = self.child.wait()
        signal_group(self.child.pid, signal.SIGKILL)  # leftovers of the task's group
        if returncode < 0:
            report("exit signal=%d" % -returncode)
            return 128 - returncode
        report("exit code=%d" % returncode)
        return returncode

    def stop_child(self):
        signal_group(self.child.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.spec["grace"]
        while self.child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        signal_group(self.child.pid, signal.SIGKILL)


def main():
    spec = json.loads(base64.b64decode(sys.argv[1]).decode("utf-8"))
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # The agent must outlive a SIGINT/SIGHUP aimed at the session so it can clean up. A no-op
    # handler, not SIG_IGN: ignored signals would stay ignored in the task after exec.
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGHUP, lambda *_: None)
    agent = Agent(spec)
    agent.start()
    code = agent.supervise()
    sys.stderr.flush()
    os._exit(code)  # no interpreter shutdown while the reader thread sits in read()


if __name__ == "__main__":
    main()
