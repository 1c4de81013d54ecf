"""The node agent: runs the sandboxes placed on this machine as local processes."""
