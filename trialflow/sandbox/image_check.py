"""The image checks `trialflow run` makes before submitting: what set-up would refuse
(blocking; the same rules as `DockerImages`, which applies them when it builds).

Per task image (the agent's, a separate verifier's, each step's): the Dockerfile's lines
the engine's builder refuses (`trialflow.sandbox.dockerfile`); then, with an engine to ask,
each image it names (FROM, COPY --from, or `docker_image`) as `image_refs.resolve` decides:
absent offline without a stand-in is a problem; absent online, its registry is asked
(`docker_pull.registry_problem`: not there, refused, or unreachable). Each distinct image
is judged once per checker, however many tasks name it. Without an engine (an external
worker's engine is its own) only the Dockerfiles are read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trialflow.sandbox import dockerfile
from trialflow.sandbox.base_image import public_image
from trialflow.sandbox.docker_images import DEFAULT_BASE_IMAGES, present_id
from trialflow.sandbox.docker_pull import registry_problem
from trialflow.sandbox.image_refs import ImagePolicy, Source, normalize, resolve

if TYPE_CHECKING:
    import docker

    from trialflow.tasks import Task, TaskImage


class ImageChecker:
    """`engine_problem`: why there is no engine to ask although one was wanted (a problem of
    the run itself: the in-process worker builds and runs on it)."""

    def __init__(
        self, client: docker.DockerClient | None, policy: ImagePolicy, engine_problem: str | None = None
    ) -> None:
        self.engine_problem = engine_problem
        self._client = client
        self._policy = policy
        self._verdicts: dict[str, str | None] = {}  # normalized ref -> problem (None: fine)

    def problems(self, task: Task) -> list[str]:
        """One line per problem of the task's images, each naming its file and line."""
        out: list[str] = []
        for image in (task.image, *task.verifier_images, *task.service_images):
            out.extend(self._image_problems(task.path, image))
        return list(dict.fromkeys(out))

    def _image_problems(self, root: Path, image: TaskImage) -> list[str]:
        if image.docker_image or image.dockerfile is None:
            uses = [(image.docker_image or image.tag, "docker_image")]
            out = []
        else:
            rel = image.dockerfile.relative_to(root).as_posix()
            facts = dockerfile.parse(image.dockerfile.read_text(errors="replace"), image.build_args)
            out = [f"{rel} {p}" for p in facts.problems]
            uses = [(u.ref, f"{rel} line {u.line}: {u.kind}") for u in facts.images]
        for ref, where in uses:
            if (problem := self.verdict(ref)) is not None:
                out.append(f"{where} {problem}")
        return out

    def verdict(self, ref: str) -> str | None:
        """Why set-up could not get `ref`, or None (also None without an engine to ask)."""
        if self._client is None:
            return None
        key = normalize(ref)
        if key not in self._verdicts:
            self._verdicts[key] = self._judge(self._client, ref)
        return self._verdicts[key]

    def _judge(self, client: docker.DockerClient, ref: str) -> str | None:
        res = resolve(
            ref,
            present=present_id(client, ref) is not None,
            has_standin=public_image(ref) is not None,
            policy=self._policy,
            made_here=ref in DEFAULT_BASE_IMAGES,
        )
        if res.source is Source.UNAVAILABLE:
            return res.reason
        if res.source is Source.PULL:
            return registry_problem(client, ref)
        return None
