"""The dashboard at `/ui`: its server side, one module per job, and its page (`ui/`).

| module | its one job |
|---|---|
| `server` | the routes: the page, the login form, the event stream; the security headers |
| `sessions` | `Sessions`: signed session cookies for the admin token, under the store's key |
| `live` | `Dashboard`: the one loop that records scale events and feeds every stream |
| `snapshot` | what a snapshot holds, built from the process's memory (no I/O) |
"""
