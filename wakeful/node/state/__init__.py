"""A stateful app's state on this node.

- `hold.py`: `StateHold`, the state restored when its sandbox starts, archived and handed back
  when it stops, salvaged after a crash; `Keeper`, what stores and releases it (the control
  plane).
"""
