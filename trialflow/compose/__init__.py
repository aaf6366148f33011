"""Harbor tasks' compose environments (environment/docker-compose.yaml), pure: parsed with
Compose's rules (`values`), checked against what a sandbox can honour and typed (`load`,
`spec`). `trialflow.sandbox.pod` runs the result; docs/harbor.md, "Compose environments"."""

from trialflow.compose.load import (
    COMPOSE_FILE,
    ComposeInvalid,
    ComposeRefused,
    interpolation_env,
    load_compose,
)
from trialflow.compose.spec import (
    MAIN,
    BindMount,
    ComposeProject,
    ComposeService,
    Condition,
    Dependency,
    ServiceBuild,
    ServiceHealthcheck,
)

__all__ = [
    "COMPOSE_FILE",
    "MAIN",
    "BindMount",
    "ComposeInvalid",
    "ComposeProject",
    "ComposeRefused",
    "ComposeService",
    "Condition",
    "Dependency",
    "ServiceBuild",
    "ServiceHealthcheck",
    "interpolation_env",
    "load_compose",
]
