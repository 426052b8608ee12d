"""Around orbax checkpoints: what lands on disk, how the shards were written, and storage faults.

Saving and restoring themselves are orbax's own API, taught in notebook 06
(``ocp.CheckpointManager``, ``ocp.args.StandardSave`` and ``ocp.args.StandardRestore``
with a target tree that carries the shardings wanted). This module holds what the
notebook and the tests need around those calls:

- ``checkpoint_files`` / ``format_checkpoint_files``: every file under a checkpoint
  directory with its size, and a listing a person can read.
- ``saved_layout`` / ``format_saved_layout``: per saved array, its shape and dtype, the
  ``PartitionSpec`` and mesh it was saved from, and the chunk shape orbax wrote.
- ``paused_writes`` / ``failing_writes``: hold back, or break, the background commit of
  every save started inside a ``with`` block, so that a checkpoint caught half-way can be
  looked at and tested deterministically; ``wait_for_uncommitted`` waits until such a
  save's temporary directory is on disk.

orbax-checkpoint is the optional ``checkpoint`` extra of this package, so it is imported
only inside the functions that need it: ``import helpers`` works without it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import stat
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from helpers.measuring.measure import format_bytes
from helpers.placing.sharding import path_str

__all__ = [
    "PausedSaves",
    "SavedArray",
    "checkpoint_files",
    "failing_writes",
    "format_checkpoint_files",
    "format_saved_layout",
    "paused_writes",
    "saved_layout",
    "wait_for_uncommitted",
]

#: What orbax appends to ``<step>`` while a save of that step is not committed yet.
TMP_SUFFIX = ".orbax-checkpoint-tmp"

# ---------------------------------------------------------------------------
# What lands on disk
# ---------------------------------------------------------------------------

# OCDBT data files and similar content-addressed blobs: 32 hex digits, nothing else.
_HASHED = re.compile(r"^[0-9a-f]{32}$")


def checkpoint_files(root: str | Path) -> dict[str, int]:
    """Every file under ``root``: its path relative to ``root`` (with ``/``) -> its size in bytes.

    Sorted by path. Directories are not listed themselves, only the files in them.

    Raises:
      FileNotFoundError: ``root`` does not exist.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint_files: {root} is not a directory.")
    files = {p.relative_to(root).as_posix(): size for p, size in _sized_files(root)}
    return dict(sorted(files.items()))


def _file_size(path: Path) -> int | None:
    """The size of a regular file, or None if it is not one (or vanished meanwhile)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _sized_files(root: Path) -> list[tuple[Path, int]]:
    """Every regular file under ``root`` with its size.

    A save in flight renames directories and creates and deletes lock files while we
    look; whatever vanishes between listing and ``stat`` is skipped, not an error.
    """
    out = []
    for dirpath, _, names in os.walk(root):  # os.walk skips directories that vanish
        for name in names:
            path = Path(dirpath, name)
            size = _file_size(path)
            if size is not None:
                out.append((path, size))
    return out


def _summary(path: Path) -> str:
    """``"<total size> in <k> file(s)"`` for a directory."""
    sizes = [size for _, size in _sized_files(path)]
    return f"{format_bytes(sum(sizes))} in {len(sizes)} file{'s' * (len(sizes) != 1)}"


def format_checkpoint_files(root: str | Path, max_depth: int | None = None) -> str:
    """A tree listing of ``root`` with the size of every file and of every directory.

    Directories end in ``/`` and show their total size and file count. Files whose names
    are 32 hex digits (the content-addressed data files of orbax's OCDBT format) are
    folded into one line per directory, ``<k> data files``, since their names say
    nothing. ``max_depth`` is how many levels below ``root`` are listed: with 1, only
    ``root``'s own entries; a directory at the deepest level listed is shown as its
    summary line alone. ``None`` lists everything.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"format_checkpoint_files: {root} is not a directory.")
    rows: list[tuple[str, str]] = []

    def walk(path: Path, depth: int) -> None:
        try:
            entries = sorted(path.iterdir(), key=lambda p: (p.is_file(), p.name))
        except FileNotFoundError:  # renamed by a commit while we looked
            return
        sizes = {p: _file_size(p) for p in entries}
        hashed = [p for p in entries if sizes[p] is not None and _HASHED.match(p.name)]
        indent = "  " * depth
        for p in entries:
            if p in hashed:
                continue
            if sizes[p] is not None:
                rows.append((f"{indent}{p.name}", format_bytes(sizes[p])))
            elif p.is_dir():
                rows.append((f"{indent}{p.name}/", _summary(p)))
                if max_depth is None or depth < max_depth:
                    walk(p, depth + 1)
        if hashed:
            size = sum(sizes[p] for p in hashed)
            rows.append(
                (f"{indent}<{len(hashed)} data file{'s' * (len(hashed) != 1)}>", format_bytes(size))
            )

    rows.append((f"{root.name}/", _summary(root)))
    walk(root, 1)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {info}" for name, info in rows)


# ---------------------------------------------------------------------------
# How the shards were written
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedArray:
    """One array of a checkpoint, as orbax's metadata describes it.

    ``saved_spec`` holds the ``PartitionSpec`` entries it was saved with (``None`` when its
    sharding was not a ``NamedSharding``), ``saved_mesh`` the mesh's axis sizes then, and
    ``chunk_shape`` the shape of the blocks orbax wrote, one chunk each.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    saved_spec: tuple[Any, ...] | None
    saved_mesh: dict[str, int] | None
    chunk_shape: tuple[int, ...] | None

    @property
    def chunks(self) -> int | None:
        """How many chunks the array was written as (shape / chunk shape, rounded up)."""
        if self.chunk_shape is None:
            return None
        return math.prod(-(-s // c) for s, c in zip(self.shape, self.chunk_shape, strict=True) if c)


def saved_layout(metadata: Any) -> list[SavedArray]:
    """Per array, what ``manager.item_metadata(step)`` (or ``checkpointer.metadata(path)``) records.

    Accepts orbax's ``TreeMetadata`` or the plain tree inside it. The tree is walked in
    its own order (orbax sorts keys); a leaf without a field orbax did not record gets
    ``None`` there.
    """
    tree = getattr(metadata, "tree", metadata)
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if leaf is None:
            continue
        shape = getattr(leaf, "shape", None)
        if shape is None:
            raise ValueError(
                f"saved_layout: '{path_str(path)}' is a {type(leaf).__name__}, not array metadata."
            )
        sharding = getattr(leaf, "sharding", None)
        spec = getattr(sharding, "partition_spec", None)
        axis_names = getattr(sharding, "axis_names", None)
        mesh_shape = getattr(sharding, "shape", None)
        mesh = None
        if axis_names is not None and mesh_shape is not None:
            mesh = {str(a): int(s) for a, s in zip(axis_names, mesh_shape, strict=True)}
        storage = getattr(leaf, "storage", None)
        chunk = getattr(storage, "chunk_shape", None)
        out.append(
            SavedArray(
                path=path_str(path),
                shape=tuple(int(s) for s in shape),
                dtype=str(getattr(leaf, "dtype", "?")),
                saved_spec=None if spec is None else tuple(spec),
                saved_mesh=mesh,
                chunk_shape=None if chunk is None else tuple(int(c) for c in chunk),
            )
        )
    return out


def _spec_text(spec: tuple[Any, ...] | None) -> str:
    if spec is None:
        return "-"
    return "P(" + ", ".join(repr(e) if e is not None else "None" for e in spec) + ")"


def format_saved_layout(metadata: Any, prefix: str = "") -> str:
    """``saved_layout`` as a text table, keeping only arrays whose path starts with ``prefix``.

    Columns: path, shape, dtype, the spec it was saved with, the chunk shape orbax wrote
    and how many chunks that makes. A last line names the mesh(es) the arrays were saved from.
    """
    rows = [a for a in saved_layout(metadata) if a.path.startswith(prefix)]
    if not rows:
        raise ValueError(f"format_saved_layout: no saved array path starts with {prefix!r}.")
    header = ("array", "shape", "dtype", "saved with", "chunk shape", "chunks")
    body = [
        (a.path, str(a.shape), a.dtype, _spec_text(a.saved_spec), str(a.chunk_shape), str(a.chunks))
        for a in rows
    ]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [
        line.format(*header),
        "  ".join("-" * w for w in widths),
        *(line.format(*r) for r in body),
    ]
    meshes = sorted({tuple(a.saved_mesh.items()) for a in rows if a.saved_mesh}, key=str)
    if meshes:
        out.append("")
        out.append("saved from mesh " + "; ".join(str(dict(m)) for m in meshes))
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Storage faults, to look at (and test) a checkpoint caught half-way
# ---------------------------------------------------------------------------
#
# orbax saves in two phases. ``manager.save(...)`` blocks only while the arrays are copied
# off the devices and their writes are started: the ``TypeHandler`` registered for
# ``jax.Array`` returns the futures of those writes from ``serialize``. A background thread
# waits for every future and commits the checkpoint only when all of them succeed. The
# helpers below register (orbax's public ``type_handlers.register_type_handler``) a handler
# that forwards every call to the registered one and adds one future to what ``serialize``
# returns: a future that is pending until the block ends, or that holds an error. The
# original handler is registered back when the block ends. Custom type handlers:
# https://orbax.readthedocs.io/en/latest/guides/checkpoint/custom_handlers.html


class _WithExtraFuture:
    """The registered ``jax.Array`` handler, with one more future on every ``serialize``.

    The futures of the original handler's writes are appended to ``writes`` as they come.
    """

    def __init__(self, inner: Any, extra: Future, writes: list[Any]) -> None:
        self._inner, self._extra, self._writes = inner, extra, writes

    def __getattr__(self, name: str) -> Any:  # everything else is the original handler's
        if name == "_inner":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)

    async def serialize(self, values: Any, infos: Any, args: Any = None) -> list[Any]:
        futures = list(await self._inner.serialize(values, infos, args))
        self._writes.extend(futures)
        return [*futures, self._extra]


class PausedSaves:
    """What ``paused_writes`` yields: the array writes of the saves it holds back."""

    def __init__(self) -> None:
        self.writes: list[Any] = []  # orbax's futures, one or more per save

    def wait_written(self, timeout: float = 60.0) -> int:
        """Block until every array write of the held saves has finished; return how many.

        The saves stay uncommitted: only leaving the ``paused_writes`` block commits them.

        Raises:
          ValueError: no save has been started inside the block yet.
          TimeoutError: a write did not finish within ``timeout`` seconds.
        """
        if not self.writes:
            raise ValueError(
                "wait_written: no save started inside this paused_writes block yet; "
                "call manager.save(...) first."
            )
        deadline = time.monotonic() + timeout
        for write in list(self.writes):
            try:
                write.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError as e:  # orbax's threads raise it with their own words
                raise TimeoutError(
                    f"wait_written: an array write did not finish within {timeout} s."
                ) from e
        return len(self.writes)


@contextlib.contextmanager
def _quiet(text: str, error: BaseException | None = None) -> Iterator[None]:
    """Drop absl's log records that mention ``text`` or carry ``error`` in their chain."""

    def keep(record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None and error is not None:
            if exc is error:
                return False
            exc = exc.__cause__ or exc.__context__
        return text not in record.getMessage()

    logging.getLogger("absl").addFilter(keep)
    try:
        yield
    finally:
        logging.getLogger("absl").removeFilter(keep)


def _register(handler: Any) -> None:
    from orbax.checkpoint import type_handlers

    with _quiet("overriding"):  # orbax warns of every override; this one is on purpose
        type_handlers.register_type_handler(jax.Array, handler, override=True)


@contextlib.contextmanager
def _extra_commit_future(extra: Future, writes: list[Any] | None = None) -> Iterator[None]:
    from orbax.checkpoint import type_handlers

    original = type_handlers.get_type_handler(jax.Array)
    _register(_WithExtraFuture(original, extra, [] if writes is None else writes))
    try:
        yield
    finally:
        _register(original)


@contextlib.contextmanager
def paused_writes() -> Iterator[PausedSaves]:
    """Hold back the commit of every orbax save started inside this block until the block ends.

    Inside the block, ``manager.save(step, ...)`` returns as usual and its array data is
    written in the background, but the checkpoint stays uncommitted: its directory is named
    ``<step>.orbax-checkpoint-tmp...`` and ``manager.is_saving_in_progress()`` is True.
    ``save`` returns before the writes finish; the yielded ``PausedSaves.wait_written()``
    blocks until they have. orbax may create that directory in its background thread
    (``AsyncOptions.create_directories_asynchronously``, on by default), so it can appear
    after ``save`` returns: ``wait_for_uncommitted`` waits for it. Leaving the block lets
    the commit go ahead. A process killed inside the block (after that wait) dies
    mid-save, deterministically (in a multi-process job: with its part of the save undone).
    """
    gate: Future = Future()
    paused = PausedSaves()
    with _extra_commit_future(gate, paused.writes):
        try:
            yield paused
        finally:
            gate.set_result(None)


@contextlib.contextmanager
def failing_writes(
    error: BaseException | None = None, *, quiet: bool = True
) -> Iterator[BaseException]:
    """Make every orbax save started inside this block fail before it is committed.

    The array data is handed to storage as usual; then the background commit raises
    ``error`` (by default ``OSError(ENOSPC, "No space left on device ...")``), as a full
    disk or a lost connection would. The checkpoint stays ``<step>.orbax-checkpoint-tmp``.
    orbax raises the error from the next ``manager.wait_until_finished()`` (or ``save`` or
    ``close``), so call that inside the block. Yields the error object. With ``quiet``, orbax's
    own log lines about it (each with a full traceback) are dropped while the block is open.
    """
    if error is None:
        error = OSError(
            errno.ENOSPC,
            "No space left on device (injected by helpers.cluster.checkpoint.failing_writes)",
        )
    failed: Future = Future()
    failed.set_exception(error)
    with _quiet(str(error), error) if quiet else contextlib.nullcontext():
        with _extra_commit_future(failed):
            yield error


def wait_for_uncommitted(directory: str | Path, step: int, timeout: float = 60.0) -> Path:
    """Wait until ``step``'s uncommitted save, ``<step>.orbax-checkpoint-tmp...``, is in
    ``directory``, and return its path.

    Use it after ``manager.save(step, ...)`` inside ``paused_writes``: orbax may create the
    directory in its background thread, so a process killed right after ``save`` returned
    can die before the save has left anything on disk.

    Raises:
      TimeoutError: no such directory appeared within ``timeout`` seconds.
    """
    root = Path(directory)
    deadline = time.monotonic() + timeout
    while True:
        found = sorted(root.glob(f"{step}{TMP_SUFFIX}*"))
        if found:
            return found[0]
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"wait_for_uncommitted: no {step}{TMP_SUFFIX}* in {root} after {timeout} s; "
                f"was manager.save({step}, ...) called on a manager of that directory?"
            )
        time.sleep(0.01)
