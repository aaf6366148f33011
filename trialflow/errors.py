"""The pipeline's error tree. Every failure has a type and a retry rule.

::

    TrialflowError                      base; `retryable` says whether Temporal may retry
    ├── TaskError                       the task directory itself is unusable      (never retried)
    │   ├── TaskInvalid                 bad/missing file or field; names `file` and `field`
    │   ├── UnsupportedEnvironment      an environment trialflow cannot run: docker-compose.yml (Harbor reads
    │   │                               .yaml only), a compose verifier environment (refused at load)
    │   ├── UnsupportedFeature          task.toml or environment/docker-compose.yaml asks for what trialflow
    │   │                               does not do; lists each one
    │   ├── TaskEnvMissing              [environment].env `${VAR}` with VAR unset on the host, no default
    │   └── DockerfileUnsupported       the Dockerfile uses what the engine's builder refuses (BuildKit
    │                                   flags, heredocs, unknown instructions); every one, by line
    ├── SandboxError
    │   ├── ImageBuildFailed            the Dockerfile does not build; carries the log tail (never retried)
    │   │   └── ImageBuildTimeout       the image's pulls, stand-ins and build ran past the task's
    │   │                               build_timeout_sec (x images_build_timeout_multiplier) (retried)
    │   ├── ImageUnavailable            an image the task names (FROM, COPY --from, docker_image) cannot
    │   │                               be had: the registry refuses it, or offline without a stand-in
    │   │                               (never retried)
    │   ├── ImagePullFailed             a pull failed on the way (no route, DNS, a reset stream) (retried)
    │   ├── BaseImageUnavailable        a local base image (FROM trialflow-base) could not be made (retried)
    │   ├── SandboxStartFailed          container could not be created/started        (retried)
    │   ├── GpusUnavailable             the task asks for more GPUs than this host has  (never retried)
    │   ├── EntrypointExited            the image's ENTRYPOINT ended the container at start (never retried)
    │   ├── HealthcheckFailed           [environment.healthcheck] failed by Harbor's rules (never retried)
    │   ├── ServiceFailed               a compose service could not start, exited, or lacks the healthcheck
    │   │   │                           a `service_healthy` dependency needs          (never retried)
    │   │   ├── ServiceUnhealthy        its healthcheck failed `retries` times: the last probe's output
    │   │   └── ServiceStartTimeout     not ready within `compose_start_timeout_s`    (retried: slow host)
    │   ├── StepSetupFailed             a step's workdir/setup.sh or [steps.healthcheck] failed: an outcome
    │   │                               of that step (returned as data; the sequence stops there)
    │   ├── SandboxLost                 container or engine vanished mid-trial         (retried)
    │   ├── HostFenced                  this host was declared lost and has not re-registered yet:
    │                                   it takes no new sandbox until it has (retried: elsewhere)
    │   ├── SandboxRestartFailed        the verification restart failed on files the agent left: the
    │                                   agent's outcome (reward 0), never retried
    │   ├── ToolchainUnavailable        the host lacks the harness's static busybox   (never retried)
    │   ├── UnknownSandboxBackend       also a KeyError; no backend of that name, or its "module:Class"
    │                                   does not load; lists the names               (never retried)
    │   ├── SandboxPathNotFound         download() of a path that does not exist      (never retried)
    │   └── OutputBudgetExceeded        files copied out of a sandbox over their budget (bytes by the
    │                                   tar headers' apparent sizes, or entries): an outcome of the
    │                                   trial, recorded in its result                   (never retried)
    ├── VerifierError                   classification of a VerifierResult, not raised by the verifier
    │   ├── VerifierTimeout             test.sh ran past [verifier].timeout_sec        (never retried)
    │   └── RewardMissing               no reward.json / reward.txt, or unparseable    (never retried)
    ├── ScaffoldError
    │   ├── UnknownScaffold             also a KeyError; lists the registered names   (never retried)
    │   └── ScaffoldSetupFailed         the scaffold could not be prepared in the sandbox (retried)
    ├── ModelError                      the model behind the proxy, as a trial sees it
    │   ├── ModelNotConfigured          a scaffold needs a model; this worker has no proxy (never retried)
    │   ├── InvalidSampling             the proxy refused the trial's session settings (never retried)
    │   └── ReplicaUnavailable          the agent failed while no replica of its pool answered (retried:
    │                                   a new attempt); not the proxy's per-call ReplicaUnreachable
    └── StorageError                    the result store failed (network, 5xx)          (retried)
        ├── ObjectNotFound              key/URI does not exist                          (never retried)
        ├── ObjectExists                a write-once key already holds other bytes      (never retried)
        └── AttemptFenced               a write of an attempt the workflow declared lost (its trial's
                                        fence record, trialflow.fencing)                (never retried)

Exit codes of commands, agents and test scripts are data (`ExecResult`, `ScaffoldResult`,
`VerifierResult`), never exceptions. Verifier outcomes are data too:
`VerifierResult.error()` returns a `VerifierError` instance to classify the outcome
without raising it, so a failure is never reported through two channels.

Temporal integration (activities): `activities._support.typed_errors` converts with
`ApplicationError(str(e), type=type(e).__name__, non_retryable=not e.retryable)`, so the
workflow sees the class name as the error type and the retry rule as `non_retryable`.
"""

from __future__ import annotations


class _PlainMessage:
    """For KeyError subclasses: KeyError's __str__ would repr() the message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # type: ignore[attr-defined]


class TrialflowError(Exception):
    """Base of every pipeline error. `retryable` is the retry rule for the whole subtree
    unless a subclass overrides it."""

    retryable: bool = False


class TaskError(TrialflowError):
    """The task directory is unusable; retrying cannot help."""

    retryable = False


class TaskInvalid(TaskError):
    """A task file or field is missing or invalid.

    `file` is relative to the task dir (e.g. "task.toml", "tests/test.sh"); `field` is a
    dotted path inside that file (e.g. "verifier.timeout_sec") or None for the whole file.
    `more`: further (field, message) problems of the same file (every field pydantic refused,
    not only the first); `lines()` gives one line per problem.
    """

    def __init__(
        self,
        task_dir: str,
        file: str,
        field: str | None,
        message: str,
        more: tuple[tuple[str | None, str], ...] = (),
    ) -> None:
        self.task_dir = task_dir
        self.file = file
        self.field = field
        self.message = message
        self.more = tuple(more)
        super().__init__(f"invalid task {task_dir}: " + "; ".join(self._parts()))

    def _parts(self) -> list[str]:
        found = ((self.field, self.message), *self.more)
        return [f"{self.file}:{f}: {m}" if f else f"{self.file}: {m}" for f, m in found]

    def lines(self) -> list[str]:
        """One line per problem: "invalid task DIR: FILE:FIELD: MESSAGE"."""
        return [f"invalid task {self.task_dir}: {part}" for part in self._parts()]


class UnsupportedEnvironment(TaskError):
    """The task asks for an environment kind this pipeline cannot run."""


class UnsupportedFeature(TaskError):
    """task.toml uses features trialflow refuses (docs/harbor.md); `features` holds one
    sentence per feature, each naming its field."""

    def __init__(self, task_dir: str, features: list[str]) -> None:
        self.task_dir = task_dir
        self.features = list(features)
        super().__init__(f"unsupported task {task_dir}: " + "; ".join(self.features))


class TaskEnvMissing(TaskError):
    """An env value `${VAR}` names a host variable that is unset and has no `:-default`."""


class DockerfileUnsupported(TaskError):
    """The task's Dockerfile uses what the engine's builder refuses (`trialflow.sandbox.dockerfile`);
    `problems` holds one line per use, each naming its line."""

    def __init__(self, label: str, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"{label}: Dockerfile: " + "; ".join(self.problems))


class SandboxError(TrialflowError):
    """Failures of the sandbox layer (image, container, engine)."""


class ImageBuildFailed(SandboxError):
    """The task's Dockerfile failed to build. `log_tail` holds the last build output lines."""

    retryable = False

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        super().__init__(f"{message}\n--- build log tail ---\n{log_tail}" if log_tail else message)


class ImageBuildTimeout(ImageBuildFailed):
    """The build ran past its timeout. Retryable: a loaded host is the usual cause."""

    retryable = True


class ImageUnavailable(SandboxError):
    """An image the task names is not present and cannot be had: its registry refuses it (not
    there, no access), or the worker is offline and trialflow has no stand-in for it."""

    retryable = False


class ImagePullFailed(SandboxError):
    """Pulling an image failed on the way (registry unreachable, stream cut): worth a retry."""

    retryable = True


class BaseImageUnavailable(SandboxError):
    """A local base image a Dockerfile needs could not be made (debootstrap, mirror down)."""

    retryable = True


class UnknownSandboxBackend(_PlainMessage, SandboxError, KeyError):
    """No sandbox backend under that name, or its "module:Class" cannot be loaded or is not a
    `SandboxBackend` (trialflow.sandbox.registry); the message lists the names available."""

    retryable = False


class SandboxStartFailed(SandboxError):
    """The container could not be created or started (engine hiccup, resource limits)."""

    retryable = True


class GpusUnavailable(SandboxError):
    """The task's `gpus` exceed what this worker's host has (`trialflow.sandbox.gpus`)."""

    retryable = False


class EntrypointExited(SandboxError):
    """The image's ENTRYPOINT exited at start, taking the container with it (the task's fault)."""

    retryable = False


class HealthcheckFailed(SandboxError):
    """[environment.healthcheck] failed `retries` consecutive times after its start period."""

    retryable = False


class ServiceFailed(SandboxError):
    """A compose service (trialflow.sandbox.pod) could not be started, exited while it was
    needed, or is waited on as `service_healthy` without a healthcheck: the task's fault."""

    retryable = False


class ServiceUnhealthy(ServiceFailed):
    """A compose service's healthcheck reported it unhealthy (the engine's rules: `retries`
    failures in a row after its start period); the message carries the last probe's output."""


class ServiceStartTimeout(ServiceFailed):
    """The compose services were not ready within the backend's `compose_start_timeout_s`
    (a slow host or a dependency that never completes)."""

    retryable = True


class StepSetupFailed(SandboxError):
    """A multi-step task's step could not be prepared: its workdir/setup.sh exited non-zero
    or its [steps.healthcheck] failed. Harbor records it on the step and stops the sequence;
    so does trialflow (`PrepareStepOutput.error`), it is never raised to Temporal."""

    retryable = False


class SandboxLost(SandboxError):
    """The container (or the engine) disappeared while the trial still needed it."""

    retryable = True


class HostFenced(SandboxError):
    """This worker host was declared lost by a trial (or its lease lapsed) and has not yet
    removed its fenced sandboxes and re-registered (trialflow.fencing.HostLease)."""

    retryable = True


class SandboxRestartFailed(SandboxError):
    """The engine answered but could not start the sandbox again for verification (e.g. the
    agent replaced a mount point's parent, or the passwd entry of the image's USER): what the
    agent left decided it, so the trial is verified as failed (reward 0), not retried."""

    retryable = False


class ToolchainUnavailable(SandboxError):
    """The host has no static busybox to mount into sandboxes as the harness's toolchain
    (`trialflow.sandbox.toolchain`); a configuration error of the worker's machine."""

    retryable = False


class SandboxPathNotFound(SandboxError, FileNotFoundError):
    """A path asked for by `download()` does not exist in the sandbox."""

    retryable = False


class OutputBudgetExceeded(SandboxError):
    """What a sandbox gave back (artifacts, logs) is over its budget
    (`trialflow.sandbox.transfer.TransferLimits`); the copy stopped before the member that
    crossed it. Retrying would copy the same files again."""

    retryable = False

    def __init__(self, what: str, limit: str, member: str) -> None:
        super().__init__(f"{what}: over the budget of {limit} at {member!r}")
        self.what, self.limit, self.member = what, limit, member


class VerifierError(TrialflowError):
    """Classifies a failed verification; see `VerifierResult.error()`."""

    retryable = False


class VerifierTimeout(VerifierError):
    """tests/test.sh ran past [verifier].timeout_sec."""


class RewardMissing(VerifierError):
    """The verifier wrote no reward file, or one that does not parse."""


class ScaffoldError(TrialflowError):
    """Failures of the agent scaffold layer (not the agent's own exit code)."""


class UnknownScaffold(_PlainMessage, ScaffoldError, KeyError):
    """No scaffold registered under that name; the message lists the names available."""

    retryable = False


class ScaffoldSetupFailed(ScaffoldError):
    """The scaffold could not be installed or configured inside the sandbox."""

    retryable = True


class ModelError(TrialflowError):
    """The model a scaffold needs is not there (configuration) or not answering."""


class ModelNotConfigured(ModelError):
    """A scaffold that needs a model ran on a worker without a proxy (no model dir or
    replicas configured)."""

    retryable = False


class InvalidSampling(ModelError):
    """The proxy refused the trial's session settings (e.g. a replica URL it cannot use;
    sampling fields are checked earlier, when the spec is made)."""

    retryable = False


class ReplicaUnavailable(ModelError):
    """The agent failed while no replica of its session's pool answered a health probe: the
    model was down, not the agent wrong. A new attempt may find it back.

    One attempt's outcome, seen by the workflow. Its name is persisted (the ApplicationError
    type in Temporal histories, `TrialError.type` in stored results), so it stays. A single
    generation call that got no answer is the proxy's `proxy.errors.ReplicaUnreachable`."""

    retryable = True


class StorageError(TrialflowError):
    """The result store failed (connection, server error)."""

    retryable = True


class ObjectNotFound(_PlainMessage, StorageError, KeyError):
    """The key or URI does not exist in the store."""

    retryable = False


class ObjectExists(StorageError):
    """A write-once key (`ResultStore.put_once`) already holds different bytes."""

    retryable = False


class AttemptFenced(StorageError):
    """A write under an attempt the workflow has declared lost: the trial's fence record
    (trialflow.fencing) names an epoch above the attempt's number. Nothing was kept."""

    retryable = False
