"""A task for the secrets tests: proves which values arrived without ever printing one.

    python secret_task.py NAME[,NAME...] RELEASE_FILE

Prints ``HASH <task> <NAME> <sha256 of the value>`` (``unset`` when the variable is missing) for
each NAME, then stays alive until RELEASE_FILE exists (at most 120 s), so that a test can look at
every process's command line while the whole run is up.
"""

import hashlib
import os
import sys
import time


def main(names: str, release: str) -> None:
    me = os.environ.get("TFLAUNCH_TASK", "?")
    for name in names.split(","):
        value = os.environ.get(name)
        digest = "unset" if value is None else hashlib.sha256(value.encode()).hexdigest()
        print(f"HASH {me} {name} {digest}", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
