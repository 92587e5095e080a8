"""How ``pytest -n N --dist loadfile`` shares the suite among workers
(docs/decisions.md#the-suite-runs-on-xdist-workers).

Each xdist worker is its own pytest process: it enters its own mount namespace and starts its
own zfs-fuse, sshd, S3 server and PostgreSQL when a test first needs them, as a separate
session would. The scheduler here is xdist's ``loadfile`` with one change: every test of the
OpenZFS guest goes to one worker, and first. The guest is shared by every session on the
machine and its tier is the longest single line of work (~26 min of emulated CPU), so it
starts at once while the other workers share the rest, file by file (module-scoped pools and
servers are made once, as in a single session).

Only workers collect, so a worker writes the guest's test ids to a file the controller named
(``ZBAK_TEST_GUEST_IDS``) before it reports its collection, and the scheduler reads it when
the collections are in. (xdist's own ``loadgroup`` cannot carry this: it renames node ids
through ``Item._nodeid``, which pytest 9 no longer reads.)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from support.openzfs import OPENZFS_FIXTURES

GUEST_IDS = "ZBAK_TEST_GUEST_IDS"
GUEST_SCOPE = "openzfs"


def pytest_configure(config) -> None:
    """On an xdist controller, name the file its workers write the guest's test ids to (in
    the environment the workers inherit: they start after this)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        handle, path = tempfile.mkstemp(prefix="zbak-guest-ids.", suffix=".json")
        os.close(handle)
        os.environ[GUEST_IDS] = path
        config.add_cleanup(lambda: Path(path).unlink(missing_ok=True))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Put the guest's tests first; on a worker, write their ids for the scheduler."""
    on_guest = [i for i in items if OPENZFS_FIXTURES & set(getattr(i, "fixturenames", ()))]
    chosen = {id(item) for item in on_guest}
    items[:] = on_guest + [item for item in items if id(item) not in chosen]
    path = os.environ.get(GUEST_IDS)
    if path and hasattr(config, "workerinput"):
        written = Path(f"{path}.{config.workerinput['workerid']}")
        written.write_text(json.dumps([item.nodeid for item in on_guest]))
        written.replace(path)  # whole or absent for the reader; every worker writes the same


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the guest's tests as one unit, scheduled first."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GuestFirstScheduling(LoadScopeScheduling):
        """Scopes are files, except that every test of the guest is in one scope."""

        _guest: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._guest is None:
                self._guest = frozenset(json.loads(Path(os.environ[GUEST_IDS]).read_text()))
            return GUEST_SCOPE if nodeid in self._guest else nodeid.split("::", 1)[0]

    return GuestFirstScheduling(config, log)
