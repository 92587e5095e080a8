"""Pre and post hooks around a job's actions (``[jobs.NAME.hooks.ACTION]``,
docs/decisions.md#hooks-are-recorded-runs): ``around`` (``ActionHooks``: pre, the action, post
always; each hook a recorded run), ``command`` (one hook process: no shell, childenv's environment,
output to the log, timeout), ``environment`` (the ``ZBAK_*`` variables a hook is told, pure)."""
