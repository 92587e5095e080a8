"""The owner stamps on zbak's temporary datasets (``runtime.owner``): a stamp names this
machine's process, and a later run can tell whether that process is gone, so it removes what
a killed run left (docs/decisions.md#temporary-datasets-carry-their-owner)."""

from __future__ import annotations

import os
import subprocess
import sys

from zrepl_py.runtime.owner import Owner, owner_gone, process_start, this_machine, this_process


def test_this_process_is_alive_by_its_own_stamp():
    me = this_process()
    assert me.pid == os.getpid() and me.start == process_start(os.getpid())
    assert Owner.parse(me.stamp()) == me
    assert owner_gone(me.stamp()) is False


def test_a_stamp_of_a_process_that_ended_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(child.pid)
    child.wait()
    machine, boot = this_machine()
    assert owner_gone(Owner(machine, boot, child.pid, start or 1).stamp()) is True


def test_a_reused_pid_a_reboot_another_machine_and_garbage_are_told_apart():
    machine, boot = this_machine()
    me = this_process()
    assert owner_gone(Owner(machine, boot, me.pid, me.start + 1).stamp()) is True  # pid reused
    assert owner_gone(Owner(machine, "0" * 32, me.pid, me.start).stamp()) is True  # rebooted
    assert owner_gone(Owner("another-machine", boot, me.pid, me.start).stamp()) is None
    for garbage in ("-", "", "a:b:c", "a:b:x:1", "a:b:1:"):
        assert owner_gone(garbage) is None
