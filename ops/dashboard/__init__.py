"""`ops dashboard`: every run in a bucket, and each run's timeline, curves and cost, in a browser.

``python -m ops dashboard (--stack NAME | --bucket-uri URI)`` serves two kinds of page on
127.0.0.1 and prints the URL:

- ``/``: the runs table (``ops runs``'s runs, with their metrics, moves, placements and cost),
  sortable by any column (``?sort=cost&order=desc``);
- ``/run/<id>``: the run's timeline, curves, cost over time and model.

Everything is read from the bucket with the user's own credentials, on each request (the
page refreshes itself while a run is not over and its folder changed lately: ``data.live``), so it works while the machines are
preempted or gone. A refresh fetches only what the listing shows changed, and of a growing
TensorBoard event file only its new tail; what is kept between refreshes is bounded in bytes
(``cache.Kept``). It reads and never writes. The server is the standard library's
``http.server``: two pages need no framework, and nothing more has to be installed or kept.
It listens on 127.0.0.1 only, as ``ops tensorboard`` and the tunnels do, and answers only
requests addressed to 127.0.0.1 or localhost (a web page elsewhere that points its own name
at 127.0.0.1 gets 403). Nor does it answer what another website makes the browser ask for: a page
elsewhere can point an image or a form at ``http://127.0.0.1:PORT/run/...``, and each answer would be
a read of the bucket with the user's credentials. Browsers say where a request comes from in
``Sec-Fetch-Site``; only ``same-origin`` (a link on the dashboard's own page), ``none`` (typed in,
a bookmark) or no such header (curl, a script) is served, anything else gets 403. A damaged line or a missing file is a note on the page; a page that
cannot be read at all says why, with status 503 for the bucket or 404 for an unknown run,
never a 500 (a run the page cannot draw says so, with 503, and the other pages still work).

``data.py`` reads (through ``ops.status`` / ``ops.runstate`` / ``runfolder.cost``);
``render.py`` writes the HTML and its SVG charts.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from ops.cli import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, OpsError, port_type, positive_float
from ops.dashboard.cache import Kept
from ops.runs import bucket_of, open_bucket  # noqa: F401 - bucket_of: what `ops.dashboard` has always given

HOST = "127.0.0.1"
DEFAULT_PORT = 6080
DEFAULT_REFRESH_S = 15.0
ALLOWED_HOSTS = frozenset({"127.0.0.1", "localhost"})
# What the dashboard keeps between refreshes, at most (a tab left open on a bucket of many runs):
# the objects it read (events.jsonl and the like) and the curves of the event files.
OBJECTS_MAX_BYTES = 256 << 20
CURVES_MAX_BYTES = 64 << 20
# What a browser's Sec-Fetch-Site may say for a request to be served: the dashboard's own links, an address
# typed in. Absent: a client that is not a browser (every browser that runs scripts sends it).
ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})


class Dashboard:
    """What the server serves: the bucket's store, read on every request."""

    def __init__(self, bucket_uri: str, store, *, refresh: float = DEFAULT_REFRESH_S) -> None:
        self.bucket = bucket_uri.rstrip("/")
        self.store = store
        self.refresh = refresh
        # The rows of runs that have ended, by run: read again only when their folder changes.
        self.rows: dict = {}
        # The objects read, by URI, with their size and time: fetched again only when the listing shows a change.
        self.objects = Kept(OBJECTS_MAX_BYTES, weigh=lambda kept: len(kept[1]))
        # The TensorBoard event files read, by URI: a refresh reads only what was added to each since.
        self.curves = Kept(CURVES_MAX_BYTES, weigh=lambda f: f.weight())

    def respond(self, path: str, now: float | None = None) -> tuple[int, str]:
        """The status and HTML for a request path (``/``, ``/?sort=cost``, ``/run/<id>``)."""
        from ops.dashboard import data, render

        now = time.time() if now is None else now
        parts = urlsplit(path)
        query = parse_qs(parts.query)
        route = parts.path.rstrip("/") or "/"
        run_id = ""
        if route != "/" and not route.startswith("/run/"):
            return 404, render.error_page("not found", f"nothing at {parts.path}: the runs are at /")
        try:
            if route == "/":
                rows, notes = data.table(self.store, now, self.rows, self.objects)
            else:
                run_id = unquote(route[len("/run/"):])
                page = data.run_page(self.store, run_id, now, self.objects, self.curves)
        except KeyError as e:
            if route == "/":
                return 503, render.error_page("cannot read the bucket", f"{self.bucket}: KeyError {e}",
                                              refresh=self.refresh)
            return 404, render.error_page("no such run", f"no run {run_id!r} in {self.bucket} (it may have been "
                                          "deleted); see the list of runs")
        except Exception as e:  # noqa: BLE001 - storage clients raise many types; the page says which, never a 500
            return 503, render.error_page("cannot read the bucket", f"{self.bucket} could not be read "
                                          f"({type(e).__name__}: {e}); check your credentials and network. "
                                          f"This page tries again in {self.refresh:g}s.", refresh=self.refresh)
        try:
            if route == "/":
                sort = (query.get("sort") or ["age"])[0]
                desc = (query.get("order") or ["asc"])[0] == "desc"
                return 200, render.runs_page(self.bucket, rows, notes, sort=sort, desc=desc, refresh=self.refresh)
            return 200, render.run_page(self.bucket, page, refresh=self.refresh)
        except Exception as e:  # noqa: BLE001 - something in the run the page cannot draw: say so, keep serving
            return 503, render.error_page("this page could not be drawn", f"{type(e).__name__}: {e} (the run's "
                                          "folder holds something the dashboard does not expect; ops status "
                                          "--run-uri shows it as text)", refresh=self.refresh)


def make_server(dashboard: Dashboard, port: int) -> ThreadingHTTPServer:
    """An HTTP server for ``dashboard`` on 127.0.0.1:``port`` (0: any free port), not started yet."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "trainstack-dashboard"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
            if host not in ALLOWED_HOSTS:
                self._send(403, f"ops dashboard answers only on {HOST}: open http://{HOST}:{self.server.server_port}/")
                return
            site = self.headers.get("Sec-Fetch-Site")
            if site is not None and site.strip().lower() not in ALLOWED_FETCH_SITES:
                self._send(403, f"ops dashboard answers only its own pages, not a request another website made "
                                f"(Sec-Fetch-Site: {site}): open http://{HOST}:{self.server.server_port}/ yourself")
                return
            code, body = dashboard.respond(self.path)
            self._send(code, body, "text/html; charset=utf-8")

        def do_POST(self) -> None:  # noqa: N802 - read-only: nothing is ever written
            self._send(405, "ops dashboard only reads: GET only")

        do_PUT = do_DELETE = do_POST  # noqa: N815

        def _send(self, code: int, body: str, kind: str = "text/plain; charset=utf-8") -> None:
            raw = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(raw)))
            self.send_header("Cache-Control", "no-store")
            # Nothing on the page is fetched from elsewhere; a page cannot be framed by another site.
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'")
            self.send_header("X-Frame-Options", "DENY")
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format, *args) -> None:  # noqa: A002 - http.server's signature
            pass  # the terminal shows the URL, not a line per request

    server = ThreadingHTTPServer((HOST, port), Handler)
    server.daemon_threads = True
    return server


def cmd_dashboard(args: argparse.Namespace) -> int:
    """``ops dashboard``: serve the bucket's runs on 127.0.0.1 until Ctrl-C."""
    from ops import hosts

    try:
        bucket, store = open_bucket(args.bucket_uri, args.stack)
    except (hosts.HostsError, OpsError, ValueError) as e:
        print(f"ops dashboard: {e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        # Pages name the bucket as it was given (`file://./runs`, not the folder it resolves to).
        server = make_server(Dashboard(args.bucket_uri or bucket, store, refresh=args.refresh), args.port)
    except OSError as e:
        print(f"ops dashboard: cannot listen on {HOST}:{args.port} ({e.strerror}); choose another port with --port",
              file=sys.stderr)
        return EXIT_ERROR
    url = f"http://{HOST}:{server.server_port}/"
    print(f"ops dashboard: {args.bucket_uri or bucket} at {url}  (read-only; Ctrl-C to stop)", flush=True)
    thread = threading.Thread(target=server.serve_forever, name="dashboard", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        server.shutdown()
        server.server_close()
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``dashboard`` command to ``python -m ops``."""
    p = sub.add_parser(
        "dashboard",
        help="every run of the bucket in a browser: timeline, curves, cost (127.0.0.1, read-only)",
        description=f"Serve a read-only dashboard of the bucket's runs on {HOST} and print its URL. "
                    "It reads the bucket on every page, so it works while the machines are gone.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="stack name: the bucket comes from its runUri output (pulumi CLI)")
    where.add_argument("--bucket-uri", help="the bucket: s3://BUCKET, gs://BUCKET or file:///...")
    p.add_argument("--port", type=port_type(any_free=True), default=DEFAULT_PORT,
                   help="local port on 127.0.0.1 (default: %(default)s; 0: any free port)")
    p.add_argument("--refresh", type=positive_float, default=DEFAULT_REFRESH_S,
                   help="seconds between a page's refreshes while a run is not over (default: %(default)s)")
    p.set_defaults(func=cmd_dashboard)
