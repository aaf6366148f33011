"""The ``o200k_base`` vocabulary the gpt-oss harmony parser needs, for machines that only reach
the package registries.

``openai-harmony`` downloads ``o200k_base.tiktoken`` from OpenAI's public blob store unless
``TIKTOKEN_ENCODINGS_BASE`` names a directory holding it, and checks its SHA-256 either way.
The npm package ``tiktoken`` ships the same ranks in its own compact JSON form
(``encoders/o200k_base.json``: ``"! OFFSET TOKEN TOKEN ..."``, base64 tokens with consecutive
ranks), so this module fetches that package with ``npm pack`` and writes the ``.tiktoken``
file (``BASE64 RANK`` per line). The hash check makes a wrong conversion fail here, loudly.

    python -m infra.tiktoken_vocab [DIR]     (default <repo>/.cache/tiktoken; idempotent)
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from infra.services import REPO_ROOT

NPM_PACKAGE = "tiktoken@1.0.22"
FILENAME = "o200k_base.tiktoken"
# The hash openai-harmony (and tiktoken) expect for o200k_base.tiktoken.
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
DEFAULT_DIR = REPO_ROOT / ".cache" / "tiktoken"


def ranks_from_npm_json(data: dict) -> bytes:
    """The ``.tiktoken`` file contents for the npm package's ``encoders/*.json`` ``data``."""
    out: list[str] = []
    for line in str(data["bpe_ranks"]).split("\n"):
        if not line:
            continue
        _, offset, *tokens = line.split(" ")
        out.extend(f"{token} {int(offset) + i}\n" for i, token in enumerate(tokens))
    return "".join(out).encode()


def ensure_vocab(directory: Path = DEFAULT_DIR) -> Path:
    """``directory`` holding a verified ``o200k_base.tiktoken`` (fetched once)."""
    target = directory / FILENAME
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == SHA256:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["npm", "pack", NPM_PACKAGE, "--silent", "--pack-destination", tmp],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (tarball,) = Path(tmp).glob("tiktoken-*.tgz")
        with tarfile.open(tarball) as tar:
            member = tar.extractfile("package/encoders/o200k_base.json")
            if member is None:
                raise RuntimeError(f"{NPM_PACKAGE} has no encoders/o200k_base.json")
            data = json.load(member)
    contents = ranks_from_npm_json(data)
    digest = hashlib.sha256(contents).hexdigest()
    if digest != SHA256:
        raise RuntimeError(f"converted {FILENAME} has sha256 {digest}, expected {SHA256}")
    tmp_target = target.with_suffix(".tmp")
    tmp_target.write_bytes(contents)
    tmp_target.replace(target)
    return directory


if __name__ == "__main__":
    print(ensure_vocab(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
