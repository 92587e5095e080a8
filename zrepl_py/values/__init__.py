"""The config's value types, below every package that reads a config: ``units`` (durations,
byte sizes, cron schedules, as plain functions), ``cron`` (the one crontab(5) parser),
``names`` (names of hosts, stores and jobs), ``fields`` (the same as pydantic types, and
``Table``, the base of every config table)."""
