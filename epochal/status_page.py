"""``epochal status APP --serve PORT``: the status as a web page that refreshes by itself.

One stdlib HTTP server; a thread reads the status topic each second (and the snapshots every few
seconds), and each request renders the latest report as plain HTML: the processes, the totals,
throughput and input lag over the last minutes as inline SVG charts (from the sequencer's
records, the topic's uncompacted tail filling in what came before the page started), and the
latest snapshots. The page reloads itself every :data:`REFRESH_S` seconds (a ``<meta>``
refresh: no script). ``/status.json`` answers the ``--json`` document.

It listens on 127.0.0.1 only, unless a token is given: then on every interface, and each
request must carry it (``?token=...``, which the page's reload keeps, or ``Authorization:
Bearer ...``).
"""

from __future__ import annotations

import hmac
import html
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from epochal.config import Listener
from epochal.errors import BindError, EpochalError
from epochal.schemas.status import AnyStatus, SequencerStatus
from epochal.status import SnapshotSummary, StatusReport, summarize
from epochal.status_view import ago, describe_range, headline, size, status_json

if TYPE_CHECKING:
    from epochal.log.status import StatusReader

__all__ = ["REFRESH_S", "StatusPage", "serve_status"]

logger = logging.getLogger(__name__)

REFRESH_S = 2
_HISTORY_MS = 10 * 60 * 1000  # what the charts show
_SNAPSHOTS_EVERY_S = 5.0
_SNAPSHOTS_SHOWN = 5


class StatusPage:
    """The latest report and the charts' history, kept up to date by :meth:`refresh`."""

    def __init__(
        self,
        reader: StatusReader,
        snapshots: Callable[[], list[SnapshotSummary]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reader = reader
        self.snapshots = snapshots
        self.clock = clock
        self.history: deque[tuple[int, float, int]] = deque()  # (time_ms, txns/s, lag)
        self.recent: list[SnapshotSummary] = []
        self.report: StatusReport | None = None
        self.error = ""  # why the last refresh failed (the broker away), shown on the page
        self._snapshots_at = 0.0

    def refresh(self) -> None:
        now = self.clock()
        try:
            self._note(self.reader.read(timeout_s=5.0))
            if now - self._snapshots_at >= _SNAPSHOTS_EVERY_S:
                self.recent, self._snapshots_at = self.snapshots(), now
        except EpochalError as exc:
            self.error = str(exc)
            return
        self.error = ""
        latest = self.recent[-1] if self.recent else None
        self.report = summarize(
            self.reader.names.app,
            self.reader.latest,
            self.reader.dead_letters,
            latest,
            int(now * 1000),
        )

    def _note(self, records: Sequence[AnyStatus]) -> None:
        for record in records:
            if isinstance(record, SequencerStatus):
                lag = sum(record.input_lag.values())
                self.history.append((record.time_ms, record.transactions_per_s, lag))
        horizon = int(self.clock() * 1000) - _HISTORY_MS
        while self.history and self.history[0][0] < horizon:
            self.history.popleft()

    def html(self, query: str = "") -> str:
        """The page; ``query`` (``?token=...``) is kept in its reload."""
        report = self.report
        title = html.escape(self.reader.names.app)
        body = [f"<p class=error>{html.escape(self.error)}</p>" if self.error else ""]
        if report is None:
            body.append("<p>reading the status topic…</p>")
        else:
            body.append(f"<h1 id=headline>{html.escape(headline(report).plain)}</h1>")
            body.append(_processes(report))
            body.append(_totals(report))
            now = report.time_ms
            points = list(self.history)
            body.append("<div class=charts>")
            body.append(_chart("transactions/s", [(t, v) for t, v, _ in points], now, "txns"))
            body.append(
                _chart("input lag (records)", [(t, float(q)) for t, _, q in points], now, "lag")
            )
            body.append("</div>")
            body.append(_snapshot_table(self.recent, now))
        refresh = f"{REFRESH_S}; url=/{query}" if query else str(REFRESH_S)
        return _PAGE.format(title=title, refresh=html.escape(refresh), body="\n".join(body))


def _processes(report: StatusReport) -> str:
    rows: list[tuple[object, ...]] = []
    now = report.time_ms
    if report.supervisor is not None:
        s = report.supervisor
        rows.append(
            ("supervisor", s.pid, s.host, s.generation, "", "", "", "", ago(now - s.time_ms))
        )
    if report.sequencer is not None:
        q = report.sequencer
        rows.append(
            (
                "sequencer",
                q.pid,
                q.host,
                q.generation,
                "",
                q.epoch,
                f"{q.epochs_per_s:,.1f}",
                f"{q.transactions_per_s:,.0f}",
                ago(now - q.time_ms),
            )
        )
    for w in report.workers:
        ranges = "<br>".join(
            html.escape(
                f"{p.partition}: "
                + ", ".join(describe_range(r) for r in p.ranges)
                + f" ({p.actors:,})"
            )
            for p in w.partitions
        )
        rows.append(
            (
                f"worker {w.worker}",
                w.pid,
                w.host,
                w.generation,
                ranges,
                w.epoch,
                f"{w.epochs_per_s:,.1f}",
                f"{w.transactions_per_s:,.0f}",
                ago(now - w.time_ms),
            )
        )
    head = "".join(
        f"<th>{c}</th>"
        for c in (
            "process",
            "pid",
            "host",
            "generation",
            "partitions: keys (actors)",
            "epoch",
            "epochs/s",
            "txns/s",
            "seen",
        )
    )
    cells = [
        f"<tr data-process='{html.escape(str(row[0]))}'>"
        + "".join(f"<td>{c if i == 4 else html.escape(str(c))}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    ]
    return f"<table id=processes><tr>{head}</tr>{''.join(cells)}</table>"


def _totals(report: StatusReport) -> str:
    items = [
        ("epoch", f"{report.epoch:,} (every worker has executed {report.executed_epoch:,})"),
        ("epochs/s", f"{report.epochs_per_s:,.1f}"),
        (
            "transactions/s",
            f"{report.transactions_per_s:,.0f} sequenced, {report.executed_per_s:,.0f} executed",
        ),
        ("input lag", f"{sum(report.input_lag.values()):,} records"),
        ("dead letters", f"{report.dead_letters:,}"),
        ("rollbacks", f"{report.rollbacks}"),
    ]
    rows = "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    lag = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{v:,}</td></tr>"
        for k, v in sorted(report.input_lag.items())
    )
    return f"<table id=totals>{rows}</table><table id=lag>{lag}</table>"


def _chart(title: str, points: list[tuple[int, float]], now_ms: int, name: str) -> str:
    """An SVG line of ``(time_ms, value)`` over the last minutes, its maximum on the axis."""
    width, height = 420, 120
    top = max((v for _, v in points), default=0.0) or 1.0
    start = now_ms - _HISTORY_MS
    coords = " ".join(
        f"{(t - start) / _HISTORY_MS * width:.1f},{height - v / top * (height - 10):.1f}"
        for t, v in points
        if t >= start
    )
    minutes = _HISTORY_MS // 60_000
    return (
        f"<figure id=chart-{name}><figcaption>{html.escape(title)}, last {minutes} min "
        f"(max {top:,.0f})</figcaption><svg width={width} height={height} "
        f"viewBox='0 0 {width} {height}'><rect width={width} height={height} fill='#f6f8fa'/>"
        f"<polyline fill=none stroke='#0969da' stroke-width=1.5 points='{coords}'/></svg></figure>"
    )


def _snapshot_table(recent: list[SnapshotSummary], now_ms: int) -> str:
    rows = "".join(
        f"<tr><td>{s.ssid}</td><td>{ago(now_ms - s.time_ms)}</td><td>{size(s.bytes)}</td>"
        f"<td>{html.escape(', '.join(f'{k} {v:,}' for k, v in sorted(s.actors.items())))}</td>"
        "</tr>"
        for s in reversed(recent)
    )
    head = "<tr><th>ssid</th><th>age</th><th>size</th><th>actors</th></tr>"
    return f"<h2>latest snapshots</h2><table id=snapshots>{head}{rows}</table>"


_PAGE = """<!doctype html>
<html><head><meta charset=utf-8><meta http-equiv=refresh content="{refresh}">
<title>{title}: epochal status</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5em; color: #1f2328 }}
table {{ border-collapse: collapse; margin: 0.8em 0 }}
td, th {{ border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top }}
h1 {{ font-size: 1.2em }} .error {{ color: #cf222e }}
.charts {{ display: flex; gap: 2em }} figure {{ margin: 0 }}
</style></head>
<body>
{body}
</body></html>
"""


def serve_status(page: StatusPage, port: int, token: str = "") -> ThreadingHTTPServer:
    """Serve ``page`` on ``port`` (127.0.0.1, or every interface with a ``token``) and refresh
    it each second, both on daemon threads; the server, to ``shutdown()``."""
    host = "0.0.0.0" if token else "127.0.0.1"
    handler = _handler(page, token)
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        raise BindError.of(exc, f"{host}:{port}", Listener.STATUS, "the status page") from exc
    server.daemon_threads = True
    page.refresh()
    threading.Thread(target=_refreshing, args=(page, server), daemon=True).start()
    threading.Thread(target=server.serve_forever, name="status-page", daemon=True).start()
    return server


def _refreshing(page: StatusPage, server: ThreadingHTTPServer) -> None:
    while server.socket.fileno() != -1:
        time.sleep(1.0)
        page.refresh()


def _handler(page: StatusPage, token: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if token and not self._authorized(url.query):
                self._answer(403, "text/plain", "a token is needed: ?token=...")
                return
            if url.path == "/status.json" and page.report is not None:
                self._answer(200, "application/json", status_json(page.report))
            elif url.path == "/":
                self._answer(200, "text/html; charset=utf-8", page.html(_query(url.query)))
            else:
                self._answer(404, "text/plain", "not found")

        def _authorized(self, query: str) -> bool:
            given = parse_qs(query).get("token", [""])[0]
            header = self.headers.get("Authorization", "")
            given = given or header.removeprefix("Bearer ").strip()
            return hmac.compare_digest(given.encode(), token.encode())

        def _answer(self, code: int, kind: str, text: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug("status page: " + format, *args)

    return Handler


def _query(query: str) -> str:
    """The token part of a query string, to keep in the page's reload."""
    token = parse_qs(query).get("token", [""])[0]
    return f"?token={token}" if token else ""
