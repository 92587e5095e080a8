"""``zbak serve``: the least-privilege remote side, run as an SSH forced command.

A backup host (or a pull source) puts zbak's key in ``authorized_keys`` as::

    command="zbak serve --root backup/replicas",restrict ssh-ed25519 AAAA... zbak@master

sshd then runs ``zbak serve`` for every session of that key, whatever the client asked for,
and passes the client's request in ``$SSH_ORIGINAL_COMMAND`` (sshd(8) "AUTHORIZED_KEYS FILE
FORMAT", ``command=``). zbak serve:

1. splits the request with the exact grammar ``shlex.join`` / ``proc.openssh.remote_pipeline``
   write (``cmdline``): plain words, single-quoted words, ``" | "`` between commands; any
   other shell syntax (``;``, ``$(...)``, backticks, redirections, globs) is refused;
2. checks every command against the allow-list (``policy``): the zfs/zpool operations zbak
   issues, each dataset inside ``--root``, never ``receive -F`` (unless allowed), never
   ``destroy`` except zbak's own snapshots with ``--allow-destroy-own``, zstd and mbuffer
   only in the pipeline shapes of the data path (mbuffer with zbak's exact arguments, right
   before ``zfs receive``; alone only as the probe ``mbuffer -V``);
3. runs what it approved without a shell (``execute``), or refuses with a logged reason and
   exit status ``REFUSED`` (126).

With ``--keep-newer-than`` (and ``--keep-last``) serve has a floor: snapshots it keeps
whatever the master asks (``floor``; docs/security.md).

Modules: ``cmdline`` (request -> argvs), ``options`` (getopt as zfs parses it), ``token``
(names inside a resume token), ``policy`` (the allow-list, pure), ``floor`` (the floor's
rules, pure), ``journal`` (the floor's witness file), ``guard`` (the floor around a request),
``execute`` (exec, pipes, audit log).
"""
