"""The node agent: runs the sandboxes placed on this machine as local processes.

The agent, and what it writes to the store and the control plane, at the top:

- `agent.py`: `NodeAgent` registers the node, watches the sandboxes placed on it and runs a
  `SandboxRunner` for each (`sandbox/local.py` `runtime_for` builds the runtime the settings
  ask for).
- `registration.py`: the node's record (`nodes/{node}`, under a TTL lease) and `seen/{node}`.
- `cordon.py`: the cordon a stopping agent puts on its own node, lifted when it is back.
- `settings.py`: `NodeSettings` (`WAKEFUL_*`), built once at the entry point.
- `writer.py`: every write to a sandbox record, fenced and compare-and-set; `fencing.py`: the
  pure ownership decision it asks (invariant 15).
- `logship.py`: sandbox output shipped to the control plane, bounded and batched.
- `secrets.py`: `SecretSource`, what the runner asks an app's secrets of at its sandbox's
  start (the control plane: in process, or `wakeful.remote.node.HttpSecrets`), and
  `sandbox_env`, the sandbox's whole environment, made then and kept in memory only.
- `suspended.py`: what the frozen sandboxes hold, and which to give up under memory pressure.
- `testing.py`: `FakeRuntime` and the /proc helpers tests and benchmarks use.

Below it, one package per question:

- `sandbox/`: what runs a sandbox. Its life (`runner`), its process (`runtime`, started by
  `wakeful.aio.spawn`), warm slots started ahead of time (`slots`), readiness (`probe`), its
  port (`ports`), its app files (`workdir`).
- `jail/`: what confines a sandbox. Its uid, the bubblewrap chain, cgroups, the network fence,
  the seccomp and Landlock filters, its bounded tmpfs, the thaw guard.
- `state/`: a stateful app's state while this node holds it.
- `tunnel/`: dial-out, for a node the ingress cannot dial: streams it opens to the ingress tier.

Where what comes next goes:

- `images/`: root filesystems from OCI images. Layers fetched and unpacked once into a rootfs per
  image digest (as `sandbox/workdir.py` does for an app's artifact, checked against its digest
  first), which `jail/bwrap.py` binds read-only into the sandbox in place of the host's system
  directories.
- secrets as files, should an app want them so: beside `secrets.py`, on a tmpfs bound
  read-only into the sandbox, as the account files are (`jail/tmpfs.py`), never on the
  node's disk.
"""
