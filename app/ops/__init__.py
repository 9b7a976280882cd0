"""Operating the service: logs, and what probes and operators read."""
