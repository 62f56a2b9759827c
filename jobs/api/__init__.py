"""OpenPAI v1-compatible REST API, served under /api/v1/ and /rest-server/api/v1/."""
