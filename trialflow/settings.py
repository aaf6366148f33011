"""The one configuration object, read once at the edge (CLI / worker_main) and passed down.

Sources, strongest first: explicit keyword arguments (CLI flags, via `load_settings`),
environment variables with prefix ``TRIALFLOW_`` (lists as JSON, e.g.
``TRIALFLOW_REPLICA_URLS='["http://127.0.0.1:8000"]'``), then the defaults below.

Edge cases: `s3_endpoint` None selects the local directory store at `store_dir`;
`replica_urls` empty means "no model": scaffolds that need the proxy fail their trial with
an infra error, the oracle/nop scaffolds still run. `worker_id` None: the host name for a
standalone worker (stable across restarts: its host queue and registration stay the same; two
workers on one host need ids of their own), the process id for `run`'s in-process worker.
`metrics_port` 0 disables the metrics endpoint. `harmony_vocab_dir` (gpt-oss's harmony
parser vocabulary, `o200k_base.tiktoken`): ``TRIALFLOW_HARMONY_VOCAB_DIR``, else harmony's own
``TIKTOKEN_ENCODINGS_BASE``, else `DEFAULT_HARMONY_VOCAB_DIR` (where infra/setup.sh writes it);
the proxy's entry points hand it to harmony (`proxy.parsers.use_vocabulary`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trialflow.viewer._urls import DEFAULT_TEMPORAL_UI_URL, DEFAULT_VIEWER_URL

if TYPE_CHECKING:
    from trialflow.admission import Policy as AdmissionPolicy
    from trialflow.sandbox.image_refs import ImagePolicy
    from trialflow.sandbox.policy import SandboxPolicy
    from trialflow.sandbox.transfer import TransferLimits
    from workflows.shared import RunNetwork

# Where `python -m infra.tiktoken_vocab` (run by infra/setup.sh) writes o200k_base.tiktoken.
DEFAULT_HARMONY_VOCAB_DIR = Path(__file__).resolve().parents[1] / ".cache" / "tiktoken"


class TrialflowSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRIALFLOW_", extra="ignore")

    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    # The shared queue (workflows + set-up). Separate deployments (or tests) sharing one
    # Temporal namespace use separate queues.
    task_queue: str = "trialflow-shared"

    s3_endpoint: str | None = None
    s3_bucket: str = "trialflow"
    s3_prefix: str = ""
    # None: boto3's credential chain (AWS_* variables, ~/.aws). The embedded SeaweedFS has one
    # S3 identity; `trialflow up` prints its keys (TRIALFLOW_S3_ACCESS_KEY / _SECRET_KEY) and
    # keeps them in .trialflow/seaweedfs/s3-credentials.json.
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    store_dir: Path = Path(".trialflow/store")

    replica_urls: list[str] = Field(default_factory=list)
    model_dir: Path | None = None
    model_name: str = "tiny"
    # Field overrides of the model profile the proxy detects from the template (proxy.profiles),
    # e.g. TRIALFLOW_MODEL_PROFILE='{"stop_tokens": ["<|im_end|>"]}'.
    model_profile: dict[str, Any] = Field(default_factory=dict)
    # The harmony vocabulary directory (module docstring for its sources, strongest first).
    harmony_vocab_dir: Path = Field(
        default=DEFAULT_HARMONY_VOCAB_DIR,
        validation_alias=AliasChoices(
            "harmony_vocab_dir", "TRIALFLOW_HARMONY_VOCAB_DIR", "TIKTOKEN_ENCODINGS_BASE"
        ),
    )

    # How long the proxy holds a turn while no replica can serve it before the turn fails (and
    # the attempt is retried as infrastructure): proxy.pool. Keep it below the clients' read
    # timeout (600 s for the official SDKs and Claude Code); 0: fail at once.
    replica_outage_hold_s: float = Field(default=300.0, ge=0)

    proxy_host: str = "127.0.0.1"
    proxy_port: int = 0  # 0: any free port (the worker's in-process proxy)

    # Sandbox backends (trialflow.sandbox.registry, docs/design.md "Sandbox backends"): the one
    # this worker runs ("docker", or a name of extra_sandbox_backends), chosen by the workers,
    # not by the clients that submit; plugins as name -> "module:Class" of a SandboxBackend.
    sandbox_backend: str = "docker"
    extra_sandbox_backends: dict[str, str] = Field(default_factory=dict)
    # Scaffolds beyond the built-in registry: name -> "module:Class" (plugins, test doubles).
    extra_scaffolds: dict[str, str] = Field(default_factory=dict)
    # `trialflow run`'s scaffold when --scaffold is not given: a registered name or an import
    # path "my_pkg.my_mod:MyScaffold"; options for its constructor (--scaffold-option wins).
    scaffold: str = "oracle"
    scaffold_options: dict[str, Any] = Field(default_factory=dict)

    # Sandbox hardening (trialflow.sandbox.policy.SandboxPolicy). pids limit None: unlimited.
    sandbox_pids_limit: int | None = Field(default=1024, ge=16)
    sandbox_read_only_root: bool = False
    # False: the engine's default seccomp profile (allows ptrace: gdb/strace tasks).
    sandbox_seccomp_profile: bool = True
    # Container runtime per backend, e.g. "runsc" (gVisor); None: the engine's default.
    sandbox_runtime: str | None = None

    # Budgets on files copied out of a sandbox (trialflow.sandbox.transfer.TransferLimits):
    # a trial's artifacts together per verification, and each log copy (/logs/verifier, an
    # agent's stdout/stderr file). Bytes count by apparent size (a sparse file's full
    # length); entries are files, directories and links. Over budget: OutputBudgetExceeded,
    # recorded in the trial's result, never retried.
    transfer_artifact_bytes: int = Field(default=256 << 20, gt=0)
    transfer_artifact_files: int = Field(default=10_000, gt=0)
    transfer_log_bytes: int = Field(default=32 << 20, gt=0)
    transfer_log_files: int = Field(default=1_000, gt=0)

    # Listeners served into a sandbox (docs/design.md, "Listener limits"): connections each
    # of a sandbox's listeners (egress proxy, proxy session) holds at most, further bounded
    # by the worker's fair share of its file descriptors (trialflow.cli._worker.connection_cap);
    # a tunnel idle this long is closed; a session's requests in flight and their body bytes.
    sandbox_max_connections: int = Field(default=64, gt=0)
    egress_idle_timeout_s: float = Field(default=120.0, gt=0)
    session_max_requests: int = Field(default=8, gt=0)
    session_max_queued_bytes: int = Field(default=32 << 20, gt=0)

    # The trajectory viewer (`trialflow view`, trialflow.viewer): the address it serves on,
    # which the Temporal UI's trial details link to (trialflow.viewer.trial_url), and the
    # Temporal UI's address its trial pages link back to.
    viewer_url: str = DEFAULT_VIEWER_URL
    temporal_ui_url: str = DEFAULT_TEMPORAL_UI_URL

    # Each phase's network (trialflow.sandbox.network): the mode where a task states no network
    # baseline (agent: no-network, for training, where Harbor's is public; verifier: public, as
    # Harbor's), and a mode forced whatever the task states (None: the task's). `run` flags
    # --agent-network(-default) / --verifier-network(-default) override them per run.
    agent_network: Literal["no-network", "public"] | None = None
    agent_network_default: Literal["no-network", "public"] = "no-network"
    verifier_network: Literal["no-network", "public"] | None = None
    verifier_network_default: Literal["no-network", "public"] = "public"
    # Hosts merged into a phase's allowlist (Harbor's --allow-agent-host / --allow-verifier-host:
    # a no-network phase becomes an allowlist of them, a public one stays public); Harbor's
    # entry rules (hostnames, *.suffix, IPs, CIDRs).
    agent_allowed_hosts: list[str] = Field(default_factory=list)
    verifier_allowed_hosts: list[str] = Field(default_factory=list)

    @field_validator("agent_allowed_hosts", "verifier_allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        from trialflow.task_config import normalize_allowed_hosts

        return normalize_allowed_hosts(hosts)

    # Images tasks name (trialflow.sandbox.image_refs, docs/harbor.md "Images"). False: what
    # is not present locally is pulled with the engine's credentials (~/.docker/config.json).
    # True (TRIALFLOW_IMAGES_OFFLINE=1; the demo and the tests): never pulled; trialflow's
    # local stand-ins, under names of their own (trialflow-standin/...), where it has one.
    images_offline: bool = False
    # Harbor's --environment-build-timeout-multiplier: scales each task's build_timeout_sec,
    # which bounds its pulls, stand-ins and build together.
    images_build_timeout_multiplier: float = Field(default=1.0, gt=0)

    # The ceiling of this worker's trials: live sandboxes (set-ups running + sandboxes not torn
    # down) and trials in their model phase (trialflow.admission, docs/admission.md).
    max_concurrent_trials: int = Field(default=4, gt=0)

    # Admission (trialflow.admission, docs/admission.md). "fixed": both limits are
    # max_concurrent_trials; "adaptive": the controller moves them in [admission_floor, that
    # ceiling] every admission_interval_s from live signals, starting at admission_start.
    # Marks are (soft, hard): grow below every soft mark, trim over one, cut over a hard one.
    admission: Literal["fixed", "adaptive"] = "fixed"
    admission_interval_s: float = Field(default=5.0, gt=0)
    admission_floor: int = Field(default=1, gt=0)
    admission_start: int = Field(default=4, gt=0)
    admission_kv_usage: tuple[float, float] = (0.80, 0.95)  # KV-cache use, 0..1 (soft: the target)
    admission_waiting_per_replica: tuple[float, float] = (4.0, 16.0)
    admission_start_slowdown: tuple[float, float] = (3.0, 6.0)  # sandbox start / its best median
    admission_start_failures: tuple[float, float] = (0.05, 0.25)
    admission_cpu_pressure: tuple[float, float] = (95.0, 99.0)  # PSI cpu some avg10, %: stops growth only
    admission_memory_pressure: tuple[float, float] = (10.0, 40.0)  # PSI memory some avg10, %
    admission_engine_latency_s: tuple[float, float] = (1.0, 5.0)  # Docker ping
    metrics_port: int = 0
    worker_id: str | None = None
    drain_grace_s: float = Field(default=60.0, ge=0)
    # Sandboxes older than this are reaped at worker start and periodically (leaks from
    # dead workers). Must exceed the longest trial.
    reap_after_s: float = Field(default=6 * 3600, gt=0)

    # Compose environments (environment/docker-compose.yaml, trialflow.sandbox.pod): how long
    # a task's services may take, all together, to start and pass their healthchecks before
    # set-up fails with ServiceStartTimeout (retried). Harbor's `up --wait` has no bound.
    compose_start_timeout_s: float = Field(default=600.0, gt=0)

    # ---- a fleet of worker hosts (docs/deploy.md) ----------------------------------------
    # The lease a worker host renews in the store (hosts/{worker_id}.json) to keep its
    # sandboxes (trialflow.fencing): one that could not renew for this long removes them all
    # and re-registers before it takes another. Keep it above the trials' heartbeat timeout.
    host_lease_s: float = Field(default=60.0, gt=0)
    # The address other hosts (a trainer announcing weight syncs) use to reach this worker's
    # management listener; None: `proxy_host`. The listener itself binds `proxy_host`.
    advertise_host: str | None = None
    # The local directory store works on one machine only: `trialflow worker` and worker_main
    # refuse to start on it unless this is set (the in-process worker of `run`/`demo` needs not).
    allow_local_store: bool = False
    # Temporal over TLS (temporalio's TLSConfig): `temporal_tls` on with the system roots, or
    # a CA file; a client certificate and key for mTLS; `temporal_api_key` (Temporal Cloud API
    # keys; implies TLS unless `temporal_tls` is explicitly false).
    temporal_tls: bool | None = None
    temporal_tls_ca: Path | None = None
    temporal_tls_cert: Path | None = None
    temporal_tls_key: Path | None = None
    temporal_tls_server_name: str | None = None
    temporal_api_key: str | None = None
    # S3 over HTTPS: a CA bundle to verify the endpoint with (None: the system's / boto3's).
    s3_ca_bundle: Path | None = None

    def admission_policy(self) -> AdmissionPolicy | None:
        """The controller's policy; None in the fixed mode."""
        if self.admission == "fixed":
            return None
        from trialflow.admission import Mark, Policy

        ceiling = self.max_concurrent_trials
        return Policy(
            ceiling=ceiling,
            floor=min(self.admission_floor, ceiling),
            start=self.admission_start,
            kv_usage=Mark(*self.admission_kv_usage),
            waiting_per_replica=Mark(*self.admission_waiting_per_replica),
            start_slowdown=Mark(*self.admission_start_slowdown),
            start_failures=Mark(*self.admission_start_failures),
            cpu_pressure=Mark(*self.admission_cpu_pressure),
            memory_pressure=Mark(*self.admission_memory_pressure),
            engine_latency_s=Mark(*self.admission_engine_latency_s),
        )

    def sandbox_policy(self) -> SandboxPolicy:
        from trialflow.sandbox.policy import SandboxPolicy  # the docker SDK only where sandboxes run

        return SandboxPolicy(
            pids_limit=self.sandbox_pids_limit,
            read_only_root=self.sandbox_read_only_root,
            seccomp_profile=self.sandbox_seccomp_profile,
            runtime=self.sandbox_runtime,
        )

    def run_network(self) -> RunNetwork:
        from workflows.shared import RunNetwork

        return RunNetwork(
            agent=self.agent_network,
            agent_default=self.agent_network_default,
            verifier=self.verifier_network,
            verifier_default=self.verifier_network_default,
            agent_hosts=tuple(self.agent_allowed_hosts),
            verifier_hosts=tuple(self.verifier_allowed_hosts),
        )

    def image_policy(self) -> ImagePolicy:
        from trialflow.sandbox.image_refs import ImagePolicy

        return ImagePolicy(
            offline=self.images_offline, build_timeout_multiplier=self.images_build_timeout_multiplier
        )

    def transfer_limits(self) -> TransferLimits:
        from trialflow.sandbox.transfer import TransferLimits

        return TransferLimits(
            artifact_bytes=self.transfer_artifact_bytes,
            artifact_files=self.transfer_artifact_files,
            log_bytes=self.transfer_log_bytes,
            log_files=self.transfer_log_files,
        )


def load_settings(**overrides: Any) -> TrialflowSettings:
    """Settings from the environment, with every non-None override applied on top."""
    return TrialflowSettings(**{k: v for k, v in overrides.items() if v is not None})
