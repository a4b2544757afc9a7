"""The Claude Code proposer's one way out of its jail (:class:`ApiRelay`): a Unix socket that forwards
the CLI's requests to the Messages API, adding the API key outside the jail.

In the search's process, :class:`ApiRelay` accepts on its socket (the one file of a folder bound
read-only into the jail; the launcher inside forwards a loopback port to it) and sends each request on
to the configured API (``llm.base_url``, default Anthropic's), one request per connection, with the
``Host`` header set for it and the **API key added here**: the key never enters the jail (the CLI holds
a placeholder), and is masked in whatever the upstream answers. Only the API's own routes and methods
are forwarded (``POST /v1/messages``, its ``count_tokens``, ``GET /v1/models``), written plainly (no
escapes, dot segments or other queries); anything else is answered 4xx and goes nowhere. One thread
serves every connection; pending and forwarded connections are capped. See claude_code.py for the
session around it.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from whale_train.meta_harness.proposer import ProposerError

#: What the CLI asks of the API (``POST /v1/messages?beta=true`` and its token counter; the model list
#: for a model check): (method, path) as sent, with at most the query ``beta=true``. Nothing else goes out.
RELAY_ROUTES = re.compile(
    r"(?P<path>/v1/messages|/v1/messages/count_tokens|/v1/models(?:/[A-Za-z0-9][A-Za-z0-9._:-]{0,127})?)"
    r"(?:\?beta=true)?"
)
RELAY_METHODS = {"/v1/messages": "POST", "/v1/messages/count_tokens": "POST", "/v1/models": "GET"}
#: A header name (RFC 9110 token); a header line that is not ``name: value`` is refused.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: Request headers never forwarded: the relay sets its own (Host, the key, Connection, identity encoding,
#: so that a reply is plain text the key can be masked in), and hop-by-hop ones.
_DROPPED = {
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "upgrade",
    "te",
    "trailer",
    "x-api-key",
    "authorization",
    "accept-encoding",
    "expect",
}


class ApiRelay:
    """The jail's one way out: a Unix socket in a fresh folder, forwarding to ``upstream``.

    Each connection carries one HTTP request. Its head is read here (within ``head_s`` seconds, at most
    64 KiB) and checked: only the API's own routes (:data:`RELAY_ROUTES`, each with its one method:
    ``TRACE``, ``CONNECT``, ``DELETE`` and the rest get 405), written plainly (a ``%`` escape, a
    backslash, a dot segment, an empty segment, another query, a control byte: 400; any other path:
    403), with well-formed headers (one ``Content-Length`` at most, not beside ``Transfer-Encoding``).
    Such a request goes to the upstream with ``Host`` set for it, ``x-api-key`` set to ``api_key``
    (when given; any ``Authorization`` dropped), ``Accept-Encoding: identity`` and ``Connection:
    close``; then the body and the answer are piped through (a streamed answer streams), the answer
    with every occurrence of the key masked (an upstream that echoes requests cannot hand it back).
    A refused request goes nowhere.

    All connections are served by one thread (an event loop): idle ones cost no thread. At most
    ``max_pending`` connections may be waiting to send their head (a new one closes the oldest) and
    ``max_active`` requests be forwarded at once (more get 503); an answer that sends nothing for
    ``idle_s`` seconds is cut. ``requests`` lists what was forwarded (method, target), ``refused``
    what was not (the first 1000).
    """

    def __init__(
        self,
        upstream: str,
        api_key: str | None,
        *,
        head_s: float = 30.0,
        idle_s: float = 600.0,
        max_pending: int = 128,
        max_active: int = 32,
    ):
        url = urlsplit(upstream.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ProposerError(f"llm.base_url must be an http(s) URL, got {upstream!r}")
        self.tls = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path  # a gateway's base path, put before the request's path
        self.api_key = api_key
        self.head_s, self.idle_s = head_s, idle_s
        self.max_pending, self.max_active = max_pending, max_active
        self.requests: list[tuple[str, str]] = []
        self.refused: list[str] = []
        self.folder = Path(tempfile.mkdtemp(prefix="whale-relay-"))
        self.folder.chmod(0o755)
        self.path = self.folder / "api.sock"
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.bind(str(self.path))
        self.path.chmod(0o777)  # the jail's unprivileged uid connects (the folder itself is read-only there)
        self._sock.listen(128)
        self._sock.setblocking(False)
        self._closed = False
        self._pending: dict[asyncio.StreamWriter, None] = {}  # oldest first
        self._active = 0
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True, name="whale-relay")
        self._thread.start()
        started.wait(10)

    # ------------------------------------------------------------------ the loop

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_unix_server(self._one, sock=self._sock))
        started.set()
        self._loop.run_forever()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    def _refuse(self, what: str) -> None:
        if len(self.refused) < 1000:
            self.refused.append(what)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._pending[writer] = None
        while len(self._pending) > self.max_pending:  # the oldest connection that sent no head yet
            oldest = next(iter(self._pending))
            self._pending.pop(oldest)
            oldest.transport.abort()
            self._refuse("(a connection that sent no request, closed for a newer one)")
        up_writer = None
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.head_s)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, OSError):
                return
            finally:
                self._pending.pop(writer, None)
            status, request = self._check(head[:-4].decode("latin-1"))
            if status:
                self._refuse(request)
                writer.write(_answer(status, f"refused by the relay: {request}"[:300]))
                await writer.drain()
                return
            if self._active >= self.max_active:
                self._refuse("(too many requests at once)")
                writer.write(_answer("503 Service Unavailable", "the relay is busy", retry=True))
                await writer.drain()
                return
            self._active += 1
            try:
                method, target, out = request
                self.requests.append((method, target))
                try:
                    up_reader, up_writer = await asyncio.wait_for(
                        asyncio.open_connection(
                            self.host,
                            self.port,
                            ssl=ssl.create_default_context() if self.tls else None,
                            server_hostname=self.host if self.tls else None,
                        ),
                        self.head_s,
                    )
                except (OSError, asyncio.TimeoutError) as exc:  # the CLI sees an HTTP error naming it
                    text = f"the relay cannot reach {self.host}:{self.port}: {exc or 'timed out'}"
                    writer.write(_answer("502 Bad Gateway", text))
                    await writer.drain()
                    return
                up_writer.write(out)
                upload = asyncio.ensure_future(_pipe(reader, up_writer, None))
                try:
                    await _pipe(up_reader, writer, self.idle_s, _Mask(self.api_key))
                finally:
                    upload.cancel()
            finally:
                self._active -= 1
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.transport.abort()

    def _check(self, head: str) -> tuple[str | None, Any]:
        """``(None, (method, target, head to send))`` for a request to forward, else ``(status, why)``."""
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
            return "400 Bad Request", f"a malformed request line: {lines[0][:200]!r}"
        method, target, version = parts
        shown = f"{method[:20]} {target[:200]}"
        if not target.isascii() or not target.isprintable() or any(c in target for c in "%\\#"):
            return "400 Bad Request", f"{shown} (an escape, a backslash or a control character)"
        segments = target.split("?", 1)[0].split("/")[1:]
        if not target.startswith("/") or any(s in ("", ".", "..") for s in segments):
            return "400 Bad Request", f"{shown} (a dot or empty segment)"
        route = RELAY_ROUTES.fullmatch(target)
        if route is None:
            return "403 Forbidden", shown
        base = "/v1/models" if route["path"].startswith("/v1/models") else route["path"]
        if method != RELAY_METHODS[base]:
            return "405 Method Not Allowed", shown
        keep, lengths, chunked = [], 0, False
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not _TOKEN.fullmatch(name) or _CONTROL.search(value):
                return "400 Bad Request", f"{shown} (a malformed header line)"
            lower = name.lower()
            lengths += lower == "content-length"
            chunked |= lower == "transfer-encoding"
            if lower not in _DROPPED:
                keep.append(f"{name}:{value}")
        if lengths > 1 or (lengths and chunked):
            return "400 Bad Request", f"{shown} (an ambiguous body length)"
        host = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        keep += [f"Host: {host}", "Connection: close", "Accept-Encoding: identity"]
        if self.api_key:
            keep.append(f"x-api-key: {self.api_key}")
        out = "\r\n".join([f"{method} {self.prefix}{target} {version}", *keep, "", ""])
        return None, (method, target, out.encode("latin-1"))

    def close(self) -> None:
        if not self._closed:
            self._closed = True

            def stop() -> None:
                self._server.close()
                self._loop.stop()

            try:
                self._loop.call_soon_threadsafe(stop)
            except RuntimeError:  # the loop is gone already
                pass
            self._thread.join(10)
        self._sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _answer(status: str, text: str, retry: bool = False) -> bytes:
    body = text.encode("utf-8", "replace")
    extra = "retry-after: 1\r\n" if retry else ""
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n{extra}"
    return (head + "connection: close\r\n\r\n").encode() + body


class _Mask:
    """Replaces a secret in a byte stream by as many ``*`` (the stream's framing keeps its lengths),
    holding back only a tail that could be the secret's beginning."""

    def __init__(self, secret: str | None):
        self.secret = (secret or "").encode("latin-1", "replace")
        self.tail = b""

    def feed(self, data: bytes) -> bytes:
        if not self.secret:
            return data
        buf = (self.tail + data).replace(self.secret, b"*" * len(self.secret))
        keep = next(
            (k for k in range(min(len(self.secret) - 1, len(buf)), 0, -1) if buf.endswith(self.secret[:k])), 0
        )
        self.tail = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]


async def _pipe(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, idle_s: float | None, mask: _Mask | None = None
) -> None:
    """Copy until EOF (or ``idle_s`` seconds without a byte); then half-close ``dst``."""
    try:
        while data := await asyncio.wait_for(src.read(65536), idle_s):
            dst.write(mask.feed(data) if mask else data)
            await dst.drain()
        if mask is not None and mask.tail:
            dst.write(mask.tail)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except (OSError, asyncio.TimeoutError):
        pass
