"""The state directory: private (0700) whatever the umask, as RELIABILITY case 41 asks."""

from __future__ import annotations

import os
from pathlib import Path


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if missing and make it mode 0700; return it.

    Raises:
        OSError: when the directory cannot be created or chmod-ed.
    """
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path
