"""Walk a whole send stream the way ``zbak audit --deep`` does (``audit.deep``): feed its
chunks to a ``RecordWalker`` as they come, then ``finish``."""

from __future__ import annotations

from collections.abc import Iterable

from zrepl_py.streams.records import RecordWalker, StreamSummary


def walk(chunks: Iterable[bytes], what: str) -> StreamSummary:
    """The summary of the stream ``chunks`` make up; ``what`` names it in errors.

    Raises:
        StreamCorrupt: the stream is not a complete, well-formed send stream.
    """
    walker = RecordWalker(what)
    for chunk in chunks:
        walker.feed(chunk)
    return walker.finish()
