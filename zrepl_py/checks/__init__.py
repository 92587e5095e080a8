"""Checks before work: ``health`` judges pool reports (state, errors, free space against
``min_free``) before a replication or archive run; ``preflight`` checks every source, target
and store for ``zbak init``."""
