"""What the tests share, in one place: no test module imports another, and conftests hold
fixtures only.

- `waiting`: `eventually`, the one poll-until-true under a deadline.
- `store`: time passed for the embedded stores' TTLs (`pass_time`); a SQLite lock held from
  outside.
- `faults`: a small filesystem to fill (a full disk).
- `pki`: a CA and certificates made by the README's own commands (etcd over mutual TLS).
- `placing`: sandbox records placed as the pool controller places them (`put_placed`), for
  tests of what a node may get of an app's secrets.
- `control`: the control plane in process, on a free port (`running_control_plane`).
- `activator`: an activator on a store, the sample app's records, and its API served.
- `ingress`: an ingress in process with sandboxes as subprocesses; raw sockets and servers.
- `node`: an agent's settings, the sample app recorded as a deploy leaves it, a sandbox placed
  and awaited, a uid table.
- `up`: `wakeful up` as a real process (`start_up`, `stop_up`, the CLI against it).
- `cluster`: the pieces as separate processes on one store (`start_cluster`).
- `notes`: the stateful sample app.
- `hostile`: the hostile app and what it attempts.
- `podman`: wakeful's image built and run with podman.
"""
