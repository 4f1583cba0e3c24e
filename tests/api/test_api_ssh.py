"""launch() over real ssh (the test hosts of scripts/testhosts): a refused preflight speaks to a Python caller."""

from __future__ import annotations

import subprocess

import pytest

from conftest import TASK
from launcher import launch
from launcher.errors import PreflightError

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(240)]


def test_a_refused_preflight_names_no_check_as_the_caller_writes_it(tflaunch, testhosts, tmp_path):
    node1 = testhosts.hosts[0]
    cluster = {"ssh": {"options": testhosts.ssh_options, "connect_timeout": 3},
               "worker": [{"host": "node1", "address": node1.address, "port": testhosts.port(),
                           "workdir": "/no/such/dir"}]}
    with pytest.raises(PreflightError) as refused:
        launch(cluster, command=["python", TASK, "print:never"], log_dir=tmp_path / "logs", quiet=True,
               on_line=lambda line: None)
    message = str(refused.value)
    assert message.startswith("cluster: preflight failed: ") and "/no/such/dir" in message
    assert message.endswith("(skip with no_check=True)") and "--" not in message
    assert not (tmp_path / "logs").exists()
    # The command line names its own option, and the command that shows every check.
    import yaml

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster))
    done = subprocess.run(tflaunch.argv(str(path), "--log-dir", str(tmp_path / "logs"), "--", "python", TASK),
                          cwd=tmp_path, env=tflaunch.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().endswith(f"(see 'tflaunch check {path}', or skip with --no-check)"), done.stderr
