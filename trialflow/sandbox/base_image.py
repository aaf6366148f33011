"""Local base images, made without pulling anything (no registry is reachable here).

Layers, each built once and cached (all idempotent; `ensure_*` returns at once when the
image exists with the current recipe, recorded in its `trialflow.recipe` label):

1. rootfs: `debootstrap --variant=minbase --include=<PACKAGES> SUITE`, packed as a tarball
   cached at `.cache/base-image/{suite}-rootfs-{digest}.tar` (repository root; the digest
   follows the package list), `docker import`ed as `trialflow-rootfs:{suite}`. A fresh Docker
   engine re-imports in seconds instead of re-running debootstrap.
2. `trialflow-base:{bookworm,trixie}` (`ensure_base_image(client, suite=...)`): the rootfs
   plus the host's CA bundle (`HOST_CA_BUNDLE`, the bundle through which the host reaches
   the package registries, an intercepting proxy's CA included) installed as a local CA
   (`update-ca-certificates`) and named by PIP_CERT / REQUESTS_CA_BUNDLE / SSL_CERT_FILE /
   NODE_EXTRA_CA_CERTS, so pip, curl and node inside builds and sandboxes verify TLS.
   bookworm has Python 3.11, trixie Python 3.13.
3. Stand-ins for the public images task Dockerfiles name (`PUBLIC_IMAGES`), for an engine
   that cannot pull (`images_offline`): made on demand by the Docker backend when a FROM /
   COPY --from / docker_image names one that is not present, under trialflow's own name
   (`trialflow-standin/<ref>`, `ensure_standin`), which the build puts into the Dockerfile in
   place of the public name; a public name is never tagged. docs/harbor.md has the table.
4. `HARBOR_REF_IMAGE`: trixie with PyPI `harbor==0.25.*` in /opt/harbor (the reference the
   harbor_ref tests compare trialflow with; Harbor needs Python >= 3.12).

Usage: `python -m infra.base_image [--all] [--force]` (starts the Docker engine first when
none answers); `infra/setup.sh` runs it with `--all`.

Edge cases: debootstrap needs root and a reachable Debian mirror; a failure raises
`BaseImageError` with the tail of its output. A partial tarball is never left under the
final name (written to `*.tmp`, then renamed). A host without `HOST_CA_BUNDLE` builds
the bases without it (nothing to add).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker

from trialflow.sandbox.image_refs import standin_tag

log = logging.getLogger(__name__)

BASE_IMAGE = "trialflow-base:bookworm"
SUITE = "bookworm"
SUITES = ("bookworm", "trixie")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HARBOR_REF_IMAGE = "trialflow-harbor-ref:0.25"
HARBOR_REQUIREMENT = "harbor==0.25.*"
RECIPE_LABEL = "trialflow.recipe"
_RECIPE_VERSION = "2"  # bump when a recipe below changes
MIRROR = "http://deb.debian.org/debian"
# What agents and sample tasks expect to find: a shell, Python for tests, tmux for
# terminal-style agents, ps/kill for timeouts, and the usual file tools.
PACKAGES = (
    "bash",
    "coreutils",
    "findutils",
    "grep",
    "sed",
    "gawk",
    "diffutils",
    "patch",
    "procps",
    "psmisc",
    "tmux",
    "python3",
    "ca-certificates",
    "less",
    "file",
    "git",
    "curl",
    "xz-utils",
)
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "base-image"


class BaseImageError(RuntimeError):
    """debootstrap or `docker import` failed; the message carries the output tail."""


def _packages_digest() -> str:
    return hashlib.sha256(" ".join(sorted(PACKAGES)).encode()).hexdigest()[:12]


def rootfs_tarball_path(cache_dir: Path = CACHE_DIR, suite: str = SUITE) -> Path:
    return cache_dir / f"{suite}-rootfs-{_packages_digest()}.tar"


def _run(argv: list[str], what: str, timeout_s: float) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise BaseImageError(f"{what} failed with exit code {proc.returncode}:\n{tail}")


def _unmount_below(root: Path) -> None:
    prefix = str(root.resolve()) + "/"
    with open("/proc/mounts") as fh:
        targets = [line.split()[1] for line in fh if line.split()[1].startswith(prefix)]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def build_rootfs_tarball(dest: Path, timeout_s: float = 1200, suite: str = SUITE) -> Path:
    """Run debootstrap into a temporary dir and tar it to `dest` (atomic rename)."""
    if shutil.which("debootstrap") is None:
        raise BaseImageError("debootstrap is not installed (infra/setup.sh installs it)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trialflow-rootfs-", dir=dest.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        try:
            _run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    suite,
                    str(rootfs),
                    MIRROR,
                ],
                "debootstrap",
                timeout_s,
            )
        finally:
            # A failed debootstrap leaves /proc and /sys mounted inside the rootfs; the
            # temporary-dir cleanup must never recurse into them.
            _unmount_below(rootfs)
        # Downloaded .debs are dead weight in every sandbox image.
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        partial = dest.with_suffix(".tar.tmp")
        _run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], "tar", timeout_s)
        os.replace(partial, dest)
    return dest


def image_exists(client: docker.DockerClient, tag: str = BASE_IMAGE) -> bool:
    return _image(client, tag) is not None


def _image(client: docker.DockerClient, tag: str):
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256(_RECIPE_VERSION.encode())
    for p in parts:
        h.update(b"\0" + (p if isinstance(p, bytes) else p.encode()))
    return h.hexdigest()[:16]


def _current(client: docker.DockerClient, tag: str, recipe: str):
    img = _image(client, tag)
    if img is not None and (img.labels or {}).get(RECIPE_LABEL) == recipe:
        return img
    return None


def _build(
    client: docker.DockerClient, tag: str, dockerfile: str, files: dict[str, bytes], recipe: str
) -> str:
    """`docker build` of a generated Dockerfile (host network: no bridge here, never pull)."""
    with tempfile.TemporaryDirectory(prefix="trialflow-image-") as tmp:
        ctx = Path(tmp)
        (ctx / "Dockerfile").write_text(dockerfile)
        for name, data in files.items():
            (ctx / name).write_bytes(data)
        lines: list[str] = []
        try:
            for chunk in client.api.build(
                path=str(ctx),
                tag=tag,
                network_mode="host",
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                labels={RECIPE_LABEL: recipe},
            ):
                lines.extend(chunk.get("stream", "").splitlines())
                if "error" in chunk:
                    raise BaseImageError(
                        f"building {tag} failed: {chunk['error']}\n" + "\n".join(lines[-30:])
                    )
        except docker.errors.APIError as e:
            raise BaseImageError(f"building {tag} was rejected: {e}") from e
    img = _image(client, tag)
    if img is None:
        raise BaseImageError(f"building {tag} produced no image")
    return img.id


def _ensure_rootfs(client: docker.DockerClient, suite: str, force: bool, cache_dir: Path) -> str:
    tag = f"trialflow-rootfs:{suite}"
    recipe = _digest(suite, _packages_digest())
    if not force and _current(client, tag, recipe) is not None:
        return tag
    tarball = rootfs_tarball_path(cache_dir, suite)
    if force or not tarball.exists():
        t0 = time.monotonic()
        log.info("debootstrap %s -> %s", suite, tarball)
        build_rootfs_tarball(tarball, suite=suite)
        log.info("rootfs built in %.1fs", time.monotonic() - t0)
    repo, name = tag.split(":")
    # From a file path the SDK sends a Content-Length body; its chunked stream upload is
    # rejected by this engine ("invalid byte in chunk length").
    out = client.api.import_image_from_file(
        str(tarball),
        repository=repo,
        tag=name,
        changes=[
            'CMD ["/bin/bash"]',
            "ENV LANG=C.UTF-8",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            f"LABEL {RECIPE_LABEL}={recipe}",
        ],
    )
    if _image(client, tag) is None:
        raise BaseImageError(f"docker import did not produce {tag}: {out!r}"[:2000])
    return tag


_CA_ENV = {
    "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt",
    "REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
    "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
    "CURL_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
    "NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/ca-certificates.crt",
}


def ensure_base_image(
    client: docker.DockerClient, *, force: bool = False, cache_dir: Path = CACHE_DIR, suite: str = SUITE
) -> str:
    """Make sure `trialflow-base:{suite}` exists with the current recipe (packages, CA
    bundle); return its image id. `force=True` re-runs debootstrap and rebuilds."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    tag = f"trialflow-base:{suite}"
    ca = HOST_CA_BUNDLE.read_bytes() if HOST_CA_BUNDLE.is_file() else b""
    recipe = _digest(suite, _packages_digest(), ca)
    if not force and (img := _current(client, tag, recipe)) is not None:
        return img.id
    rootfs = _ensure_rootfs(client, suite, force, cache_dir)
    env = " ".join(f"{k}={v}" for k, v in _CA_ENV.items())
    dockerfile = f"FROM {rootfs}\n"
    files = {}
    if ca:
        files["trialflow-host-ca.crt"] = ca
        dockerfile += (
            "COPY trialflow-host-ca.crt /usr/local/share/ca-certificates/trialflow-host-ca.crt\n"
            "RUN update-ca-certificates >/dev/null\n"
        )
    dockerfile += f"ENV {env}\n"
    t0 = time.monotonic()
    image_id = _build(client, tag, dockerfile, files, recipe)
    log.info("built %s in %.1fs", tag, time.monotonic() - t0)
    return image_id


@dataclass(frozen=True)
class PublicImage:
    """A local stand-in for a public image: which base, what else it installs."""

    suite: str
    python: bool  # python3 + pip + venv, `python`/`pip` commands, pip allowed system-wide
    note: str

    def dockerfile(self) -> str:
        text = f"FROM trialflow-base:{self.suite}\n"
        if self.python:
            # python:*-slim lets pip install system-wide; Debian marks its Python
            # externally managed (PEP 668), which that image does not.
            text += (
                "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                "python3-pip python3-venv python-is-python3 >/dev/null "
                "&& rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && rm -rf /var/lib/apt/lists/* "
                "&& ln -sf /usr/bin/pip3 /usr/local/bin/pip\n"
            )
        return text


_PY_SUITE = {"3.11": "bookworm", "3.12": "trixie", "3.13": "trixie", "3": "trixie"}
# Public FROM references -> stand-ins. The first match wins; see docs/harbor.md.
PUBLIC_IMAGES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], PublicImage]]] = [
    (
        re.compile(
            r"^(?:docker\.io/)?(?:library/)?python:(3(?:\.1[123])?)(?:\.\d+)?(?:-slim)?(?:-(?:bookworm|trixie))?$"
        ),
        lambda m: PublicImage(
            _PY_SUITE[m.group(1)],
            True,
            f"Debian python3 ({'3.11' if _PY_SUITE[m.group(1)] == 'bookworm' else '3.13'})",
        ),
    ),
    (
        re.compile(r"^ghcr\.io/laude-institute/t-bench/python-3-1([123]):[\w.-]+$"),
        lambda m: PublicImage(_PY_SUITE[f"3.1{m.group(1)}"], True, "terminal-bench python image"),
    ),
    (
        re.compile(r"^(?:docker\.io/)?(?:library/)?ubuntu:(?:24\.04|noble|22\.04|jammy|latest)$"),
        lambda m: PublicImage("trixie", False, "Debian trixie (python3 3.13 present, unlike ubuntu)"),
    ),
    (
        re.compile(r"^ghcr\.io/laude-institute/t-bench/ubuntu-24-04:[\w.-]+$"),
        lambda m: PublicImage("trixie", False, "terminal-bench ubuntu image (tmux included)"),
    ),
    (
        re.compile(r"^(?:docker\.io/)?(?:library/)?debian:(bookworm|trixie|12|13)(?:-slim)?$"),
        lambda m: PublicImage(
            {"12": "bookworm", "13": "trixie"}.get(m.group(1), m.group(1)), False, "Debian"
        ),
    ),
]


def public_image(ref: str) -> PublicImage | None:
    """The stand-in for a public image reference, or None when there is none."""
    for pattern, make in PUBLIC_IMAGES:
        if (m := pattern.match(ref)) is not None:
            return make(m)
    return None


def ensure_standin(client: docker.DockerClient, ref: str) -> str:
    """Make the stand-in for `ref` under trialflow's own name (`image_refs.standin_tag`), never
    under `ref` itself, unless it exists with the current recipe; return that name. Its base
    (`trialflow-base:{suite}`) is made first when missing (callers that build several
    stand-ins at once make the base first, under its own lock)."""
    spec = public_image(ref)
    if spec is None:
        raise BaseImageError(f"no local stand-in for {ref}")
    tag = standin_tag(ref)
    base_id = ensure_base_image(client, suite=spec.suite)
    recipe = _digest(ref, spec.dockerfile(), base_id)
    if _current(client, tag, recipe) is None:
        t0 = time.monotonic()
        _build(client, tag, spec.dockerfile(), {}, recipe)
        log.info(
            "made %s for %s from trialflow-base:%s (%s) in %.1fs",
            tag,
            ref,
            spec.suite,
            spec.note,
            time.monotonic() - t0,
        )
    return tag


def is_old_standin(client: docker.DockerClient, ref: str) -> bool:
    """`ref` names an image an older trialflow made as a stand-in and tagged under the public
    name (a name the table covers, carrying the recipe label): not the image `ref` means."""
    if public_image(ref) is None:
        return False
    img = _image(client, ref)
    return img is not None and RECIPE_LABEL in (img.labels or {})


def ensure_harbor_ref_image(client: docker.DockerClient) -> str:
    """trixie + a venv at /opt/harbor with `harbor==0.25.*` from PyPI (pip through the
    host's CA bundle baked into the base)."""
    base_id = ensure_base_image(client, suite="trixie")
    dockerfile = (
        "FROM trialflow-base:trixie\n"
        "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -qq python3-venv >/dev/null "
        "&& rm -rf /var/lib/apt/lists/*\n"
        f"RUN python3 -m venv /opt/harbor && /opt/harbor/bin/pip install -q '{HARBOR_REQUIREMENT}'\n"
        "ENV PATH=/opt/harbor/bin:$PATH\n"
    )
    recipe = _digest(dockerfile, base_id)
    if (img := _current(client, HARBOR_REF_IMAGE, recipe)) is not None:
        return img.id
    t0 = time.monotonic()
    image_id = _build(client, HARBOR_REF_IMAGE, dockerfile, {}, recipe)
    log.info("built %s in %.1fs", HARBOR_REF_IMAGE, time.monotonic() - t0)
    return image_id


OPENHANDS_IMAGE = "trialflow-openhands:1.58"
OPENHANDS_REQUIREMENTS = ("openhands-sdk==1.58.2", "openhands-tools==1.58.2")


def ensure_openhands_image(client: docker.DockerClient) -> str:
    """trixie + a venv at /opt/openhands with the OpenHands SDK and its tools (PyPI; they
    need Python >= 3.12, which bookworm lacks). The `openhands` scaffold runs its agent
    loop in a container of this image (pip through the host's CA bundle baked into the base)."""
    base_id = ensure_base_image(client, suite="trixie")
    reqs = " ".join(f"'{r}'" for r in OPENHANDS_REQUIREMENTS)
    dockerfile = (
        "FROM trialflow-base:trixie\n"
        "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -qq python3-venv >/dev/null "
        "&& rm -rf /var/lib/apt/lists/*\n"
        f"RUN python3 -m venv /opt/openhands && /opt/openhands/bin/pip install -q {reqs}\n"
    )
    recipe = _digest(dockerfile, base_id)
    if (img := _current(client, OPENHANDS_IMAGE, recipe)) is not None:
        return img.id
    t0 = time.monotonic()
    image_id = _build(client, OPENHANDS_IMAGE, dockerfile, {}, recipe)
    log.info("built %s in %.1fs", OPENHANDS_IMAGE, time.monotonic() - t0)
    return image_id


OPENHANDS_ROOT = REPO_ROOT / ".cache" / "openhands" / "root"


def ensure_openhands_root(client: docker.DockerClient, dest: Path = OPENHANDS_ROOT) -> Path:
    """The filesystem of `OPENHANDS_IMAGE` unpacked at `dest` (a host directory the
    `openhands` scaffold mounts read-only into sandboxes of any distribution). Re-unpacked
    only when the image changed (its id is recorded in `dest.with_suffix('.image')`);
    unpacked beside `dest` and renamed, so a partial root never sits under that name."""
    image_id = ensure_openhands_image(client)
    marker = dest.with_suffix(".image")
    if dest.is_dir() and marker.is_file() and marker.read_text() == image_id:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    container = client.containers.create(image_id, command=["true"], network_mode="none")
    try:
        with subprocess.Popen(["tar", "-x", "-C", str(partial)], stdin=subprocess.PIPE) as tar:
            assert tar.stdin is not None
            for chunk in container.export():
                tar.stdin.write(chunk)
            tar.stdin.close()
            if tar.wait() != 0:
                raise BaseImageError(f"unpacking {OPENHANDS_IMAGE} into {partial} failed")
    finally:
        container.remove(force=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(partial, dest)
    marker.write_text(image_id)
    return dest
