"""The activator: admission, leases and scale-up, the suspended tier, and the control API.

- `core.py`: `Activator`, the facade over the parts below (each the one writer of its state);
  `term.py`: whether it may grant and suspend now (leading, the adoption window).
- `view.py`: the watched view of apps, pools, sandboxes and nodes.
- `ledger.py`: leases and parked waiters, in memory, on one clock.
- `decisions.py`: the pure admission and sizing rules; `refusals.py`: what a request that
  gets no lease is told.
- `scale_up.py`, `activity.py`: the compare-and-set writers of pool sizes and
  `last_activity`.
- `suspend.py` (freeze and thaw), `evict.py` (stops for a node's memory cap), and their pure
  rules in `suspend_decisions.py`.
- `reporting.py`: pool snapshots and the dashboard's charts; `metrics.py`,
  `pool_metrics.py`: Prometheus.
- `api.py`: the control API (the lease API, the routers mounted on it, the role check);
  `channel.py`: the lease channel; `roles.py`: which role may call which route;
  `credentials.py`, `tokens_api.py`: role tokens; `standby.py`: what a standby serves;
  `settings.py`.
- `lease_errors.py`: the lease errors on the wire, one table for both transports.
- `client/`: the three adapters of `Leases` (in-process, the lease channel, HTTP).
"""
