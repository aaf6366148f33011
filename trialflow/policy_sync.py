"""Weight syncs reach every worker's proxy: a registry of proxies in the store, and the
trainer-side broadcast of ``POST /policy_version``.

Each worker with a proxy writes ``proxies/{worker_id}.json`` (`storage.proxy_registry_key`)
when it starts and deletes it when it stops: its management listener's URL and bearer token
(`ProxyEndpoint`). The trainer, after its replicas load new weights, calls
`broadcast_policy_version(store, version)`, which POSTs ``{"version": N}`` to every listed
proxy; each proxy's open sessions then record N, so a turn running across the update records
both versions (`docs/verl.md`). The store is the meeting point because both sides already
have it, and nothing else lists the workers.

Edge cases: a listed proxy that does not answer (a worker killed without deleting its entry)
is reported in the result, logged and skipped; it never fails the broadcast, since the
trainer must not stall on a dead worker (its trials are lost and re-run elsewhere anyway).
An entry that is not a valid `ProxyEndpoint` is reported the same way. The management URL
must be reachable from the trainer (``TRIALFLOW_PROXY_HOST``/``_MANAGEMENT_PORT`` on a
shared network in a real deployment); the token is as secret as the store.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from pydantic import BaseModel, ValidationError

from trialflow.errors import StorageError
from trialflow.storage import PROXY_REGISTRY_PREFIX, ResultStore, proxy_registry_key

log = logging.getLogger(__name__)


class ProxyEndpoint(BaseModel):
    worker_id: str
    management_url: str
    token: str


def register_proxy(store: ResultStore, endpoint: ProxyEndpoint) -> str:
    """Write the worker's entry (blocking); returns its URI."""
    return store.put_bytes(
        proxy_registry_key(endpoint.worker_id), endpoint.model_dump_json().encode(), "application/json"
    )


def unregister_proxy(store: ResultStore, worker_id: str) -> None:
    """Remove the worker's entry (blocking; an entry already gone is fine)."""
    store.delete(proxy_registry_key(worker_id))


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
    """POST ``{"version": version}`` to every registered proxy at once. Returns, per worker
    id (or registry key for a broken entry), "ok: N sessions" or why it failed. Never raises
    for a proxy that fails (module docstring)."""
    endpoints, outcome = await asyncio.to_thread(registered_proxies, store)
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
