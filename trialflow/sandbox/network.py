"""A task's network mode (Harbor's `network_mode` / `allowed_hosts` / `allow_internet`) and
the egress decision it implies (pure).

Modes, per phase (agent, verifier):
- ``no-network`` (the agent phase's default here, for training: Harbor's own default is
  ``public``): the sandbox's namespace has only loopback; it reaches its proxy session and
  nothing else.
- ``allowlist``: the same, plus an HTTP proxy served inside the sandbox
  (`trialflow.sandbox.egress`; HTTP_PROXY/HTTPS_PROXY point at it) that tunnels (CONNECT)
  or forwards (absolute-form GET) to the listed hosts only. Entries as Harbor's:
  hostnames, ``*.suffix`` wildcards, IP addresses, CIDR ranges; no ports (every port of an
  allowed host is allowed, so listing a loopback address exposes all of its ports).
  A listed *name* (or one under a ``*.`` entry) admits only what ``public`` would: every
  address it resolves to on the worker must be global and not one of the worker's own, so
  a name that resolves to loopback or a private range (``vm`` -> 127.0.0.1, a rebinding
  DNS answer) reaches nothing. Only an address the task lists itself (IP or CIDR entry)
  admits a non-global address.
- ``public`` (the verifier phase's default, as Harbor's; for the agent an explicit opt-in),
  logged and recorded in the trial result. The same proxy, to
  any host whose every address is globally routable: loopback, private, link-local and
  other special ranges stay unreachable, so the worker's services (proxy management,
  Temporal, S3, vLLM) are never exposed. Clients that ignore HTTP(S)_PROXY get no network.

Which mode a phase runs under (`network_policy`), as Harbor 0.25 resolves it
(`harbor.trial.network_policy.resolve_trial_network_plan`), with the run's say on top:
- the phase's own override (`[agent]` / `[verifier]` `network_mode`, a step's first), else
- the environment's baseline when the task states one (`network_mode`, or the legacy
  `allow_internet`: true is ``public``, false ``no-network``); the verifier's baseline is the
  agent's environment in shared mode (not the agent phase's override) and the separate
  verifier environment's in separate mode, else
- where the task states no baseline, the run's default for the phase (`PhaseNetwork.default`):
  ``no-network`` for the agent (for training: Harbor's default is ``public``) and ``public``
  for the verifier (Harbor's default: verifiers commonly install their test tools as they
  run, `uvx pytest`, `curl ... | sh`, and would score 0 offline on every trial).
- `PhaseNetwork.forced` (the run's, e.g. ``no-network`` on a cluster without egress, or to
  never give the agent network whatever a task asks) replaces all of that;
- `PhaseNetwork.extra_hosts` (Harbor's run-specific `--allow-agent-host` /
  `--allow-verifier-host`) are then merged into the phase's allowlist, as Harbor merges them:
  a ``no-network`` phase becomes an allowlist of them, a ``public`` one stays public.
The settings `agent_network` / `agent_network_default` / `agent_allowed_hosts` (and the
verifier's) and `trialflow run --agent-network ... --allow-agent-host ...` set them; the trial
result records each phase's mode and where it came from (`TrialResult.network_modes`).
`trialflow.task_config` parses and validates the keys as Harbor does; this module decides
and enforces.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from trialflow.tasks import Task

NetworkMode = Literal["no-network", "allowlist", "public"]
MODES: tuple[NetworkMode, ...] = ("no-network", "allowlist", "public")
Phase = Literal["agent", "verifier"]
PHASES: tuple[Phase, ...] = ("agent", "verifier")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class NetworkPolicyError(ValueError):
    """A task's network keys are malformed (names the key)."""


def _entry(raw: str) -> str:
    host = raw.strip().lower().rstrip(".")
    if not host or "://" in host or "@" in host or (host.count(":") == 1 and "/" not in host):
        raise NetworkPolicyError(
            f"allowed_hosts entry {raw!r}: a hostname, IP or CIDR, without scheme or port"
        )
    if "/" in host:
        try:
            return str(ipaddress.ip_network(host, strict=True))
        except ValueError as exc:
            raise NetworkPolicyError(f"allowed_hosts entry {raw!r}: {exc}") from None
    if "*" in host and not (host.startswith("*.") and "*" not in host[2:] and len(host) > 2):
        raise NetworkPolicyError(f"allowed_hosts entry {raw!r}: wildcards only as a leading '*.'")
    return host


@dataclass(frozen=True)
class NetworkPolicy:
    mode: NetworkMode = "no-network"
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise NetworkPolicyError(f"network_mode {self.mode!r}: one of {', '.join(MODES)}")
        if self.allowed_hosts and self.mode != "allowlist":
            raise NetworkPolicyError("allowed_hosts is only valid with network_mode = 'allowlist'")
        object.__setattr__(self, "allowed_hosts", tuple(_entry(h) for h in self.allowed_hosts))

    @property
    def egress(self) -> bool:
        """True when the sandbox gets the egress proxy."""
        return self.mode != "no-network"

    def allows(
        self, host: str, addresses: Sequence[Address], own: Callable[[Address], bool] = lambda a: False
    ) -> bool:
        """May a connection to `host` (as the client named it), resolved to `addresses`,
        go out? Every address must pass, so a name cannot smuggle in a second address.
        `own(address)`: whether the address is one of the worker's own (the egress proxy
        asks the host); such an address is refused unless the task lists it."""
        if self.mode == "no-network" or not addresses:
            return False
        if self.mode == "public":
            return all(reachable(a) and not own(a) for a in addresses)
        name = host.strip().lower().rstrip(".").strip("[]")
        named = self._name_allowed(name)
        return all(self._address_allowed(a) or (named and reachable(a) and not own(a)) for a in addresses)

    def _name_allowed(self, name: str) -> bool:
        for entry in self.allowed_hosts:
            if entry.startswith("*.") and name.endswith(entry[1:]):
                return True
            if entry == name:
                return True
        return False

    def _address_allowed(self, address: Address) -> bool:
        for entry in self.allowed_hosts:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue  # a hostname entry
        return False


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def reachable(address: Address) -> bool:
    """Globally routable, also for an IPv4 address carried inside IPv6 (mapped, or NAT64's
    well-known prefix): `::ffff:127.0.0.1` and `64:ff9b::a00:1` are not."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or (
            ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in _NAT64 else None
        )
        if inner is not None and not inner.is_global:
            return False
    return address.is_global


NetworkOrigin = Literal["task", "default", "run"]


@dataclass(frozen=True)
class PhaseNetwork:
    """The run's say in one phase's network (module docstring): `default` where the task
    states no baseline, `forced` whatever it states (None: the task decides), `extra_hosts`
    merged into the phase's allowlist as Harbor merges a run's `--allow-agent-host` /
    `--allow-verifier-host` (a ``no-network`` phase becomes an allowlist of them; a ``public``
    one is left as it is)."""

    default: NetworkMode
    forced: NetworkMode | None = None
    extra_hosts: tuple[str, ...] = ()


AGENT_DEFAULT = PhaseNetwork("no-network")
VERIFIER_DEFAULT = PhaseNetwork("public")


def network_policy(task: Task, phase: Phase, run: PhaseNetwork | None = None) -> NetworkPolicy:
    """The policy of `phase` for `task` under the run's `run` (None: `AGENT_DEFAULT` /
    `VERIFIER_DEFAULT`); module docstring."""
    return resolve_network(task, phase, run)[0]


def resolve_network(
    task: Task, phase: Phase, run: PhaseNetwork | None = None
) -> tuple[NetworkPolicy, NetworkOrigin]:
    """`network_policy` and where it came from: "task" (the task states it), "default" (the
    task states nothing: the run's default for the phase), "run" (the run forced it, or its
    extra hosts widened it).
    Raises NetworkPolicyError for a malformed key (naming its section) even when forced: a
    broken task is refused either way."""
    run = run or (AGENT_DEFAULT if phase == "agent" else VERIFIER_DEFAULT)
    config = task.config
    override = config.agent if phase == "agent" else config.verifier
    # A separate verifier's baseline is its own environment's (Harbor's network plan).
    separate = task.separate_verifier if phase == "verifier" else None
    env = separate.config if separate is not None else config.environment
    stated: NetworkPolicy | None = None
    if override.network_mode is not None:
        src: Any = override
    elif "network_mode" in env.model_fields_set:
        src = env
    else:
        src = None
    if src is not None:
        try:
            stated = NetworkPolicy(str(src.network_mode), tuple(src.allowed_hosts or ()))  # type: ignore[arg-type]
        except NetworkPolicyError as exc:
            where = phase if src is override else "verifier.environment" if separate else "environment"
            raise NetworkPolicyError(f"[{where}] {exc}") from None
    if run.forced is not None:
        policy, origin = NetworkPolicy(run.forced), "run"
    elif stated is not None:
        policy, origin = stated, "task"
    else:
        policy, origin = NetworkPolicy(run.default), "default"
    if run.extra_hosts and policy.mode != "public":  # Harbor's merge_extra_allowlists
        hosts = tuple(dict.fromkeys((*policy.allowed_hosts, *run.extra_hosts)))
        return NetworkPolicy("allowlist", hosts), "run"
    return policy, origin  # type: ignore[return-value]
