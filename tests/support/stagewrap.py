"""A pipeline stage that misbehaves on purpose; run as ``python stagewrap.py MODE ... [-- ARGV]``.

Used through the helpers of ``support.executor`` (``cut_stage``, ``stderr_stage``, ...), which
build the ``Stage`` argv. Modes:

``cut --after N -- ARGV``
    run ARGV (the sender) as a child, copy its stdout to ours, and after N bytes SIGKILL it
    and exit 137 (128 + SIGKILL, what a shell reports for a killed child) with
    ``faults: killed ARGV0 after N bytes`` on stderr. Downstream sees exactly N bytes, then EOF.
``stderr --text T -- ARGV``
    write T to stderr, then exec ARGV (stdout and exit status are ARGV's own).
``fail-at-end --code C --text T -- ARGV``
    run ARGV, copy all of its stdout, then write T to stderr and exit C whatever ARGV did:
    a sender whose exit status is the only sign of failure.
``flip --at N --mask M -- ARGV``
    copy ARGV's stdout with byte N XORed with M (a bit flipped inside the stream).
``receiver-fails --after N --code C --text T``
    read and discard N bytes of stdin, write T to stderr, exit C while the sender still writes
    (zrepl ``ReplicationReceiverErrorWhileStillSending``).
``garbage --bytes N --seed S``
    write N bytes of seeded pseudo-random data (not a ZFS stream) and exit 0.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys

BUF = 1 << 20  # bytes per read


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _child(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)


def cut(after: int, argv: list[str]) -> int:
    child = _child(argv)
    left = after
    while left > 0:
        data = os.read(child.stdout.fileno(), min(BUF, left))
        if not data:  # the sender ended before N bytes: pass its own status on
            return child.wait()
        _write_all(1, data)
        left -= len(data)
    child.send_signal(signal.SIGKILL)
    child.wait()
    sys.stderr.write(f"faults: killed {argv[0]} after {after} bytes\n")
    return 128 + signal.SIGKILL


def fail_at_end(code: int, text: str, argv: list[str], *, flip_at: int | None = None,
                mask: int = 1) -> int:
    child = _child(argv)
    offset = 0
    while data := os.read(child.stdout.fileno(), BUF):
        if flip_at is not None and offset <= flip_at < offset + len(data):
            changed = bytearray(data)
            changed[flip_at - offset] ^= mask
            data = bytes(changed)
        offset += len(data)
        _write_all(1, data)
    status = child.wait()
    if flip_at is not None:  # flip mode: the child's own status
        return status if status >= 0 else 128 - status
    sys.stderr.write(text + "\n")
    return code


def receiver_fails(after: int, code: int, text: str) -> int:
    left = after
    while left > 0:
        data = os.read(0, min(BUF, left))
        if not data:
            break
        left -= len(data)
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    return code


def garbage(size: int, seed: int) -> int:
    rng = random.Random(seed)
    left = size
    while left > 0:
        n = min(BUF, left)
        _write_all(1, rng.randbytes(n))
        left -= n
    return 0


def main(args: list[str]) -> int:
    argv: list[str] = []
    if "--" in args:
        cut_at = args.index("--")
        args, argv = args[:cut_at], args[cut_at + 1:]
    parser = argparse.ArgumentParser(prog="stagewrap")
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("cut")
    p.add_argument("--after", type=int, required=True)
    p = sub.add_parser("stderr")
    p.add_argument("--text", required=True)
    p = sub.add_parser("fail-at-end")
    p.add_argument("--code", type=int, required=True)
    p.add_argument("--text", required=True)
    p = sub.add_parser("flip")
    p.add_argument("--at", type=int, required=True)
    p.add_argument("--mask", type=int, default=1)
    p = sub.add_parser("receiver-fails")
    p.add_argument("--after", type=int, required=True)
    p.add_argument("--code", type=int, default=1)
    p.add_argument("--text", required=True)
    p = sub.add_parser("garbage")
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(args)
    needs_argv = opts.mode in ("cut", "stderr", "fail-at-end", "flip")
    if needs_argv != bool(argv):
        parser.error(f"mode {opts.mode} {'needs' if needs_argv else 'takes no'} -- ARGV")
    if opts.mode == "cut":
        return cut(opts.after, argv)
    if opts.mode == "stderr":
        sys.stderr.write(opts.text + "\n")
        sys.stderr.flush()
        os.execvp(argv[0], argv)
    if opts.mode == "fail-at-end":
        return fail_at_end(opts.code, opts.text, argv)
    if opts.mode == "flip":
        return fail_at_end(0, "", argv, flip_at=opts.at, mask=opts.mask)
    if opts.mode == "receiver-fails":
        return receiver_fails(opts.after, opts.code, opts.text)
    return garbage(opts.bytes, opts.seed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
