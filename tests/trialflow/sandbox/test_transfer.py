"""Streamed, budgeted tar extraction (pure: tar streams built here): members are charged by
their header sizes before their data is read (a sparse file by its apparent size), entries
one each, hard links by their target's size; nothing over the budget reaches the disk."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._hypothesis import examples
from trialflow.errors import OutputBudgetExceeded
from trialflow.sandbox.transfer import Allowance, extract_stream


def _tar(files: dict[str, bytes], *, top: str | None = "out", links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        prefix = f"{top}/" if top else ""
        if top:
            info = tarfile.TarInfo(top)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(prefix + name)
            info.type, info.linkname = tarfile.LNKTYPE, prefix + target
            tar.addfile(info)
    return buf.getvalue()


def _chunks(data: bytes, size: int = 7000):
    return (data[i : i + size] for i in range(0, len(data), size))


def _on_disk(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def test_within_budget_extracts_with_the_top_entry_stripped(tmp_path):
    allowance = Allowance("artifacts", 100, 10)
    extract_stream(
        _chunks(_tar({"a.txt": b"x" * 40, "d/b": b"y" * 60})), tmp_path, strip_top=True, allowance=allowance
    )
    assert (tmp_path / "a.txt").read_bytes() == b"x" * 40 and (tmp_path / "d" / "b").stat().st_size == 60
    assert (allowance.used_bytes, allowance.used_files) == (100, 2)


def test_a_member_over_the_budget_is_refused_by_its_header(tmp_path):
    small = tarfile.TarInfo("small")
    small.size = 10
    head = small.tobuf(format=tarfile.GNU_FORMAT) + b"s" * 10 + bytes(502)  # data padded to a block
    big = tarfile.TarInfo("huge")
    big.size = 1 << 40  # a terabyte, by its header; the stream holds none of it
    stream = head + big.tobuf(format=tarfile.GNU_FORMAT)
    read = []

    def chunks():  # the header, then the terabyte the engine would go on sending
        yield from _chunks(stream)
        while True:
            read.append(1 << 16)
            yield bytes(1 << 16)

    with pytest.raises(OutputBudgetExceeded, match="huge") as err:
        extract_stream(chunks(), tmp_path, strip_top=False, allowance=Allowance("artifacts", 1 << 20, 10))
    assert err.value.what == "artifacts" and not (tmp_path / "huge").exists()
    assert (tmp_path / "small").read_bytes() == b"s" * 10
    assert sum(read) <= 1 << 17  # at most the reader's read-ahead past the header


def test_a_sparse_file_counts_by_its_apparent_size(tmp_path):
    sparse = tmp_path / "src" / "sparse"
    sparse.parent.mkdir()
    with sparse.open("wb") as f:
        f.truncate(64 << 20)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(sparse, arcname="sparse")
    with pytest.raises(OutputBudgetExceeded):
        extract_stream(
            _chunks(buf.getvalue(), 1 << 16),
            tmp_path / "out",
            strip_top=False,
            allowance=Allowance("a", 1 << 20, 5),
        )
    assert _on_disk(tmp_path / "out") == 0


def test_entries_and_hard_links_are_charged(tmp_path):
    with pytest.raises(OutputBudgetExceeded, match="3 entries"):
        extract_stream(
            _chunks(_tar({"1": b"", "2": b"", "3": b"", "4": b""})),
            tmp_path / "e",
            strip_top=True,
            allowance=Allowance("a", 100, 3),
        )
    links = {f"l{i}": "f" for i in range(5)}
    with pytest.raises(OutputBudgetExceeded, match="l2"):
        extract_stream(
            _chunks(_tar({"f": b"z" * 30}, links=links)),
            tmp_path / "h",
            strip_top=True,
            allowance=Allowance("a", 100, 100),
        )


@settings(max_examples=examples(40), deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), max_size=12),
    budget=st.integers(0, 20_000),
    chunk=st.integers(1, 9000),
)
def test_nothing_over_the_budget_reaches_the_disk(tmp_path_factory, sizes, budget, chunk):
    dest = tmp_path_factory.mktemp("x")
    files = {f"f{i}": b"q" * n for i, n in enumerate(sizes)}
    allowance = Allowance("a", budget, 100)
    try:
        extract_stream(_chunks(_tar(files), chunk), dest, strip_top=True, allowance=allowance)
    except OutputBudgetExceeded:
        assert sum(sizes) > budget
    else:
        assert sum(sizes) <= budget and _on_disk(dest) == sum(sizes)
    assert _on_disk(dest) <= budget and allowance.used_bytes == _on_disk(dest)
