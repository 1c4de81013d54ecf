"""Deploys, apps and what the control plane keeps for them (artifacts, states, sandbox output).

| module | its one job |
|---|---|
| `service` | `Deployer`: a definition and an artifact become a version, a pool, a rollout |
| `rollout` | `RolloutRunner`: a rollout carried to its route flip, or abandoned |
| `rollback` | the previous version's pool brought back, as a rollout |
| `deletion` | an app's route, versions and pools gone in one transaction |
| `errors` | `DeployError`, `UnknownApp`: what a deploy is refused with |
| `local` | the deployer used from this process: `wakeful up`'s apps, resumed rollouts |
| `appdir` | an app directory's `wakeful.toml`, validated |
| `artifacts` | `LocalArtifacts`: packed app directories named by their sha256 |
| `collect` | `ArtifactCollector`: the artifacts nothing references any more, deleted |
| `states` | `StateKeeper`: stateful apps' archives and releases, from their nodes |
| `logbook` | `LogBook`: sandbox output pushed by nodes, in memory and bounded |
| `api`, `logs_api` | the control API's routes for the above |
"""
