"""Orbax checkpoints of an elastic run's host snapshots: written asynchronously, read back checked.

`Checkpoints` writes each snapshot of `pw.ElasticTrainer` (its state's
leaves by position, each leaf's key path in the step's metadata; a leaf of a
one-byte type TensorStore has none for, such as uint4 or float8_e4m3, as its
bytes, its dtype in the metadata) and survives a write that fails;
`read_checkpoint` finds the newest intact one to resume from.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .avals import aval_of, is_extended, wire_aval

log = logging.getLogger("pathways_mlir.elastic")

SPACE_MARGIN = 1 << 16     # bytes beyond a snapshot's arrays a checkpoint's metadata may take


class CheckpointError(RuntimeError):
    """A checkpoint that could not be written or read; the message names its path."""


class Checkpoints:
    """Writes snapshots as Orbax checkpoints in `directory`; a write that cannot fit the disk's free space
    is refused before Orbax starts it, and a write that fails (a disk that fills meanwhile, a lost
    mount) logs one line naming the checkpoint, removes its partial `*-tmp*` directory and leaves the next
    snapshot to try again (with a new manager: Orbax's keeps raising a failed write's error), or, if
    `strict`, raises CheckpointError."""

    def __init__(self, manager, reopen: Callable[[], Any], directory: str, strict: bool, paths: list[str]):
        self._manager, self._reopen, self.directory, self.strict = manager, reopen, directory, strict
        self.paths = paths                   # each leaf's key path (`jax.tree_util.keystr`), which a read checks
        self._writing: int | None = None     # the step of the write in flight (asynchronous)

    def save(self, step: int, arrays: list[np.ndarray]) -> None:
        """Starts writing one snapshot, once the write before it is over (its failure reported first)."""
        import orbax.checkpoint as ocp

        self.finish()
        needed = sum(a.nbytes for a in arrays) + SPACE_MARGIN
        disk = os.statvfs(self.directory)
        if disk.f_bavail * disk.f_frsize < needed:      # refused before Orbax writes anything
            self._report(step, f"no space left on the device: {needed} bytes needed, "
                               f"{disk.f_bavail * disk.f_frsize} free")
            return
        self._writing = step
        item, dtypes = _as_item(arrays)
        try:
            self._manager.save(step, args=ocp.args.StandardSave(item),
                               custom_metadata={"paths": self.paths, "dtypes": dtypes})
        except Exception as error:  # noqa: BLE001  (whatever the disk or Orbax raises, reported in one line)
            self._failed(step, error)

    def finish(self) -> None:
        """Waits for the write in flight; reports its failure."""
        step, self._writing = self._writing, None
        try:
            self._manager.wait_until_finished()
        except Exception as error:  # noqa: BLE001
            self._failed(step, error)

    def close(self) -> None:
        """Waits for the write in flight (reporting its failure) and closes the manager."""
        try:
            self.finish()
        finally:
            self._manager.close()

    def _failed(self, step: int | None, error: Exception) -> None:
        for wind_down in (self._manager.wait_until_finished, self._manager.close):
            try:                                 # its writer threads stop before their files are removed
                wind_down()
            except Exception:  # noqa: BLE001  (the same failure again)
                pass
        self._manager = self._reopen()
        for name in os.listdir(self.directory):
            if "-tmp" in name:                  # Orbax writes `<step>.orbax-checkpoint-tmp-<time>` first
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        self._report(step, (str(error).strip().splitlines() or [type(error).__name__])[0][:300])

    def _report(self, step: int | None, reason: str) -> None:
        where = os.path.join(self.directory, str(step)) if step is not None else self.directory
        if self.strict:
            raise CheckpointError(f"the checkpoint {where} could not be written: {reason}") from None
        log.warning("the checkpoint %s could not be written (%s); the host snapshot is kept and the next "
                    "snapshot tries again", where, reason)




def _key(i: int) -> str:
    """The name of leaf `i` in a snapshot's Orbax item."""
    return f"leaf{i:05d}"


def _as_item(arrays: Sequence[np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The Orbax item of a snapshot: its leaves by position, but for zero-size ones (which Orbax refuses and
    `read_checkpoint` makes again from the state's shapes and dtypes); and the dtype of each leaf stored as its
    bytes (uint8), one of a one-byte type TensorStore has none for (uint4, uint2, float8_e4m3, ...), by key."""
    item = {_key(i): array for i, array in enumerate(arrays) if array.size}
    dtypes = {key: array.dtype.name for key, array in item.items() if _as_bytes(array.dtype)}
    return {key: array.view(np.uint8) if key in dtypes else array for key, array in item.items()}, dtypes


@functools.lru_cache(maxsize=None)
def _as_bytes(dtype: np.dtype) -> bool:
    """Whether arrays of `dtype` are stored as their bytes: it takes one byte, and TensorStore (Orbax's
    storage) has no data type of its name."""
    import tensorstore

    if dtype.itemsize != 1:
        return False
    try:
        tensorstore.dtype(dtype.name)
    except ValueError:
        return True
    return False


def _from_bytes(stored: np.ndarray, name: Any) -> np.ndarray:
    """A leaf stored as its bytes as the one-byte dtype `name` again, bit for bit (as stored if it cannot be:
    a damaged checkpoint, which the leaf's dtype check then reports)."""
    try:
        dtype = np.dtype(jax.numpy.dtype(name))
    except (TypeError, ValueError):
        return stored
    return stored.view(dtype) if stored.dtype == np.uint8 and dtype.itemsize == 1 else stored


def read_checkpoint(directory: str, like: Sequence, paths: Sequence[str]) -> tuple[int, list[np.ndarray]]:
    """Returns the step and leaves of the newest checkpoint in `directory`, checked against `like`, the state's
    leaves, and `paths`, their key paths."""
    import orbax.checkpoint as ocp

    if not os.path.isdir(directory):
        raise ValueError(f"resume_from: {directory} is not a directory")
    manager = ocp.CheckpointManager(os.path.abspath(directory))
    try:
        steps = sorted(manager.all_steps(), reverse=True)
    finally:
        manager.close()
    if not steps:
        raise ValueError(f"resume_from: {directory} holds no checkpoint")
    began = time.perf_counter()
    for step in steps:
        try:
            # A manager per step: once a step directory without its item failed, Orbax's manager expected
            # several items, and every older checkpoint failed too.
            with ocp.CheckpointManager(os.path.abspath(directory)) as reader:
                item = reader.restore(step, args=ocp.args.StandardRestore())
                metadata = reader.metadata(step).custom_metadata or {}
            saved, dtypes = metadata.get("paths"), metadata.get("dtypes")
            dtypes = dtypes if isinstance(dtypes, dict) else {}
            break
        except Exception as error:  # noqa: BLE001  (a corrupted checkpoint: any error reading it)
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            log.warning("skipping the checkpoint %s: it cannot be read (%s: %s)",
                        os.path.join(directory, str(step)), type(error).__name__, reason)
    else:
        raise ValueError(f"resume_from: no checkpoint in {directory} can be read (steps "
                         f"{', '.join(map(str, steps))})")
    # A checkpoint written before the paths were stored has none: its leaves are read by position, as then
    # (it holds no zero-size leaf either: Orbax refused those).
    if saved is not None and not (isinstance(saved, list) and all(isinstance(path, str) for path in saved)):
        raise ValueError(f"resume_from: the checkpoint of step {step} in {directory} has malformed metadata: its "
                         f"key paths are {str(saved)[:80]}, not a list of strings")
    count = len(item) if saved is None else len(saved)
    if count != len(like):
        raise ValueError(f"resume_from: the checkpoint of step {step} in {directory} holds {count} arrays, "
                         f"the state {len(like)}")
    for i, (theirs, ours) in enumerate(zip(saved or (), paths)):
        if theirs != ours:
            raise ValueError(f"resume_from: the checkpoint of step {step} in {directory} holds a state of another "
                             f"structure: its array {i} is {theirs}, the state's {ours}")
    leaves = []
    for i, x in enumerate(like):
        shape, dtype = shape_dtype(x)
        leaf = np.asarray(item[_key(i)]) if _key(i) in item else np.zeros(shape, dtype) if 0 in shape else None
        if leaf is not None and _key(i) in dtypes:
            leaf = _from_bytes(leaf, dtypes[_key(i)])
        if leaf is None or leaf.shape != shape or leaf.dtype != dtype:
            found = "a zero-size array" if leaf is None else f"{leaf.dtype}{list(leaf.shape)}"
            raise ValueError(f"resume_from: array {i} of the checkpoint of step {step} in {directory} is "
                             f"{found}, the state's {dtype}{list(shape)}")
        leaves.append(leaf)
    log.info("resuming from the checkpoint of step %d in %s (read in %.2f s)", step, directory,
             time.perf_counter() - began)
    return step, leaves


def shape_dtype(leaf) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of a state leaf (an array, a handle or a Python number) as a host snapshot holds
    it (typed PRNG keys as their key data), without reading it; a Python number's is the one JAX traces it
    with (float32 for a float unless `jax_enable_x64`), as the step returns it."""
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        if is_extended(leaf.dtype):
            data = wire_aval(jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
            return tuple(data.shape), np.dtype(data.dtype)
        return tuple(leaf.shape), np.dtype(leaf.dtype)
    aval = aval_of(leaf)
    return tuple(aval.shape), np.dtype(aval.dtype)
