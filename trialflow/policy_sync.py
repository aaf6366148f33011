"""Weight syncs reach every worker's proxy: a registry of proxies in the store, the
trainer-side broadcast of ``POST /policy_version``, and the version a late worker reads.

Each worker with a proxy writes ``proxies/{worker_id}.json`` (`storage.proxy_registry_key`)
when it starts and deletes it when it stops: its management listener's URL and bearer token
(`ProxyEndpoint`). The trainer, when its replicas serve new weights, calls
`broadcast_policy_version(store, version)`, which writes ``policy_version.json``
(`storage.POLICY_VERSION_KEY`), then lists the registry and POSTs ``{"version": N}`` to every
listed proxy; each proxy's open sessions then record N, so a turn running across the update
records both versions (`docs/verl.md`). The store is the meeting point because both sides
already have it, and nothing else lists the workers.

A worker that starts between two syncs: `join_weight_syncs` registers it FIRST and only then
reads ``policy_version.json``. Either its entry was written before the trainer listed the
registry (then the broadcast POSTs to it), or after; then the trainer's write of the version,
which precedes its listing, also precedes this worker's read (the store is read-after-write
consistent: S3, SeaweedFS and the local directory all are), and the read returns it. So every
worker learns every version by one route or the other. The read does not override a version
the proxy already holds: that came from a POST, which is at least as new as what the read saw
(the trainer's syncs run one after the other).

Edge cases: a listed proxy that does not answer (a worker killed without deleting its entry)
is reported in the result, logged and skipped; it never fails the broadcast, since the
trainer must not stall on a dead worker (its trials are lost and re-run elsewhere anyway).
An entry that is not a valid `ProxyEndpoint` is reported the same way, and so is a failed
write of ``policy_version.json`` (running workers still get the POST). An unreadable
``policy_version.json`` at a worker's start is logged and ignored (the next sync reaches it).
The management URL must be reachable from the trainer (``TRIALFLOW_PROXY_HOST``/
``_MANAGEMENT_PORT`` on a shared network in a real deployment); the token is as secret as
the store. A worker whose management listener is a unix socket is not registered (no trainer
reaches it) and learns the version only at its start.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from pydantic import BaseModel, ValidationError

from proxy.server import ProxyServer
from trialflow.errors import ObjectNotFound, StorageError
from trialflow.storage import POLICY_VERSION_KEY, PROXY_REGISTRY_PREFIX, ResultStore, proxy_registry_key

log = logging.getLogger(__name__)


class ProxyEndpoint(BaseModel):
    worker_id: str
    management_url: str
    token: str


class PublishedVersion(BaseModel):
    """``policy_version.json``: the version of the trainer's last weight sync."""

    version: int


def register_proxy(store: ResultStore, endpoint: ProxyEndpoint) -> str:
    """Write the worker's entry (blocking); returns its URI."""
    return store.put_bytes(
        proxy_registry_key(endpoint.worker_id), endpoint.model_dump_json().encode(), "application/json"
    )


def unregister_proxy(store: ResultStore, worker_id: str) -> None:
    """Remove the worker's entry (blocking; an entry already gone is fine)."""
    store.delete(proxy_registry_key(worker_id))


def publish_policy_version(store: ResultStore, version: int) -> str:
    """Write ``policy_version.json`` (blocking); returns its URI."""
    body = PublishedVersion(version=version).model_dump_json().encode()
    return store.put_bytes(POLICY_VERSION_KEY, body, "application/json")


def published_policy_version(store: ResultStore) -> int | None:
    """The last announced version; None when none was, or it cannot be read (logged). Blocking."""
    try:
        return PublishedVersion.model_validate_json(store.get_bytes(POLICY_VERSION_KEY)).version
    except ObjectNotFound:
        return None
    except (StorageError, ValidationError, ValueError) as exc:
        log.warning(
            "cannot read %s (%s: %s); waiting for the next weight sync",
            POLICY_VERSION_KEY,
            type(exc).__name__,
            exc,
        )
        return None


def advertised_management_url(proxy: ProxyServer, advertise_host: str | None) -> str:
    """The management URL other hosts use: the listener's port at `advertise_host` (the
    setting of that name), else the URL it is bound at."""
    if advertise_host is None:
        return proxy.management_url
    host = f"[{advertise_host}]" if ":" in advertise_host else advertise_host
    return f"http://{host}:{proxy.management_port}"


async def join_weight_syncs(
    store: ResultStore, proxy: ProxyServer, worker_id: str, advertise_host: str | None = None
) -> None:
    """A starting worker: register its proxy (TCP management only) at the address other hosts
    reach it at, THEN adopt the published version unless a POST already set one (the order
    closes the race: module docstring)."""
    if proxy.management_socket is None:  # trainers reach it over TCP for weight syncs
        endpoint = ProxyEndpoint(
            worker_id=worker_id,
            management_url=advertised_management_url(proxy, advertise_host),
            token=proxy.management_token,
        )
        await asyncio.to_thread(register_proxy, store, endpoint)
    version = await asyncio.to_thread(published_policy_version, store)
    if version is not None and proxy.defaults.policy_version is None:
        proxy.set_policy_version(version)
        log.info("policy version %d read from the store", version)


def registered_proxies(store: ResultStore) -> tuple[list[ProxyEndpoint], dict[str, str]]:
    """(valid entries, {key: why not} for unreadable ones). Blocking."""
    found, bad = [], {}
    for key in store.list_keys(PROXY_REGISTRY_PREFIX):
        try:
            found.append(ProxyEndpoint.model_validate_json(store.get_bytes(key)))
        except (StorageError, ValidationError, ValueError) as exc:
            bad[key] = f"{type(exc).__name__}: {exc}"
    return found, bad


async def broadcast_policy_version(
    store: ResultStore, version: int, *, timeout_s: float = 10.0
) -> dict[str, str]:
    """Publish ``version`` in the store, then POST ``{"version": version}`` to every
    registered proxy at once. Returns, per worker id (or store key for a broken entry or a
    failed publish), "ok: N sessions" or why it failed. Never raises for a proxy that fails
    (module docstring)."""
    published: dict[str, str] = {}
    try:  # before listing: a worker registering after the listing reads it (module docstring)
        await asyncio.to_thread(publish_policy_version, store, version)
    except StorageError as exc:
        published[POLICY_VERSION_KEY] = f"{type(exc).__name__}: {exc}"
    endpoints, outcome = await asyncio.to_thread(registered_proxies, store)
    outcome.update(published)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(ep: ProxyEndpoint) -> tuple[str, str]:
            try:
                async with http.post(
                    f"{ep.management_url.rstrip('/')}/policy_version",
                    json={"version": version},
                    headers={"Authorization": f"Bearer {ep.token}"},
                ) as resp:
                    body = await resp.json(content_type=None)
                    if resp.status != 200:
                        return ep.worker_id, f"HTTP {resp.status}: {body}"
                    return ep.worker_id, f"ok: {body.get('sessions')} sessions"
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                return ep.worker_id, f"{type(exc).__name__}: {exc}"

        outcome.update(dict(await asyncio.gather(*(one(ep) for ep in endpoints))))
    failed = {k: v for k, v in outcome.items() if not v.startswith("ok")}
    if failed:
        log.warning("policy version %d not delivered to %s", version, failed)
    return outcome
