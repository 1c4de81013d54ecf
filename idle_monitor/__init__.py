"""The idle monitor: scales pools nobody calls down toward min_instances (zero by default)."""
