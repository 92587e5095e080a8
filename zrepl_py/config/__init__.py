"""The config: one TOML file validated once into frozen values (``schema``, pydantic), with
errors that name the key and the file (``loading``), read as a regular bounded file
(``reading``), in units of bytes and seconds (``units``), secrets that redact themselves
(``secret``)."""
