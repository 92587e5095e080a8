"""Child processes: ``spawn`` (the one way zbak starts a process, always with ``childenv``'s
environment without secrets), the ``Executor`` contract (``executor``) with ``local`` and
``ssh`` (paramiko) executors, ``openssh`` (argv for the ssh binary; hosts taken by shape),
``pipeline`` (``zfs send | ... | zfs receive`` process to process, per-stage exit status and
stderr), ``python_end`` (one end of a pipeline in Python), ``mbuffer`` (the receive buffer)."""
