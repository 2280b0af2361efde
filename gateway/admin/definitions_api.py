"""Definitions import/export in RabbitMQ 3.10's JSON format (meta/definitions.py):
``GET/POST /api/definitions`` and ``GET/POST /api/definitions/{vhost}``, administrators only.

An import is parsed and checked whole first (meta/definitions_plan.py) and refused with a
400 naming every problem by its place in the file, before anything changes; then it is
applied through the running node (vhosts, users, permissions, policies, then exchanges,
queues and bindings through each VirtualHost, so routing follows at once). One import runs
at a time; it runs to the end even if the client goes away. ``?progress=1`` streams
newline-delimited JSON ({"progress": ...} about once a second, then {"summary": ...} or
{"error": ..., "reason": ...}); otherwise the answer is the summary (RabbitMQ: 204).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.admin.auth import ADMINISTRATOR, requires
from gateway.admin.paths import SlashRoute
from gateway.amqp.errors import AMQPError
from gateway.features.delayed_exchange import EXCHANGE_TYPES
from meta.definitions import DefinitionsError, ImportPlan, parse_definitions, summary_text
from meta.definitions_export import export_definitions
from meta.definitions_plan import plan_import
from meta.errors import MetaError
from meta.models import User

if TYPE_CHECKING:
    from gateway.node import Node

log = logging.getLogger("mqgw.definitions")

T = TypeVar("T")
CONCURRENCY = 512  # declarations in flight: their metadata writes share group commits
PROGRESS_INTERVAL_S = 1.0


class ApplyError(Exception):
    """A change failed after the checks passed (a client raced the import, a full disk)."""


class ImportRun:
    """Applies a checked plan to the node; counts what is done for progress reports."""

    def __init__(self, node: Node, plan: ImportPlan, interval_s: float = PROGRESS_INTERVAL_S):
        self.node = node
        self.plan = plan
        self.total = plan.changes
        self.done = 0
        self.kind = ""
        self.interval_s = interval_s
        self.started = time.monotonic()
        self._logged_at = self.started

    def progress(self) -> dict[str, Any]:
        seconds = round(time.monotonic() - self.started, 3)
        return {"done": self.done, "total": self.total, "kind": self.kind, "seconds": seconds}

    def _tick(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self._logged_at >= self.interval_s:
            self._logged_at = now
            log.info(
                "definitions import: %d/%d changes applied (%s), %.1f s",
                self.done, self.total, self.kind, now - self.started,
            )  # fmt: skip

    async def _each(
        self,
        kind: str,
        items: Iterable[T],
        call: Callable[[T], Awaitable[object]],
        width: int = 1,
    ) -> None:
        """``call`` on every item, ``width`` at a time; the first failure stops the rest."""
        self.kind = kind
        pending = iter(items)
        failures: list[str] = []

        async def worker() -> None:
            for item in pending:
                if failures:
                    return
                try:
                    await call(item)
                except Exception as error:  # an AMQP error, a full disk, a vhost gone meanwhile
                    text = error.reply_text if isinstance(error, AMQPError) else repr(error)
                    failures.append(f"{kind}: {text}")
                    return
                self._tick()

        async with anyio.create_task_group() as group:
            for _ in range(width):
                group.start_soon(worker)
        if failures:
            raise ApplyError(
                f"import stopped after {self.done} of {self.total} changes: {failures[0]}"
            )

    async def apply(self) -> dict[str, Any]:
        node, plan = self.node, self.plan
        log.info("definitions import: applying %d changes", self.total)
        await self._each("vhosts", plan.vhosts, node.add_vhost)
        await self._each("users", plan.users, node.access.put_user, CONCURRENCY)
        await self._each("permissions", plan.permissions, node.access.set_permission, CONCURRENCY)
        await self._each("policies", plan.policies, node.meta.put_policy, CONCURRENCY)
        for name in sorted({p.vhost for p in plan.policies}):
            await node.vhosts[name].apply_policies()
        await self._each("vhost_limits", plan.vhost_limits, node.meta.set_vhost_limits)
        await node.load_vhost_limits()  # before the queues: max-queues applies to them
        await self._each(
            "exchanges",
            plan.exchanges,
            lambda x: node.vhosts[x.vhost].declare_exchange(x, passive=False),
            CONCURRENCY,
        )
        await self._each(
            "queues",
            plan.queues,  # their partitions chosen by the plan, as queue.declare chooses them
            lambda q: node.vhosts[q.vhost].declare_queue(q, passive=False, connection_id=""),
            CONCURRENCY,
        )
        await self._each(
            "bindings",
            plan.bindings,
            lambda b: node.vhosts[b.vhost].bind(
                b, "", *((50, 20) if b.destination_type == "queue" else (40, 30))
            ),
            CONCURRENCY,
        )
        self.kind = ""
        summary = {**plan.summary(), "seconds": round(time.monotonic() - self.started, 3)}
        log.info("definitions import done: %s", summary_text(summary))
        return summary


class _Imports:
    """The node's definitions imports: one at a time, each in a task of its own that is kept
    until it ends, and answered as a summary or as a stream of progress lines."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.one_at_a_time = asyncio.Lock()  # the admin API runs on asyncio only
        self.jobs: set[asyncio.Task[dict[str, Any]]] = set()

    async def start_import(
        self, body: bytes, vhost: str | None
    ) -> tuple[ImportRun, asyncio.Task[Any]]:
        """Check the document, then apply it in a task of its own (a client that goes away
        does not cut an import in half). 400 if the document is refused."""
        node = self.node
        checked: asyncio.Future[ImportRun] = asyncio.get_running_loop().create_future()

        async def job() -> dict[str, Any]:
            async with self.one_at_a_time:
                try:
                    document = parse_definitions(body)
                    plan = await plan_import(
                        document,
                        node.meta,
                        vhost=vhost,
                        exchange_types=EXCHANGE_TYPES,
                        default_partitions=node.settings.queue_partitions,
                    )
                except Exception as error:
                    checked.set_exception(error)
                    return {}
                run = ImportRun(node, plan)
                checked.set_result(run)
                return await run.apply()

        task = asyncio.get_running_loop().create_task(job())
        self.jobs.add(task)
        task.add_done_callback(self._finished)
        try:
            run = await checked
        except DefinitionsError as error:
            log.warning("definitions import refused: %s", error.reason)
            raise HTTPException(400, error.reason) from None
        except MetaError as error:  # e.g. the vhost went away meanwhile
            raise HTTPException(400, error.detail) from None
        return run, task

    def _finished(self, task: asyncio.Task[dict[str, Any]]) -> None:
        self.jobs.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("definitions import failed: %s", error, exc_info=error)

    async def import_response(
        self, request: Request, vhost: str | None, progress: bool
    ) -> Response:
        body = await request.body()
        run, task = await self.start_import(body, vhost)
        if progress:
            return StreamingResponse(_progress_lines(run, task), media_type="application/x-ndjson")
        try:
            summary = await asyncio.shield(task)
        except ApplyError as error:
            raise HTTPException(500, str(error)) from None
        return JSONResponse(summary)


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    administrator = Depends(requires(ADMINISTRATOR, node))
    imports = _Imports(node)
    _all_vhosts_routes(router, node, imports, administrator)
    _one_vhost_routes(router, node, imports, administrator)
    return router


def _all_vhosts_routes(
    router: APIRouter, node: Node, imports: _Imports, administrator: Any
) -> None:
    @router.get("/api/definitions", summary="Export every definition (RabbitMQ 3.10 format)")
    async def export_all(download: str | None = None, _user: User = administrator) -> Response:
        return _document(await export_definitions(node.meta), download)

    @router.post("/api/definitions", summary="Import definitions: all or nothing")
    async def import_all(
        request: Request, progress: bool = False, _user: User = administrator
    ) -> Response:
        return await imports.import_response(request, None, progress)


def _one_vhost_routes(router: APIRouter, node: Node, imports: _Imports, administrator: Any) -> None:
    @router.get("/api/definitions/{vhost}", summary="Export one vhost's definitions")
    async def export_vhost(
        vhost: str, download: str | None = None, _user: User = administrator
    ) -> Response:
        if vhost not in node.vhosts:
            raise HTTPException(400, "vhost_not_found")  # RabbitMQ's answer here
        return _document(await export_definitions(node.meta, vhost), download)

    @router.post("/api/definitions/{vhost}", summary="Import definitions into one vhost")
    async def import_vhost(
        vhost: str, request: Request, progress: bool = False, _user: User = administrator
    ) -> Response:
        if vhost not in node.vhosts:
            raise HTTPException(404, "vhost_not_found")
        return await imports.import_response(request, vhost, progress)


def _document(document: dict[str, Any], download: str | None) -> Response:
    headers = {}
    if download:  # the management UI's "download" link
        name = re.sub(r"[^\w.-]", "_", download)
        headers["content-disposition"] = f'attachment; filename="{name}"'
    return JSONResponse(document, headers=headers)


async def _progress_lines(run: ImportRun, task: asyncio.Task[Any]) -> AsyncIterator[bytes]:
    def line(item: dict[str, Any]) -> bytes:
        return json.dumps(item).encode() + b"\n"

    yield line({"progress": run.progress()})
    while not task.done():
        await asyncio.wait({task}, timeout=run.interval_s)
        if not task.done():
            yield line({"progress": run.progress()})
    error = task.exception()
    if isinstance(error, ApplyError):
        yield line({"error": "internal_error", "reason": str(error)})
    elif error is not None:
        yield line({"error": "internal_error", "reason": repr(error)})
    else:
        yield line({"summary": task.result()})
