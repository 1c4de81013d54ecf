"""The dashboard at `/ui`: its server side (`server.py`) and its page (`ui/`)."""
