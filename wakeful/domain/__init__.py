"""The ground layer: models, formats and interfaces every component shares; it imports no
component."""
