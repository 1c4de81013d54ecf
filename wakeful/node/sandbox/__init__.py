"""What runs a sandbox on this node, from the record placed here to the process that ends.

- `runner.py`: one sandbox's life (`SandboxRunner`): claim its record, prepare, start, probe,
  serve, freeze and thaw, stop, report.
- `freezing.py`: a ready sandbox frozen and thawed as its record asks (the suspended tier).
- `outcome.py`: how a sandbox's end is recorded: the event and its `last_log` (pure).
- `runtime.py`: the `Runtime` and `SandboxProcess` interfaces the runner needs, and the
  `Identity` a process is started with.
- `local.py`: `ProcessRuntime`, the real runtime: a sandbox as a local process, isolated in a
  `jail.bwrap.Jail` when it has one, cold or from a warm slot; `runtime_for`, the one the
  node's settings ask for.
- `process.py`: `LocalProcess`, one running sandbox: its output pumped, frozen and thawed,
  signalled, stopped.
- `output.py`: a sandbox's output: a bounded log file, and its last lines for a crash report.
- `slots.py`: warm slots, sandboxes started ahead of time that a start takes over.
- `probe.py`: readiness, from the first millisecond.
- `ports.py`: the port a sandbox listens on, and who listens on a port.
- `workdir.py`: a sandbox's directory and app files, its artifact checked and unpacked.
"""
