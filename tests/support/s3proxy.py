"""An HTTP reverse proxy on 127.0.0.1 in front of moto's S3 server: what moto lacks.

* ``verify_checksums``: it emulates S3's check of ``x-amz-checksum-sha256``. S3 computes the
  SHA-256 of each PutObject and UploadPart body as it arrives and, when it differs from the
  header, answers ``400 BadDigest`` ("The sha256 you specified did not match the calculated
  checksum.") and stores nothing (AWS S3 user guide, "Checking object integrity"). moto 5.2.5
  stores the body whatever the header says, so without this no test here could see S3 refuse
  a damaged upload (docs/reliability.md#r14-wrong-checksum). The body is read whole, also in
  ``aws-chunked`` encoding (the checksum then in the trailer), before anything is passed on.
* ``object_lock``: it emulates what S3 Object Lock refuses and moto 5.2.5 allows (measured:
  moto lets PutObjectRetention shorten or remove a COMPLIANCE or GOVERNANCE retention). S3
  refuses a PutObjectRetention that shortens or removes a COMPLIANCE retention from anyone,
  and one that shortens or removes a GOVERNANCE retention unless the request says
  ``x-amz-bypass-governance-retention: true`` and the caller holds
  ``s3:BypassGovernanceRetention`` (AWS S3 user guide, "Locking objects with Object Lock",
  "Retention modes"); the keys the tests emulate hold no bypass permission (the writer's and
  pruner's policies in docs/security.md), so every request asking for a bypass is refused
  too, as IAM would (``403 AccessDenied``). moto itself refuses DeleteObject of a locked
  version.
* ``read_only``: every request that would change the bucket (PUT, POST, DELETE) is refused
  with ``403 AccessDenied``, as S3 answers a key whose IAM policy grants ``s3:Get*`` and
  ``s3:List*`` only.
* ``rewrite(method, path, status, body) -> (status, body)`` may change each answer,
  ``intercept(method, path) -> (status, body) | None`` may answer a request itself.
* ``requests`` lists every request received as a :class:`Seen` (method, path, and for a
  request with a body its checksum header and the SHA-256 of what arrived).

Whole bodies are held in memory both ways: tests use objects of a few MiB.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import http.client
import http.server
import threading
import uuid
from collections.abc import Callable
from typing import NamedTuple
from urllib import parse
from xml.etree import ElementTree

Rewrite = Callable[[str, str, int, bytes], tuple[int, bytes]]
Intercept = Callable[[str, str], tuple[int, bytes] | None]

BAD_DIGEST = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>BadDigest</Code>'
              "<Message>The sha256 you specified did not match the calculated checksum."
              "</Message><RequestId>{id}</RequestId></Error>")
"""S3's answer to a body whose SHA-256 is not the one its x-amz-checksum-sha256 names."""

ACCESS_DENIED = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
                 "<Message>Access Denied</Message><RequestId>{id}</RequestId></Error>")
"""S3's answer to a request the caller's policy or an object's lock does not allow."""

_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def _retention(xml: bytes) -> tuple[str | None, str | None]:
    """``(Mode, RetainUntilDate)`` of a ``Retention`` document (None where absent)."""
    if not xml.strip():
        return None, None
    root = ElementTree.fromstring(xml)

    def field(name: str) -> str | None:
        found = root.find(_S3_NS + name)
        found = root.find(name) if found is None else found
        return None if found is None or not (found.text or "").strip() else found.text

    return field("Mode"), field("RetainUntilDate")


def _shortens(current: tuple[str | None, str | None], wanted: tuple[str | None, str | None]
              ) -> bool:
    """Whether setting retention ``wanted`` over ``current`` shortens or removes it (dates
    ISO 8601; a lapsed lock protects nothing)."""
    mode, until = current
    if mode is None or until is None:
        return False
    start = dt.datetime.fromisoformat(until.replace("Z", "+00:00"))
    if start <= dt.datetime.now(dt.UTC):
        return False
    if wanted[1] is None:
        return True
    return dt.datetime.fromisoformat(wanted[1].replace("Z", "+00:00")) < start


class Seen(NamedTuple):
    """One request: ``method`` and ``path`` (with the query); for a PUT or POST with a body,
    ``checksum`` (the ``x-amz-checksum-sha256`` sent, header or trailer, base64; None when
    absent) and ``sha256`` (base64 SHA-256 of the body that arrived, decoded)."""

    method: str
    path: str
    checksum: str | None = None
    sha256: str | None = None

    @property
    def uploads_bytes(self) -> bool:
        """True for a PutObject or an UploadPart (a PUT of a key, not a copy)."""
        return self.method == "PUT" and self.sha256 is not None


def _aws_chunked(raw: bytes) -> tuple[bytes, dict[str, str]]:
    """The payload and trailers of an ``aws-chunked`` body (``SIZE[;chunk-signature=...]``
    CRLF, data, CRLF ... a 0-size chunk, then ``name:value`` trailer lines)."""
    data, at = bytearray(), 0
    while True:
        end = raw.index(b"\r\n", at)
        size = int(raw[at:end].split(b";")[0], 16)
        at = end + 2
        if size == 0:
            break
        data += raw[at:at + size]
        at += size + 2
    trailers = {}
    for line in raw[at:].split(b"\r\n"):
        name, sep, value = line.decode().partition(":")
        if sep:
            trailers[name.strip().lower()] = value.strip()
    return bytes(data), trailers


class S3Proxy:
    """The proxy (see the module docstring); ``url`` is its endpoint, ``close()`` stops it.

    Args:
        upstream: moto's endpoint URL (``http://HOST:PORT``).
        verify_checksums: answer BadDigest, as S3 does, to an upload whose body does not
            match its ``x-amz-checksum-sha256``; moto then never sees it.
        object_lock: refuse, as S3 does, what Object Lock forbids and moto allows.
        read_only: refuse every request that changes the bucket.
        rewrite / intercept: see the module docstring.
    """

    def __init__(self, upstream: str, *, verify_checksums: bool = False,
                 object_lock: bool = False, read_only: bool = False,
                 rewrite: Rewrite | None = None, intercept: Intercept | None = None):
        host, port = upstream.removeprefix("http://").split(":")
        proxy = self
        self.requests: list[Seen] = []
        self.refused: list[Seen] = []
        rewriting: Rewrite = rewrite or (lambda method, path, status, body: (status, body))
        intercepting: Intercept = intercept or (lambda method, path: None)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, and 100-continue as S3 answers it

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: bytes,
                        headers: tuple[tuple[str, str], ...] = ()) -> None:
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _seen(self, raw: bytes) -> Seen:
                if self.command not in ("PUT", "POST") or "x-amz-copy-source" in self.headers:
                    return Seen(self.command, self.path)
                body, checksum = raw, self.headers.get("x-amz-checksum-sha256")
                if "aws-chunked" in (self.headers.get("Content-Encoding") or ""):
                    body, trailers = _aws_chunked(raw)
                    checksum = checksum or trailers.get("x-amz-checksum-sha256")
                digest = base64.b64encode(hashlib.sha256(body).digest()).decode()
                return Seen(self.command, self.path, checksum, digest)

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                seen = self._seen(raw)
                proxy.requests.append(seen)
                if (verify_checksums and seen.method == "PUT" and seen.checksum is not None
                        and seen.checksum != seen.sha256):
                    proxy.refused.append(seen)
                    body = BAD_DIGEST.format(id=uuid.uuid4().hex[:16].upper()).encode()
                    self._answer(400, body, (("Content-Type", "application/xml"),))
                    return
                if ((read_only and self.command in ("PUT", "POST", "DELETE"))
                        or (object_lock and self._lock_refuses(raw))):
                    proxy.refused.append(seen)
                    body = ACCESS_DENIED.format(id=uuid.uuid4().hex[:16].upper()).encode()
                    self._answer(403, body, (("Content-Type", "application/xml"),))
                    return
                own = intercepting(self.command, self.path)
                if own is not None:
                    self._answer(own[0], own[1], (("Content-Type", "application/xml"),))
                    return
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "expect")}
                headers["Host"] = f"{host}:{port}"
                conn.request(self.command, self.path, body=raw, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                status, data = rewriting(self.command, self.path, answer.status, data)
                self.send_response(status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection",
                                           "date", "server"):
                        self.send_header(key, value)
                head = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", head or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            def _lock_refuses(self, raw: bytes) -> bool:
                """Whether S3 would refuse this request for an object's lock (module
                docstring): a bypass asked for, or a retention shortened or removed."""
                if self.headers.get("x-amz-bypass-governance-retention", "").lower() == "true":
                    return True
                query = parse.parse_qs(parse.urlsplit(self.path).query,
                                       keep_blank_values=True)
                if self.command != "PUT" or "retention" not in query:
                    return False
                # the lock now: HeadObject of the version with the caller's credentials
                # (moto answers a GetObjectRetention of a version without one with its bytes)
                version = "".join(f"?versionId={parse.quote(v)}" for v in query.get("versionId", []))
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                conn.request("HEAD", parse.urlsplit(self.path).path + version, headers={
                    k: v for k, v in self.headers.items()
                    if k.lower() in ("authorization", "x-amz-date", "x-amz-security-token")})
                answer = conn.getresponse()
                answer.read()
                current = (answer.getheader("x-amz-object-lock-mode"),
                           answer.getheader("x-amz-object-lock-retain-until-date"))
                conn.close()
                if "aws-chunked" in (self.headers.get("Content-Encoding") or ""):
                    raw = _aws_chunked(raw)[0]
                return answer.status == 200 and _shortens(current, _retention(raw))

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self.server.shutdown()
        self.server.server_close()
