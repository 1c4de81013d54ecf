"""A stateful app's state on this node.

- `hold.py`: `StateHold`, the state restored when its sandbox starts, archived and handed back
  when it stops, salvaged after a crash; `Keeper`, what stores and releases it (the control
  plane).
- `claim.py`: `StateClaim`, one stateful sandbox's hold on its state, from its claim to its
  hand-back.
- `archives.py`: `LocalArchives`, this node's copies of the archives (`states/`) and what could
  not be handed on (`kept-states/`); `stale_fate`, what becomes of a leftover one (pure).
- `tree.py`: what a sandbox's tree holds of the state: its directory, never through a link, and
  the `restored` mark a restarted agent salvages it by.
"""
