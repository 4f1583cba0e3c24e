"""A host probe (standard library only): run on each host by ``tflaunch check``.

Sent to remote hosts as ``python -c <source> <base64 JSON>`` and run locally the same way.
Input: {"ports": [...], "workdirs": [...], "gpus": [...]}. Output: one JSON line with the
hostname, Python version, the versions of TensorFlow, tf_keras and Keras (found without importing
them), which ports are free, which working directories exist, and the GPUs ``nvidia-smi`` lists.
Python 3.6+ compatible on purpose: it runs on whatever interpreter a host has.
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys


def port_is_free(port):
    """Whether a task could listen on ``port`` on every address of this host when it starts.

    SO_REUSEADDR ignores connections lingering in TIME_WAIT (as TensorFlow's gRPC server does)
    while still refusing a port that another socket is bound to or listens on. One kind of socket
    counts as free: one of this user's that holds the port the way tflaunch and its agents hold
    the ports they picked (bound with SO_REUSEPORT, nothing listening or connected on the port),
    because that hold ends just before the task starts.
    """
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        free = _can_bind(family, address, port, reuse_port=False)
        if free is False and _can_bind(family, address, port, reuse_port=True):
            free = not _in_use(port)
        if free is False:
            return False
    return True


def _can_bind(family, address, port, reuse_port):
    """True or False; None when this host has no such family."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None  # no IPv6 here
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            if not hasattr(socket, "SO_REUSEPORT"):
                return False
            # Another user's socket still refuses this bind, as does one of this user's without it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address, port))
    except OSError:
        return False
    finally:
        sock.close()
    return True


def _in_use(port):
    """Whether a socket listens or is connected on ``port`` here (Linux's socket tables, which do
    not list a socket that is only bound); True when the tables cannot be read."""
    read = False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as table:
                rows = table.read().splitlines()[1:]
        except OSError:
            continue
        read = True
        for row in rows:
            fields = row.split()
            # local address "HEX:PORT" and state; 06 is TIME_WAIT, which does not hold a port
            if len(fields) > 3 and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] != "06":
                return True
    return not read


# The distributions that install each module the tasks import, in the order they are looked for.
DISTRIBUTIONS = (
    ("tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
                    "tensorflow-aarch64", "tensorflow-rocm", "intel-tensorflow", "tf-nightly", "tf-nightly-cpu",
                    "tf-nightly-gpu")),
    ("tf_keras", ("tf-keras", "tf-keras-nightly")),
    ("keras", ("keras", "keras-nightly")),
)


def package_versions():
    """{module: version} for each module of DISTRIBUTIONS, None when this Python cannot import it,
    "unknown" when it can but no distribution of it is found; {} without importlib.metadata.

    Nothing is imported: importlib.metadata finds a distribution's version as the task's own
    ``importlib.metadata.version()`` would (the first one on sys.path, so PYTHONPATH comes first).
    """
    try:
        from importlib import metadata, util
    except ImportError:
        return {}
    versions = {}
    for module, names in DISTRIBUTIONS:
        if util.find_spec(module) is None:
            versions[module] = None
            continue
        versions[module] = "unknown"
        # Python 3.8 and 3.9 match a dist-info folder's name as written: "tf_keras-2.x" for "tf-keras".
        for name in [spelling for name in names for spelling in (name, name.replace("-", "_"))]:
            try:
                versions[module] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return versions


def tensorflow_error(versions):
    """Why the task's Python has no TensorFlow version to show, or None."""
    if not versions:
        return "importlib.metadata needs Python 3.8+"
    if versions["tensorflow"] is None:
        return "tensorflow is not installed for %s" % sys.executable
    return None


def gpu_count():
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(1 for line in out.stdout.decode(errors="replace").splitlines() if line.startswith("GPU "))


def probe(request):
    versions = package_versions()
    return {
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "versions": versions,
        "tensorflow_error": tensorflow_error(versions),
        "ports": {str(p): port_is_free(int(p)) for p in request.get("ports", [])},
        "workdirs": {d: os.path.isdir(d) for d in request.get("workdirs", [])},
        "gpus": gpu_count(),
    }


# The answer's line: tflaunch (launcher.run.checks.preflight) finds it by this mark, from here.
MARK = "TFLAUNCH_PROBE "


def main():
    request = json.loads(base64.b64decode(sys.argv[1]).decode("utf-8"))
    print(MARK + json.dumps(probe(request)))


if __name__ == "__main__":
    main()
