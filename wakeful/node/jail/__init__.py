"""What confines a sandbox: nothing here decides what runs, only what it may see and do.

- `bwrap.py`: `Jail`, what this machine allows (found once at start) and the command chain that
  starts a sandbox under bubblewrap; `UidTable`, the uid each app gets; `env_script`.
- `slot_main.py`: the chain's last step, inside the sandbox: a warm slot's program (it drops to
  the app's uid itself) and the Landlock scope step.
- `hardening.py`: the uid range, the nftables fence, the bounded tmpfs of a sandbox's tree, the
  seccomp filter against user namespaces, the Landlock probe.
- `cgroups.py`: a sandbox's v1 `memory`, `pids` and `freezer` cgroups.
- `jailed.py`: what one isolated sandbox holds (uid, cgroup, tmpfs) and how its processes are
  found and signalled.
- `peers.py`: the fence's sets kept equal to the other nodes' and the control plane's addresses.
- `thawguard.py`: a process that thaws an agent's frozen sandboxes when the agent dies.
"""
