"""Logging set-up: human lines on stderr; botocore/urllib3/paramiko never at DEBUG.

botocore and urllib3 print request headers, including credentials, at DEBUG
(boto/botocore#2626), so they are pinned to WARNING whatever ``--debug`` says.
"""

from __future__ import annotations

import logging
import time

_WIRE_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer", "paramiko")
_CHATTY_LOGGERS = ("alembic",)  # announces its dialect on every catalog open


def setup_logging(level: str) -> None:
    """Configure the root logger at ``level`` (DEBUG/INFO/WARNING/ERROR) on stderr."""
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%SZ",
        force=True,
    )
    logging.Formatter.converter = time.gmtime
    for name in _WIRE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
