"""glibc's malloc told to keep two arenas, so the freed buffers of one volume are reused by
the next instead of staying resident in another thread's arena
(docs/performance.md#the-peak-memory-of-a-long-archive).

glibc gives threads their own arenas (up to 8 per CPU, mallopt(3) ``M_ARENA_MAX``) and
returns an arena's free memory to the system only from the top of its heaps. An archive
starts new helper threads for every volume (the zstd workers, the raw hash, a sealed
volume's age step, the store's writer), so the buffers of one volume were freed in one
arena while the next volume's came from another, and what was freed stayed resident:
a sealed archive of 4 GiB in 256 MiB volumes peaked at 162-199 MiB, growing volume by
volume. With two arenas it peaked at 129-131 MiB (one arena: 125-127 MiB). One arena cost
a sealed archive of 2 GiB of 50 % compressible data 15-18 % more CPU in two of three runs;
with two, its CPU stayed within the spread of the code before (20.4-22.5 s against
20.1-21.9 s).
"""

from __future__ import annotations

M_ARENA_MAX = -8
"""mallopt(3)'s parameter number (glibc's malloc.h)."""
ARENAS = 2
"""The arenas a zbak process keeps."""


def few_arenas() -> None:
    """Limit this process's malloc to ``ARENAS`` arenas (glibc's ``mallopt(M_ARENA_MAX)``).
    Call it before the process starts a thread: a thread keeps the arena it took. A C
    library without ``mallopt`` (or one that ignores the parameter) is left as it is.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_ARENA_MAX, ARENAS)
