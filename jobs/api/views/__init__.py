"""API views, one module per resource: root (info, description), tokens,
jobs, logs, virtual clusters, users."""
