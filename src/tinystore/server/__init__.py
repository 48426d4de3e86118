"""The store process: the directory's owner, its listeners and sessions, sidecar discovery and shutdown."""
