"""What ``zbak status`` and the Prometheus exporter show: ``report`` (per job and target: last
success, lag, chains, held bases, next runs, running transfers), ``metrics`` (the same as
Prometheus families) and ``check`` (``zbak status --check``: Nagios exit codes)."""
