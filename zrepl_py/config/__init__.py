"""The config: one TOML file validated once into frozen values (``schema``, the whole file;
one module per section: ``hosts``, ``catalog``, ``jobs`` with ``retention``, ``replicate``
and ``archive``, ``restore``, ``alerts``, ``daemon``; a store's keys are its scheme's,
``zrepl_py.stores.registry``), with errors that name the key and the file (``loading``), read
as a regular bounded file (``reading``), secrets that redact themselves (``secret``), and the
pip extras it needs (``extras``). Its value types (bytes, seconds, schedules, names) are
``zrepl_py.values``."""
