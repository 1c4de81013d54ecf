"""The pool controller: turns each pool's desired_instances into placed sandbox records.

| module | its one job |
|---|---|
| `reconciler` | `Reconciler`: the shell that takes state, plans and carries the actions out |
| `plan` | what to do to one pool, crash streaks, lost holders, cordoned nodes (pure) |
| `mirror` | `Mirror`: the pools, sandboxes, nodes, cordons and states one watch keeps |
| `metrics` | the evacuation metrics and the dial-out nodes' tunnel collector |
| `health` | what an operator alerts on: boot crashes, gone nodes, the store answering |
| `api` | the node routes: `wakeful nodes`, `wakeful drain` |
"""
