"""A store's codec chain from its config: what archive encodes with, and what restore, deep
audit and drills decode with (docs/sealed.md).

A store with ``[stores.NAME.age]`` is sealed: archive encrypts every volume to its recipients
(the public keys in ``recipients`` and ``recipients_file``), and reading needs an identity
(``--identity FILE``, else ``identity_file``). :func:`identity_for` is the one place that
choice is made; :func:`reading_codecs` hands out the codec of each chain the catalog records.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from zrepl_py.errors import IdentityNeeded, IdentityUnusable
from zrepl_py.runtime.extras import require
from zrepl_py.runtime.reading import CONFIG_LIMIT, read_regular
from zrepl_py.stores.settings import AGE, StoreConfig
from zrepl_py.streams.codec import Codec, Sealing


def writing_codec(name: str, settings: StoreConfig, level: int) -> Codec:
    """The codec archive writes store ``name``'s volumes with (zstd at ``level``, then age to
    every recipient when the store is sealed).

    Raises:
        ExtraMissing: a sealed store without pyrage (``zbak[age]``).
        IdentityUnusable: a recipient or the recipients file is unusable (exit 2).
    """
    if settings.age is None:
        return Codec(level=level)
    require(AGE, f"store {name}")
    from zrepl_py.streams import age

    where = f"stores.{name}.age.recipients"
    keys = list(settings.age.recipients)
    parsed = age.recipients(keys, where) if keys else []
    file = settings.age.recipients_file
    if file is not None:
        try:
            more = read_regular(file, CONFIG_LIMIT).decode().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else exc
            raise IdentityUnusable(f"stores.{name}.age.recipients_file: cannot read {file}:"
                                   f" {why}") from None
        parsed += age.recipients(more, f"stores.{name}.age.recipients_file {file}")
        keys += [k.strip() for k in more if k.strip() and not k.strip().startswith("#")]
    return Codec(level=level, sealing=Sealing(tuple(keys), tuple(parsed), store=name))


def describe_sealing(name: str, settings: StoreConfig) -> tuple[str, bool]:
    """What ``zbak init`` says of sealed store ``name`` (``[stores.NAME.age]``): its
    recipients parsed, as an archive would, and the ``identity_file`` of this host's config
    read and its age X25519 keys compared with the recipients; and whether that identity
    matches one of them (False: an identity file whose every key is an X25519 key of none of
    them, which opens only streams sealed to other keys; an OpenSSH key is not compared).

    Raises:
        ExtraMissing: pyrage is missing.
        IdentityUnusable: a recipient, the recipients file or the identity file cannot be
            used (exit 2).
    """
    sealing = writing_codec(name, settings, Codec().level).sealing
    assert sealing is not None and settings.age is not None  # a sealed store's settings
    text = f"sealed (age) to {len(sealing.keys)} recipient(s)"
    file = settings.age.identity_file
    if file is None:
        return text + "; no identity_file here (restores and deep audits take --identity)", True
    from zrepl_py.streams import age

    found = age.identities(file)
    publics = {str(key.to_public()) for key in found if hasattr(key, "to_public")}
    if publics & sealing.keys:
        return text + f"; identity_file {file} holds the key of one of them", True
    if len(publics) < len(found):
        return text + f"; identity_file {file} read (an OpenSSH key is not compared)", True
    return (text + f"; identity_file {file} holds the key of none of them: it opens only"
            " streams sealed to other keys", False)


def identity_for(name: str, settings: StoreConfig | None, option: Path | None) -> Path | None:
    """The identity file that decrypts store ``name``: ``option`` (``--identity FILE``) when
    given, else the store's ``[stores.NAME.age] identity_file``, else None."""
    if option is not None:
        return option
    if settings is not None and settings.age is not None:
        return settings.age.identity_file
    return None


def reading_codecs(name: str, settings: StoreConfig | None,
                   option: Path | None) -> Callable[[str], Codec]:
    """A function from a chain's name (the catalog's ``compression``, a manifest's codec) to
    the codec that decodes store ``name``'s volumes of that chain. The identity
    (:func:`identity_for`) is read once, at the first sealed chain asked for.

    Raises (from the returned function):
        IdentityNeeded: a sealed chain and no identity (exit 2).
        IdentityUnusable: the identity file cannot be used (exit 2).
        ExtraMissing: a sealed chain without pyrage.
        StreamCorrupt: a chain this zbak does not know.
    """
    identity = identity_for(name, settings, option)
    cache: dict[str, Codec] = {}

    def codec(chain: str) -> Codec:
        if chain not in cache:
            plain = Codec.named(chain)
            if not plain.sealed:
                cache[chain] = plain
            else:
                cache[chain] = Codec.named(chain, sealing=_opening(name, settings, identity))
        return cache[chain]

    return codec


def _opening(name: str, settings: StoreConfig | None, identity: Path | None) -> Sealing:
    if identity is None:
        raise IdentityNeeded(
            f"store {name} is sealed (age): reading its volumes needs an identity: pass"
            f" --identity FILE, or set [stores.{name}.age] identity_file on this host;"
            " `zbak audit` without --deep and `zbak catalog rebuild` need none")
    require(AGE, f"store {name}")
    from zrepl_py.streams import age

    keys = settings.age.recipients if settings is not None and settings.age else ()
    return Sealing(tuple(keys), identities=tuple(age.identities(identity)), store=name,
                   identity_file=identity)
