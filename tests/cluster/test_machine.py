"""This machine's interface addresses, read over netlink, against psutil's reading of the same."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from launcher.cluster.machine import interface_addresses, local_host_names, psutil_addresses


def test_the_addresses_are_the_ones_psutil_lists_here():
    assert interface_addresses() == psutil_addresses()
    assert {"127.0.0.1", "::1", socket.gethostname()} <= local_host_names()


# In a network namespace of its own: a secondary address, an address with a peer, IPv6, and an
# interface that is down. The peer is the other end's address, not this machine's.
_IN_A_NAMESPACE = """
import json, subprocess
from launcher.cluster.machine import interface_addresses, psutil_addresses
for line in (["link", "add", "t0", "type", "veth", "peer", "name", "t1"], ["link", "set", "t0", "up"],
             ["addr", "add", "10.77.0.1/24", "dev", "t0"], ["addr", "add", "10.77.0.2/24", "dev", "t0"],
             ["addr", "add", "10.78.0.1", "peer", "10.78.0.9", "dev", "t0"],
             ["-6", "addr", "add", "fd77::1/64", "dev", "t0", "nodad"],
             ["addr", "add", "10.79.0.1/24", "dev", "t1"]):
    subprocess.run(["ip", *line], check=True)
print(json.dumps([sorted(interface_addresses()), sorted(psutil_addresses())]))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
                    reason="needs root, unshare and ip to make a network namespace")
def test_secondary_peer_and_down_addresses_are_read_as_psutil_reads_them(tmp_path):
    import json

    done = subprocess.run(["unshare", "--net", sys.executable, "-c", _IN_A_NAMESPACE], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.returncode == 0, done.stderr
    mine, theirs = json.loads(done.stdout)
    assert mine == theirs
    assert {"10.77.0.1", "10.77.0.2", "10.78.0.1", "fd77::1", "10.79.0.1"} <= set(mine)
    assert "10.78.0.9" not in mine  # the peer's
