"""A warm slot's program (stdlib only, run as `python -I -S slot_main.py`): it waits, already in
its cgroups, for one start message on stdin, then becomes the sandbox's chain.

The message is JSON: `argv` and `env` for execve, `rlimits` ([name, value] pairs, soft = hard)
to set first, and the bwrap `--args` and `--seccomp`
contents (hex) that go into memory files at fds 3 and 4 (the numbers the argv names). EOF
without a message (the agent discards the slot) is a quiet exit.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys

FDS = {"args": 3, "seccomp": 4}


def main() -> None:
    raw = sys.stdin.buffer.read()
    if not raw:
        return
    message = json.loads(raw)
    for name, value in message["rlimits"]:
        limit = getattr(resource, f"RLIMIT_{name}")
        resource.setrlimit(limit, (int(value), int(value)))
    for key, number in FDS.items():
        data = message.get(key)
        if data is None:
            continue
        fd = os.memfd_create(key, 0)
        os.write(fd, bytes.fromhex(data))
        os.lseek(fd, 0, os.SEEK_SET)
        if fd != number:
            os.dup2(fd, number)  # inheritable, unlike the memfd itself
            os.close(fd)
        else:
            os.set_inheritable(fd, True)
    # Python ignores SIGPIPE and SIGXFSZ at start, and an ignored signal stays ignored across
    # exec: the app must get the defaults, as from the chain that starts without a slot.
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    argv = [str(arg) for arg in message["argv"]]
    os.execve(argv[0], argv, {str(k): str(v) for k, v in message["env"].items()})


if __name__ == "__main__":
    main()
