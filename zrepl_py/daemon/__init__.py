"""``zbak daemon``: the scheduler that runs every job's actions unattended
(docs/design.md#operations).

- ``plan``: which (job, action) runs when, from the config (pure).
- ``store``: the APScheduler job store table in the catalog database, and reading it.
- ``gate``: one dataset's actions run one at a time inside the daemon, in action order.
- ``child``: each run is a ``zbak ACTION JOB`` child process; its log lines are relayed.
- ``logs``: human or JSON-lines log formatting.
- ``scheduler``: the ``Daemon`` tying them together (start-up catch-up, SIGTERM).
- ``once``: ``zbak daemon --once``: the actions due now, run one after the other.
"""
