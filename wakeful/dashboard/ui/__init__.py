"""The dashboard page: HTML, CSS and JavaScript served as they are (no build step)."""
