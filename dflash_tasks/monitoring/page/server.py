"""The page's Tornado application: the routes, basic auth on every one, and logs without samples.

Handlers are synchronous (one watcher, a few requests a minute): each reads the store (and Redis)
through :class:`~.source.JobSource` while it runs. The access log names the handler, never the
path or query (a sample's id or a filter may be user data), and errors are logged without them.
"""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import tornado.web

from dflash_tasks.monitoring.page.auth import Credentials
from dflash_tasks.monitoring.page.pager import Cursor, SampleFilter, find_sample, random_sample, read_page
from dflash_tasks.monitoring.page.run_view import run_page
from dflash_tasks.monitoring.page.samples_view import list_page, sample_href, sample_page
from dflash_tasks.monitoring.page.source import JobSource
from dflash_tasks.monitoring.page.svg import throughput_svg

log = logging.getLogger("dflash_tasks.page")


class PageHandler(tornado.web.RequestHandler):
    """Every route: basic auth first; a 401 carries no body."""

    def initialize(self, source: JobSource, credentials: Credentials) -> None:
        self.source = source
        self.credentials = credentials

    def prepare(self) -> None:
        if not self.credentials.allows(self.request.headers.get("Authorization")):
            self.set_status(401)
            self.set_header("WWW-Authenticate", 'Basic realm="dflash job page"')
            self.finish()

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header(
            "Content-Security-Policy", "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'"
        )

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        log.error("%s failed: %s", type(self).__name__, typ.__name__ if typ else "error")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.finish(f"<h1>{status_code}</h1>")

    def html(self, text: str) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(text)


class RunHandler(PageHandler):
    def get(self) -> None:
        doc = self.source.progress()
        self.html(run_page(doc, self.source.repair_rounds()))


class ProgressJsonHandler(PageHandler):
    def get(self) -> None:
        doc = self.source.progress()
        body = {
            "progress": doc,
            "repair_rounds": self.source.repair_rounds(),
            "throughput": self.source.history.to_list(),
        }
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class ThroughputHandler(PageHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "image/svg+xml")
        self.finish(throughput_svg(self.source.history.tokens_per_s()))


def _int_arg(handler: PageHandler, name: str) -> int | None:
    raw = handler.get_argument(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise tornado.web.HTTPError(400, f"{name} must be a whole number") from None


class SamplesHandler(PageHandler):
    def get(self) -> None:
        try:
            wanted = SampleFilter(
                outcome=self.get_argument("outcome", ""),
                check=self.get_argument("check", ""),
                min_tokens=_int_arg(self, "min_tokens"),
                max_tokens=_int_arg(self, "max_tokens"),
                id_contains=self.get_argument("id", ""),
                source=self.get_argument("source", ""),
            )
            start = Cursor.parse(self.get_argument("from", "0.0"))
        except ValueError as exc:
            raise tornado.web.HTTPError(400, str(exc)) from None
        page = read_page(self.source.store, wanted, start)
        query = {
            k: self.get_argument(k)
            for k in ("outcome", "check", "min_tokens", "max_tokens", "id", "source")
            if self.get_argument(k, "")
        }
        self.html(list_page(page, wanted, query))


class RandomSampleHandler(PageHandler):
    def get(self) -> None:
        found = random_sample(self.source.store, random.Random())
        if found is None:
            raise tornado.web.HTTPError(404)
        self.redirect(sample_href(found))


class SampleHandler(PageHandler):
    def get(self, sample_id: str) -> None:  # Tornado has unquoted it
        hint = _int_arg(self, "chunk")
        found = find_sample(self.source.store, sample_id, hint)
        if found is None:
            self.set_status(404)
            self.html("<h1>no such sample</h1>")
            return
        self.html(sample_page(found, self.source.lens.see(found.record)))


def _log_request(handler: tornado.web.RequestHandler) -> None:
    """One line per request: method, handler and status; never the path or the query."""
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING
    log.log(
        level,
        "%s %s %d %.0fms",
        handler.request.method,
        type(handler).__name__,
        status,
        1000 * handler.request.request_time(),
    )


def make_app(source: JobSource, credentials: Credentials) -> tornado.web.Application:
    kw = {"source": source, "credentials": credentials}
    return tornado.web.Application(
        [
            (r"/", RunHandler, kw),
            (r"/api/progress", ProgressJsonHandler, kw),
            (r"/throughput\.svg", ThroughputHandler, kw),
            (r"/samples", SamplesHandler, kw),
            (r"/samples/random", RandomSampleHandler, kw),
            (r"/samples/([^/]+)", SampleHandler, kw),
        ],
        log_function=_log_request,
        compress_response=True,
    )
