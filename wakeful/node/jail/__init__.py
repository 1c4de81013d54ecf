"""What confines a sandbox: nothing here decides what runs, only what it may see and do.

- `bwrap.py`: `Jail`, what this machine allows and the command chain that starts a sandbox
  under bubblewrap; `env_script`, the app's environment off the command line.
- `detect.py`: `detect_jail`, what this machine allows, found and checked once at start (the
  tools, root, a container's capabilities, the probe sandbox's uid drop).
- `uids.py`: `UidTable`, each app's own uid, claimed machine-wide.
- `slot_main.py`: the chain's last step, inside the sandbox: a warm slot's program (it drops to
  the app's uid itself) and the Landlock scope step.
- `tmpfs.py`: the bounded tmpfs of a sandbox's tree (its /app, /tmp, /dev/shm, accounts).
- `cgroups.py`: a sandbox's v1 `memory`, `pids` and `freezer` cgroups.
- `network.py`: the nftables fence on the sandbox uids' traffic; `peers.py` keeps its sets equal
  to the other nodes' and the control plane's addresses.
- `kernel.py`: the seccomp filter against user namespaces, the Landlock probe.
- `jailed.py`: what one isolated sandbox holds (uid, cgroup, tmpfs) and how its processes are
  found and signalled.
- `thawguard.py`: a process that thaws an agent's frozen sandboxes when the agent dies;
  `guarding.py`: the agent's side, which keeps one running.

`IsolationUnavailable` (here): this machine cannot isolate sandboxes as configured.
"""


class IsolationUnavailable(RuntimeError):
    """The machine cannot isolate sandboxes as configured; the message says what to do."""
