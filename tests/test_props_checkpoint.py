"""Property-based tests of helpers.cluster.checkpoint: listings of any directory tree, saved layouts,
waiting for an uncommitted save."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import checkpoint_files, format_bytes, format_checkpoint_files
from helpers.cluster.checkpoint import TMP_SUFFIX, SavedArray, wait_for_uncommitted

names = st.text("abcdefgh_.0123456789", min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..")
)
hexnames = st.text("0123456789abcdef", min_size=32, max_size=32)
trees = st.recursive(
    st.dictionaries(st.one_of(names, hexnames), st.integers(0, 3000), max_size=4),
    lambda inner: st.dictionaries(names, inner, max_size=3),
    max_leaves=12,
)


def _write(root: Path, tree: dict, rel: str = "") -> dict[str, int]:
    files = {}
    for name, node in tree.items():
        path = root / name
        if isinstance(node, dict):
            path.mkdir()
            files |= _write(path, node, f"{rel}{name}/")
        else:
            path.write_bytes(b"x" * node)
            files[f"{rel}{name}"] = node
    return files


@settings(max_examples=40)
@given(st.dictionaries(names, trees, max_size=3))
def test_listings_name_every_file_once_with_its_size_and_add_up(tree):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        root.mkdir()
        files = _write(root, tree)
        assert checkpoint_files(root) == dict(sorted(files.items()))
        text = format_checkpoint_files(root)
        first = text.splitlines()[0]
        total = sum(files.values())
        assert first.startswith("ckpt/") and first.endswith(
            f"{format_bytes(total)} in {len(files)} file{'s' * (len(files) != 1)}"
        )
        # Every file is named, or folded into a "<k> data files" line of its folder.
        hashed = sum(1 for f in files if re.fullmatch(r"[0-9a-f]{32}", f.rsplit("/", 1)[-1]))
        folded = sum(int(m) for m in re.findall(r"<(\d+) data files?>", text))
        assert folded == hashed
        shown = [ln.split()[0] for ln in text.splitlines()[1:]]
        for path in files:
            leaf = path.rsplit("/", 1)[-1]
            assert leaf in shown or re.fullmatch(r"[0-9a-f]{32}", leaf)
        assert len(format_checkpoint_files(root, max_depth=1).splitlines()) <= len(
            text.splitlines()
        )


@given(st.text(max_size=10))
def test_listings_refuse_what_is_not_a_directory(name):
    with tempfile.TemporaryDirectory() as tmp:
        missing = Path(tmp) / f"missing-{name.replace('/', '_')}"
        with pytest.raises(FileNotFoundError, match="is not a directory"):
            checkpoint_files(missing)
        with pytest.raises(FileNotFoundError, match="is not a directory"):
            format_checkpoint_files(missing)


@given(
    st.lists(st.integers(1, 64), min_size=1, max_size=4).flatmap(
        lambda shape: st.tuples(
            st.just(tuple(shape)), st.tuples(*[st.integers(1, s) for s in shape])
        )
    )
)
def test_a_saved_array_has_as_many_chunks_as_its_chunk_shape_tiles(shape_and_chunk):
    shape, chunk = shape_and_chunk
    a = SavedArray("p", shape, "float32", None, None, chunk)
    expected = 1
    for s, c in zip(shape, chunk, strict=True):
        expected *= -(-s // c)
    assert a.chunks == expected
    assert SavedArray("p", shape, "float32", None, None, None).chunks is None


@settings(max_examples=40)
@given(
    st.integers(0, 120),
    st.sets(st.integers(0, 120), max_size=5),
    st.sets(st.integers(0, 120), max_size=5),
)
def test_wait_for_uncommitted_finds_exactly_that_steps_temporary_directory(
    step, pending, committed
):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for s in pending:
            (root / f"{s}{TMP_SUFFIX}-{s + 7}").mkdir()
        for s in committed - pending:
            (root / str(s)).mkdir()
        if step in pending:
            assert (
                wait_for_uncommitted(root, step, timeout=0.0)
                == root / f"{step}{TMP_SUFFIX}-{step + 7}"
            )
        else:
            with pytest.raises(TimeoutError, match=f"no {step}\\.orbax-checkpoint-tmp"):
                wait_for_uncommitted(root, step, timeout=0.0)
