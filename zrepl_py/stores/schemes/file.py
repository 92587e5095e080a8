"""``file:///DIR``: a store that is a local directory (a mounted disk, NFS, a NAS share).

It has no keys of its own beyond those every store has (``StoreConfig``); the path after
``file://`` is absolute and taken literally, without percent-decoding.
"""

from __future__ import annotations

from pathlib import Path

from zrepl_py.stores.base import Backend
from zrepl_py.stores.scheme import Scheme, StoreEnv
from zrepl_py.stores.settings import StoreConfig

PREFIX = "file://"


class FileStoreConfig(StoreConfig):
    """``[stores.NAME]`` with ``url = "file:///DIR"``."""

    @classmethod
    def check_url(cls, url: str) -> None:
        """Raises ValueError unless ``url`` is ``file://`` followed by an absolute path."""
        if not url.startswith(PREFIX + "/"):
            raise ValueError(f"expected {SCHEME.form!r}")

    @property
    def directory(self) -> Path:
        """The store's directory: the URL's path."""
        return Path(self.url.removeprefix(PREFIX))


def _open(name: str, settings: FileStoreConfig, env: StoreEnv) -> Backend:
    from zrepl_py.stores.file import FileBackend

    return FileBackend(name, settings.directory)


SCHEME = Scheme(name="file", form="file:///absolute/dir", settings=FileStoreConfig, extra=None,
                open=_open)
