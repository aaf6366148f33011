"""Reading a Dockerfile before building: the images it brings in, what the engine's classic
builder refuses (each rule below was seen refused by Docker 20.10's /build), and the
rewrite that puts offline stand-ins in place of public names without touching other bytes."""

from __future__ import annotations

import pytest

from trialflow.sandbox.dockerfile import ImageUse, parse, rewrite

MULTI = """# syntax=docker/dockerfile:1
ARG BASE=python:3.12-slim
FROM ${BASE} AS build
COPY --from=ghcr.io/astral-sh/uv:latest /uv /bin/
RUN uv --version
from --platform=linux/amd64 ubuntu:24.04
COPY --from=build \\
   /app /app
COPY --from=0 /x /y
FROM build
FROM scratch
"""


def test_images_from_lines_and_copy_from_with_arg_defaults_stages_left_out():
    facts = parse(MULTI)
    assert facts.images == (
        ImageUse("python:3.12-slim", 3, "FROM"),
        ImageUse("ghcr.io/astral-sh/uv:latest", 4, "COPY --from"),
        ImageUse("ubuntu:24.04", 6, "FROM"),
    )
    assert facts.problems == ()
    assert facts.refs == ["python:3.12-slim", "ghcr.io/astral-sh/uv:latest", "ubuntu:24.04"]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("RUN --mount=type=cache,target=/root/.cache pip install x", "RUN --mount needs BuildKit"),
        ("RUN --network=none true", "RUN --network needs BuildKit"),
        ("COPY --chmod=755 a /a", "COPY --chmod needs BuildKit"),
        ("COPY --link a /a", "COPY --link needs BuildKit"),
        ("ADD --checksum=sha256:00 https://x/y /y", "ADD --checksum needs BuildKit"),
        ("COPY --chown=1:1 --frobnicate a /a", "COPY has no flag --frobnicate"),
        ("FOO bar", "unknown instruction FOO"),
        ("HEALTHCHECK --start-interval=1s CMD true", "HEALTHCHECK --start-interval needs BuildKit"),
    ],
)
def test_what_the_classic_builder_refuses_is_named_by_line(line, says):
    [problem] = parse(f"FROM trialflow-base:bookworm\n{line}\n").problems
    assert problem.startswith("line 2: ") and says in problem, problem


def test_a_heredoc_is_one_problem_and_its_body_is_not_read_as_instructions():
    text = "FROM trialflow-base:bookworm\nRUN <<EOF\necho hi\nEOF\nCOPY <<-'X' /etc/y\n\tz\n\tX\nRUN true\n"
    problems = parse(text).problems
    assert problems == (
        "line 2: RUN with a heredoc (<<) needs BuildKit, which the engine's builder is not",
        "line 5: COPY with a heredoc (<<) needs BuildKit, which the engine's builder is not",
    )


def test_what_the_classic_builder_accepts_is_not_a_problem():
    text = (
        "# escape=`\nFROM trialflow-base:bookworm\nCOPY --chown=1:1 a /a\nRUN echo $((1<<2)) && `\n"
        "  # a comment inside the continued RUN\n  cat <<< hi\nHEALTHCHECK --interval=5s CMD true\n"
        'ONBUILD RUN true\nSHELL ["/bin/bash", "-c"]\nSTOPSIGNAL SIGTERM\n'
    )
    assert parse(text).problems == ()


def test_an_arg_without_default_in_from_is_a_problem():
    facts = parse("ARG BASE\nFROM $BASE\nARG TAG=3\nFROM python:${TAG:-x}\n")
    assert facts.problems == ("line 2: FROM $BASE: ARG BASE has no value (no default, no build argument)",)
    # ARG after the first FROM belongs to a stage: not seen by FROM lines; the default word is
    assert facts.refs == ["python:x"]
    # a compose service's build arguments give the ARGs declared before the first FROM
    given = parse("ARG BASE=python:3.12\nFROM $BASE\n", {"BASE": "ubuntu:24.04", "OTHER": "x"})
    assert given.problems == () and given.refs == ["ubuntu:24.04"]
    renamed = rewrite("ARG BASE\nFROM $BASE\n", {"ubuntu:24.04": "s/u:1"}, {"BASE": "ubuntu:24.04"})
    assert renamed == "ARG BASE\nFROM s/u:1\n"


def test_rewrite_renames_only_the_image_tokens():
    names = {
        "python:3.12-slim": "trialflow-standin/python:3.12-slim",
        "ghcr.io/astral-sh/uv:latest": "somewhere/uv:1",
        "ubuntu:24.04": "trialflow-standin/ubuntu:24.04",
    }
    out = rewrite(MULTI, names)
    assert out == (
        MULTI.replace("FROM ${BASE} AS", "FROM trialflow-standin/python:3.12-slim AS")
        .replace("--from=ghcr.io/astral-sh/uv:latest", "--from=somewhere/uv:1")
        .replace("linux/amd64 ubuntu:24.04", "linux/amd64 trialflow-standin/ubuntu:24.04")
    )
    assert parse(out).refs == list(names.values())
    assert rewrite(MULTI, {}) == MULTI


def test_rewrite_keeps_a_reference_that_only_starts_like_another():
    text = "FROM ubuntu:24.04-custom\nFROM ubuntu:24.04\n"
    assert rewrite(text, {"ubuntu:24.04": "s/u:1"}) == "FROM ubuntu:24.04-custom\nFROM s/u:1\n"
