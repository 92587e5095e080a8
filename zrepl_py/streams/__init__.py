"""Bytes of send streams: ``frames`` (one zstd frame per volume, with checksums and an
end-of-frame check) and ``records`` (the send stream's record headers: BEGIN guids)."""
