"""The pool controller: turns each pool's desired_instances into placed sandbox records.

| module | its one job |
|---|---|
| `reconciler` | `Reconciler`: the shell that takes state, plans and carries the actions out |
| `plan` | one pool's actions, crash streaks, lost holders, cordons, secrets restarts (pure) |
| `mirror` | `Mirror`: pools, sandboxes, nodes, cordons, states, secrets generations (one watch) |
| `metrics` | the evacuation metrics and the dial-out nodes' tunnel collector |
| `health` | what an operator alerts on: boot crashes, gone nodes, the store answering |
| `api` | the node routes: `wakeful nodes`, `wakeful drain` |
"""
