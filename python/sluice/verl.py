"""An adapter for verl's TransferQueue integration (docs/python.md).

verl (the RL post-training framework) reaches its TransferQueue through the
module-level key-value layer of the open-source TransferQueue: its trainer
registers prompts with ``kv_batch_put`` (typed tags such as ``{"is_prompt":
True, "status": "pending", "global_steps": 3}``), its agent loops write
trajectories with ``async_kv_batch_put`` and status tags with
``async_kv_put``, its replay buffer polls ``kv_list`` and reads with
``kv_batch_get``, and it frees rows with ``kv_clear``; batches travel as
``KVBatchMeta(partition_id, keys, tags)``. This module offers those calls, with
verl's argument names and value shapes, over Sluice's hub
(:mod:`sluice.transfer_queue`), so such code can run against a
``sluice_queue_server``. It follows verl's KV-based integration as of verl
commit 1dda039b (``verl/trainer/ppo/v1``, ``verl/utils/transferqueue_utils.py``,
``verl/utils/tensordict_utils.py``); verl itself is not a dependency.

What is converted:

* Tags: verl's tag values are ``str``, ``int``, ``float``, ``bool`` or
  ``None``; Sluice's tags map ``str`` to ``str``. Each value is stored as its
  JSON text and read back with its type (a tag written by another client
  whose text is not JSON reads back as that ``str``).
* Fields: a ``dict`` or a TensorDict-like mapping (``keys()`` and
  ``[name]``) of name -> a tensor whose first dimension is the batch, a
  nested tensor or a list of tensors (variable length: one tensor per key), a
  list of ``str``, or a NonTensorStack-like object of ``str`` (``tolist()``).
  Other Python objects are refused with ``TypeError`` naming the field.
* Reads return a ``dict``: fixed-shape columns as one tensor, variable-length
  columns as a nested tensor (``layout=torch.jagged`` where this torch has it,
  as verl's ``list_of_dict_to_tensordict`` makes them; a list of tensors with
  ``ragged="list"``), strings as a list.

Not covered: TransferQueue's BatchMeta-based ``tqbridge`` of verl's older
integration (use :mod:`sluice.transfer_queue`'s ``get_meta`` / ``put`` /
``get_data``), ``save_checkpoint`` / ``load_checkpoint`` and the metrics
server. ``kv_list()`` without a partition lists the partitions this process
has used through this module (the hub does not list partitions).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch

from . import transfer_queue as _tq

_TAG_TYPES = (str, int, float, bool, type(None))


@dataclasses.dataclass
class KVBatchMeta:
    """A batch as verl passes it between workers: the keys of one partition
    and their tags (one dict per key)."""

    partition_id: str
    keys: List[str]
    tags: List[Dict[str, Any]] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.tags and len(self.tags) != len(self.keys):
            raise ValueError(f"KVBatchMeta: {len(self.keys)} keys but {len(self.tags)} tag dicts")

    @property
    def size(self) -> int:
        return len(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


# ---------------------------------------------------------------- conversions


def _encode_tags(where: str, tag: Any) -> Dict[str, str]:
    if not isinstance(tag, Mapping):
        raise TypeError(f"{where}: a tag must be a dict, not {type(tag).__name__}")
    out = {}
    for k, v in tag.items():
        if not isinstance(k, str):
            raise TypeError(f"{where}: tag names are str, not {type(k).__name__} ({k!r})")
        if not isinstance(v, _TAG_TYPES):
            raise TypeError(f"{where}: tag {k!r}: a str, int, float, bool or None, not {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{where}: tag {k!r}: {v} is not a finite number")
        out[k] = json.dumps(v)
    return out


def _decode_tag_value(text: str) -> Any:
    try:
        v = json.loads(text)
    except ValueError:
        return text
    return v if isinstance(v, _TAG_TYPES) else text


def _decode_tags(tags: Mapping[str, str]) -> Dict[str, Any]:
    return {k: _decode_tag_value(v) for k, v in tags.items()}


def _column(name: str, value: Any, rows: int) -> Any:
    """One field of a batch of `rows` keys, as sluice.transfer_queue takes it."""
    if isinstance(value, torch.Tensor):
        if getattr(value, "is_nested", False):
            parts = list(value.unbind())
        else:
            if value.dim() == 0 or value.shape[0] != rows:
                raise ValueError(f"field {name!r}: a tensor's first dimension must be the batch ({rows} keys), "
                                 f"got shape {tuple(value.shape)}")
            return value
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    elif hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # a NonTensorStack
        parts = list(value.tolist())
    else:
        raise TypeError(f"field {name!r}: a tensor, a nested tensor, a list of tensors or of str, "
                        f"not {type(value).__name__}")
    if len(parts) != rows:
        raise ValueError(f"field {name!r}: {len(parts)} values for {rows} keys")
    if all(isinstance(p, str) for p in parts):
        return parts
    if all(isinstance(p, torch.Tensor) for p in parts):
        return parts
    odd = [p for p in parts if not isinstance(p, (str, torch.Tensor))]
    if odd:
        raise TypeError(f"field {name!r}: a {type(odd[0]).__name__} value: fields hold tensors or str "
                        f"(other Python objects cannot be stored in the hub)")
    raise TypeError(f"field {name!r}: values must be all tensors or all str, not a mix")


def _fields(fields: Any, rows: int) -> Dict[str, Any]:
    if isinstance(fields, Mapping):
        names = list(fields.keys())
    elif hasattr(fields, "keys") and hasattr(fields, "__getitem__"):  # a TensorDict
        names = list(fields.keys())
    else:
        raise TypeError(f"fields must be a dict or a TensorDict, not {type(fields).__name__}")
    out = {}
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"field names are str, not {type(name).__name__} ({name!r})")
        out[name] = _column(name, fields[name], rows)
    return out


def _nested(parts: List[torch.Tensor]) -> torch.Tensor:
    jagged = getattr(torch, "jagged", None)
    if jagged is not None:
        return torch.nested.as_nested_tensor(parts, layout=jagged)
    return torch.nested.nested_tensor(parts)


# ---------------------------------------------------------------- the module-level API

_known_lock = threading.Lock()
_known_partitions: Dict[str, None] = {}  # insertion-ordered


def _used(partition_id: str) -> None:
    with _known_lock:
        _known_partitions.setdefault(partition_id, None)


def init(conf: Optional[Mapping[str, Any]] = None) -> _tq.Client:
    """Makes (or returns) this process's client: ``sluice.transfer_queue.init``
    (``conf``: ``endpoint`` of a ``sluice_queue_server``, ``token`` / ``token_file``,
    ``shm``, ``rpc_timeout``; without ``endpoint``, a hub in this process)."""
    return _tq.init(conf)


def get_client() -> _tq.Client:
    return _tq.get_client()


def close() -> None:
    _tq.close()
    with _known_lock:
        _known_partitions.clear()


def kv_put(key: str, partition_id: str, fields: Any = None, tag: Optional[Mapping[str, Any]] = None) -> None:
    """Writes one key: ``fields`` maps name -> that key's value (a tensor, the
    row itself, or a str); ``tag`` is merged into the key's tags."""
    if fields is not None and not isinstance(fields, Mapping):
        if not (hasattr(fields, "keys") and hasattr(fields, "__getitem__")):
            raise TypeError(f"fields must be a dict or a TensorDict, not {type(fields).__name__}")
        fields = {name: fields[name] for name in list(fields.keys())}
    wire_tag = None if tag is None else _encode_tags("tag", tag)
    _tq.get_client().kv_put(key, partition_id, fields, wire_tag)
    _used(partition_id)


def kv_batch_put(keys: Sequence[str], partition_id: str, fields: Any = None,
                 tags: Optional[Sequence[Mapping[str, Any]]] = None) -> KVBatchMeta:
    """Writes several keys, all or nothing (verl's ``kv_batch_put``). Returns
    the batch's :class:`KVBatchMeta`."""
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(f"keys must be a list of str, not {type(keys).__name__}")
    keys = list(keys)
    wire_fields = None if fields is None else _fields(fields, len(keys))
    wire_tags = None
    if tags is not None:
        if isinstance(tags, Mapping) or not isinstance(tags, Sequence):
            raise TypeError(f"tags must be a list with one dict per key, not {type(tags).__name__}")
        if len(tags) != len(keys):
            raise ValueError(f"{len(tags)} tag dicts for {len(keys)} keys")
        wire_tags = [_encode_tags(f"tags[{i}]", t) for i, t in enumerate(tags)]
    _tq.get_client().kv_batch_put(keys, partition_id, wire_fields, wire_tags)
    _used(partition_id)
    return KVBatchMeta(partition_id, keys, [dict(t) for t in tags] if tags is not None else [])


def kv_batch_get(keys: Union[str, Sequence[str]], partition_id: str,
                 select_fields: Union[str, Sequence[str], None] = None, *, ragged: str = "nested") -> Dict[str, Any]:
    """The fields of ``keys`` in their order: fixed-shape fields as one tensor,
    variable-length ones as a nested tensor (``ragged="list"``: a list of
    tensors), strings as a list of str."""
    if ragged not in ("nested", "list"):
        raise ValueError(f"ragged must be 'nested' or 'list', not {ragged!r}")
    got = _tq.get_client().kv_batch_get(keys, partition_id, select_fields)
    _used(partition_id)
    if ragged == "nested":
        for name, v in got.items():
            if isinstance(v, list) and v and all(isinstance(p, torch.Tensor) for p in v):
                got[name] = _nested(v)
    return got


def kv_list(partition_id: Optional[str] = None) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """``{partition_id: {key: tags}}`` with the tags' types restored. Without
    ``partition_id``: every partition this process has used through this
    module."""
    client = _tq.get_client()
    if partition_id is None:
        with _known_lock:
            partitions = list(_known_partitions)
    else:
        partitions = [partition_id]
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for pid in partitions:
        listed = client.kv_list(pid)[pid]
        out[pid] = {key: _decode_tags(tags) for key, tags in listed.items()}
    return out


def kv_clear(keys: Union[str, Sequence[str], None] = None, partition_id: Optional[str] = None) -> int:
    """Frees ``keys`` of ``partition_id`` (verl passes both by name); without
    keys, every key of the partition. Returns the rows cleared."""
    if partition_id is None:
        raise TypeError("kv_clear needs partition_id")
    client = _tq.get_client()
    if keys is None:
        keys = list(client.kv_list(partition_id)[partition_id])
        if not keys:
            return 0
    return client.kv_clear(keys, partition_id)


# Asynchronous forms, as verl's agent loops call them: the same calls on the
# event loop's default executor (the hub client releases the GIL while it
# waits on the hub).
async def _in_thread(fn, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))


async def async_kv_put(key: str, partition_id: str, fields: Any = None,
                       tag: Optional[Mapping[str, Any]] = None) -> None:
    return await _in_thread(kv_put, key, partition_id, fields, tag)


async def async_kv_batch_put(keys: Sequence[str], partition_id: str, fields: Any = None,
                             tags: Optional[Sequence[Mapping[str, Any]]] = None) -> KVBatchMeta:
    return await _in_thread(kv_batch_put, keys, partition_id, fields, tags)


async def async_kv_batch_get(keys: Union[str, Sequence[str]], partition_id: str,
                             select_fields: Union[str, Sequence[str], None] = None, *,
                             ragged: str = "nested") -> Dict[str, Any]:
    return await _in_thread(kv_batch_get, keys, partition_id, select_fields, ragged=ragged)


async def async_kv_list(partition_id: Optional[str] = None) -> Dict[str, Dict[str, Dict[str, Any]]]:
    return await _in_thread(kv_list, partition_id)


async def async_kv_clear(keys: Union[str, Sequence[str], None] = None, partition_id: Optional[str] = None) -> int:
    return await _in_thread(kv_clear, keys, partition_id)


__all__ = [
    "KVBatchMeta",
    "async_kv_batch_get",
    "async_kv_batch_put",
    "async_kv_clear",
    "async_kv_list",
    "async_kv_put",
    "close",
    "get_client",
    "init",
    "kv_batch_get",
    "kv_batch_put",
    "kv_clear",
    "kv_list",
    "kv_put",
]
