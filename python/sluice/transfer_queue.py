"""A Python client of the TransferQueue, Sluice's streaming data hub.

The API follows the open-source TransferQueue's (``get_meta`` / ``put`` /
``get_data`` / ``clear_partition``, the ``kv_*`` layer, ``init`` /
``close``), over Sluice's hub: columns with schemas, partitions, consumer
tasks, and leases that are acknowledged. docs/python.md has the guide and
every difference from TransferQueue; in short:

* Data is a plain ``dict``: column name -> a ``torch.Tensor`` whose first
  dimension is the batch (a fixed-shape column), a list of tensors (a
  variable-length column: one tensor per row, lengths may differ) or a list
  of ``str`` (a string column).
* Consumption is exactly once per task through leases: ``get_meta`` leases
  rows to the caller, who ``ack``\\ s them once done. Rows of a lease that is
  neither acked nor released before its deadline go back to the task (a
  consumer that died loses nothing).
* Errors from the hub raise :class:`sluice.errors.Error` subclasses (code and
  message of the C++ status); caller mistakes caught here raise ``TypeError``
  or ``ValueError``, before anything reaches the hub.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import threading
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import _C, _dtypes, errors
from .errors import Error

_impl = _C.transfer_queue

# A string column `x` is the hub column `x` (uint8, one ragged dimension:
# its UTF-8 bytes) plus a registered marker column named
# STRING_MARKER_PREFIX + "x" that is never written. Any client learns which
# columns hold strings from the hub's schema list (Describe).
STRING_MARKER_PREFIX = "sluice.str:"

_MAX_NAME_BYTES = 256
_MAX_TENSOR_DIMS = 16
_MAX_USER_TAG_BYTES = 4096

_DTYPE_NAMES = _dtypes.DTYPE_NAMES
_DTYPES_BY_NAME = _dtypes.DTYPES_BY_NAME

#: The torch dtypes a column may have.
SUPPORTED_DTYPES = tuple(_DTYPE_NAMES)

# ---------------------------------------------------------------- value types


@dataclasses.dataclass(frozen=True)
class ColumnSchema:
    """A column's schema: dtype and per-row shape.

    ``shape`` is the shape of one row's tensor (without the batch dimension);
    its first entry may be ``None``: any length per row (a variable-length
    column). ``()`` is one scalar per row. ``string=True`` marks a string
    column (dtype ``torch.uint8``, shape ``(None,)``: UTF-8 bytes).
    """

    name: str
    dtype: torch.dtype
    shape: Tuple[Optional[int], ...]
    string: bool = False

    def __post_init__(self):
        _check_name("column", self.name)
        if self.name.startswith(STRING_MARKER_PREFIX):
            raise ValueError(f"column names starting with {STRING_MARKER_PREFIX!r} are reserved")
        if self.dtype not in _DTYPE_NAMES:
            raise TypeError(f"column {self.name!r}: dtype {self.dtype} is not supported ({_dtype_list()})")
        if isinstance(self.shape, (str, bytes)) or not isinstance(self.shape, Iterable):
            raise TypeError(f"column {self.name!r}: shape must be a tuple of ints (first may be None)")
        shape = tuple(self.shape)
        if len(shape) > _MAX_TENSOR_DIMS:
            raise ValueError(f"column {self.name!r}: more than {_MAX_TENSOR_DIMS} dimensions")
        for i, d in enumerate(shape):
            if d is None and i == 0:
                continue
            if isinstance(d, bool) or not isinstance(d, int):
                raise TypeError(
                    f"column {self.name!r}: shape {shape}: dimensions are ints (the first may be None: any length)"
                )
            if d < 0:
                raise ValueError(f"column {self.name!r}: shape {shape} has a negative dimension")
        object.__setattr__(self, "shape", shape)
        if self.string:
            if self.dtype != torch.uint8 or shape != (None,):
                raise ValueError(f"column {self.name!r}: a string column is uint8 with shape (None,)")
            if len((STRING_MARKER_PREFIX + self.name).encode()) > _MAX_NAME_BYTES:
                raise ValueError(
                    f"string column {self.name!r}: the name is too long for its marker "
                    f"({_MAX_NAME_BYTES - len(STRING_MARKER_PREFIX)} bytes at most)"
                )

    @staticmethod
    def strings(name: str) -> "ColumnSchema":
        """The schema of a string column."""
        return ColumnSchema(name, torch.uint8, (None,), string=True)

    @property
    def ragged(self) -> bool:
        """True for a variable-length column (first dimension any length)."""
        return len(self.shape) > 0 and self.shape[0] is None

    def _wire(self) -> tuple:
        return (self.name, _DTYPE_NAMES[self.dtype], [-1 if d is None else d for d in self.shape])


@dataclasses.dataclass(frozen=True)
class RowTags:
    """The tags of a row: GRPO group id, the policy version that produced it,
    its token length (the weight of token-balanced splits) and free-form
    string tags. -1 means "none" for group_id and policy_version."""

    group_id: int = -1
    policy_version: int = -1
    token_length: int = 0
    user: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class BatchMeta:
    """A batch of rows: what ``get_meta`` leases and ``put`` writes.

    ``global_indexes`` are the hub's row ids (unique for the hub's life,
    never reused). A batch from ``get_meta`` holds a lease (``lease_id`` > 0,
    ``task_name``, ``deadline`` on the ``time.monotonic()`` clock): ``ack`` it
    once consumed, or ``release`` it. A batch from ``put`` holds none.
    ``ranks[i]`` is row i's data-parallel rank when ``dp_ranks`` > 1.
    Picklable: a lease may be acked from another process of the same hub.
    """

    global_indexes: Tuple[int, ...]
    partition_id: str
    fields: Tuple[str, ...]
    task_name: Optional[str] = None
    lease_id: int = 0
    deadline: Optional[float] = None
    tags: Tuple[RowTags, ...] = ()
    ranks: Tuple[int, ...] = ()
    dp_ranks: int = 1

    @property
    def size(self) -> int:
        return len(self.global_indexes)

    def __len__(self) -> int:
        return len(self.global_indexes)

    @property
    def field_names(self) -> List[str]:
        """The fields, sorted (as TransferQueue's BatchMeta.field_names)."""
        return sorted(self.fields)

    @property
    def partition_ids(self) -> List[str]:
        """One partition id per row (as TransferQueue's BatchMeta)."""
        return [self.partition_id] * len(self.global_indexes)

    @property
    def leased(self) -> bool:
        return self.lease_id != 0

    def time_left(self) -> Optional[float]:
        """Seconds until the lease expires (negative: expired); None without a lease."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def rows_of_rank(self, rank: int) -> List[int]:
        """Positions (into global_indexes) of the rows of data-parallel rank `rank`."""
        if self.dp_ranks <= 1:
            return list(range(len(self.global_indexes)))
        return [i for i, r in enumerate(self.ranks) if r == rank]


@dataclasses.dataclass(frozen=True)
class KVEntry:
    """A key of the key-value view: its row id, tags and written fields."""

    key: str
    global_index: int
    tags: RowTags
    fields: Tuple[str, ...]


# ---------------------------------------------------------------- checks


def _dtype_list() -> str:
    return _dtypes.dtype_list()


def _check_name(what: str, name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError(f"{what} name is empty")
    if len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES:
        raise ValueError(f"{what} name {name[:40]!r}... is longer than {_MAX_NAME_BYTES} bytes")
    return name


def _check_int(what: str, v: Any, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(v).__name__}") from None
    if lo is not None and i < lo:
        raise ValueError(f"{what} must be >= {lo}, not {i}")
    if hi is not None and i > hi:
        raise ValueError(f"{what} must be <= {hi}, not {i}")
    return i


_I64 = (-(2**63), 2**63 - 1)


def _check_seconds(what: str, v: Any, allow_zero: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f) or f < 0 or (f == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'} and finite, not {v}")
    if f > 7 * 24 * 3600 * 52:
        raise ValueError(f"{what} of {v} s is too long")
    return f


def _ms(seconds: float) -> int:
    return int(math.ceil(seconds * 1000.0))


def _names(what: str, v: Any, allow_empty: bool = False) -> List[str]:
    """A str or a sequence of distinct str."""
    if isinstance(v, str):
        v = [v]
    if isinstance(v, (bytes, Mapping)) or not isinstance(v, Iterable):
        raise TypeError(f"{what} must be a str or a list of str, not {type(v).__name__}")
    out = [_check_name(what.rstrip("s"), x) for x in v]
    if not out and not allow_empty:
        raise ValueError(f"{what} is empty")
    seen = set()
    for x in out:
        if x in seen:
            raise ValueError(f"{what}: {x!r} is listed twice")
        seen.add(x)
    return out


def _user_tags(where: str, tags: Any) -> Dict[str, str]:
    if not isinstance(tags, Mapping):
        raise TypeError(f"{where}: tags must be a dict of str -> str, not {type(tags).__name__}")
    out = {}
    for k, v in tags.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(
                f"{where}: tag {k!r}: tags map str to str (got {type(k).__name__} -> {type(v).__name__}); "
                "convert other values to str yourself"
            )
        if not k or len(k.encode()) > _MAX_NAME_BYTES:
            raise ValueError(f"{where}: tag name {k[:40]!r} must be 1..{_MAX_NAME_BYTES} bytes")
        if len(v.encode()) > _MAX_USER_TAG_BYTES:
            raise ValueError(f"{where}: tag {k!r} is longer than {_MAX_USER_TAG_BYTES} bytes")
        out[k] = v
    if len(out) > 64:
        raise ValueError(f"{where}: {len(out)} tags, at most 64")
    return out


def _per_row(what: str, v: Any, n: int) -> list:
    if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Sequence):
        raise TypeError(f"{what} must be a list with one entry per row, not {type(v).__name__}")
    if len(v) != n:
        raise ValueError(f"{what} has {len(v)} entries for {n} rows")
    return list(v)


# ---------------------------------------------------------------- columns in


class _Column:
    """One column of a put, checked and normalized."""

    __slots__ = ("name", "kind", "value", "rows", "inferred")

    def __init__(self, name: str, kind: str, value: Any, rows: int, inferred: ColumnSchema):
        self.name = name
        self.kind = kind  # "tensor" | "tensors" | "strings"
        self.value = value
        self.rows = rows
        self.inferred = inferred


def _check_tensor(where: str, t: torch.Tensor) -> torch.Tensor:
    if t.layout != torch.strided or getattr(t, "is_nested", False):
        raise TypeError(f"{where}: only dense (strided) tensors, not {t.layout}; pass a list of tensors instead")
    if t.device.type != "cpu":
        raise ValueError(f"{where}: tensor is on {t.device}; the hub stores host memory: pass tensor.cpu()")
    if t.dtype not in _DTYPE_NAMES:
        raise TypeError(f"{where}: dtype {t.dtype} is not supported ({_dtype_list()})")
    if t.dim() > _MAX_TENSOR_DIMS + 1:
        raise ValueError(f"{where}: more than {_MAX_TENSOR_DIMS} dimensions per row")
    if not t.is_contiguous():
        t = t.contiguous()  # one copy: the hub stores row-major bytes
    return t.detach()


def _parse_column(name: Any, value: Any) -> _Column:
    _check_name("column", name)
    if name.startswith(STRING_MARKER_PREFIX):
        raise ValueError(f"column {name!r}: names starting with {STRING_MARKER_PREFIX!r} are reserved")
    where = f"column {name!r}"
    if isinstance(value, torch.Tensor):
        t = _check_tensor(where, value)
        if t.dim() < 1:
            raise ValueError(f"{where}: a 0-d tensor has no batch dimension (give a [batch, ...] tensor)")
        if t.shape[0] == 0:
            raise ValueError(f"{where}: no rows (the batch dimension is 0)")
        return _Column(name, "tensor", t, t.shape[0], ColumnSchema(name, t.dtype, tuple(t.shape[1:])))
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{where}: no rows (an empty list)")
        if all(isinstance(x, str) for x in value):
            return _Column(name, "strings", list(value), len(value), ColumnSchema.strings(name))
        if all(isinstance(x, torch.Tensor) for x in value):
            rows = [_check_tensor(f"{where}, row {i}", x) for i, x in enumerate(value)]
            first = rows[0]
            for i, t in enumerate(rows):
                if t.dtype != first.dtype:
                    raise ValueError(f"{where}: row {i} is {t.dtype}, row 0 is {first.dtype}")
            if first.dim() >= 1 and all(t.dim() == first.dim() and t.shape[1:] == first.shape[1:] for t in rows):
                inferred = ColumnSchema(name, first.dtype, (None,) + tuple(first.shape[1:]))
            elif all(t.shape == first.shape for t in rows):
                inferred = ColumnSchema(name, first.dtype, tuple(first.shape))
            else:
                raise ValueError(
                    f"{where}: the rows' shapes {[tuple(t.shape) for t in rows[:4]]}... differ beyond the first "
                    "dimension (only the first dimension of a variable-length column may vary)"
                )
            return _Column(name, "tensors", rows, len(rows), inferred)
        kinds = sorted({type(x).__name__ for x in value})
        raise TypeError(f"{where}: a list must hold only tensors or only str, not {', '.join(kinds)}")
    raise TypeError(
        f"{where}: expected a torch.Tensor [batch, ...], a list of tensors or a list of str, "
        f"not {type(value).__name__}"
    )


def _shape_str(shape: Sequence[Optional[int]]) -> str:
    return "(" + ", ".join("*" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _row_fits(schema: ColumnSchema, shape: Tuple[int, ...]) -> bool:
    if schema.ragged:
        return len(shape) == len(schema.shape) and tuple(shape[1:]) == schema.shape[1:]
    return tuple(shape) == schema.shape


def _check_against(col: _Column, schema: ColumnSchema) -> None:
    where = f"column {col.name!r}"
    if schema.string:
        if col.kind != "strings":
            raise TypeError(f"{where} is a string column: give a list of str")
        return
    if col.kind == "strings":
        raise TypeError(
            f"{where} is registered as {schema.dtype} {_shape_str(schema.shape)}, not as a string column: "
            "give tensors"
        )
    dtype = col.value.dtype if col.kind == "tensor" else col.value[0].dtype
    if dtype != schema.dtype:
        raise ValueError(f"{where}: dtype {dtype}, the column is {schema.dtype}")
    if col.kind == "tensor":
        row_shape = tuple(col.value.shape[1:])
        if not _row_fits(schema, row_shape):
            raise ValueError(
                f"{where}: rows of shape {tuple(row_shape)}, the column's per-row shape is {_shape_str(schema.shape)}"
            )
    else:
        for i, t in enumerate(col.value):
            if not _row_fits(schema, tuple(t.shape)):
                raise ValueError(
                    f"{where}, row {i}: shape {tuple(t.shape)}, the column's per-row shape is "
                    f"{_shape_str(schema.shape)}"
                )


def _to_wire(col: _Column) -> tuple:
    if col.kind == "tensor":
        return ("tensor", col.value)
    if col.kind == "tensors":
        return ("tensors", col.value)
    parts = []
    for i, s in enumerate(col.value):
        try:
            parts.append(s.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise ValueError(f"column {col.name!r}, row {i}: not encodable as UTF-8 ({e.reason})") from None
    return ("utf8", b"".join(parts), [len(p) for p in parts])


def _tags_tuple(t: RowTags) -> tuple:
    return (t.group_id, t.policy_version, t.token_length, dict(t.user))


def _row_tags(raw: tuple) -> RowTags:
    return RowTags(group_id=raw[0], policy_version=raw[1], token_length=raw[2], user=dict(raw[3]))


def _parse_sampling(config: Optional[Mapping[str, Any]]) -> tuple:
    mode, group_size, lo, hi, dp_ranks = "fifo", 0, _I64[0], _I64[1], 1
    if config is None:
        return (mode, group_size, lo, hi, dp_ranks)
    if not isinstance(config, Mapping):
        raise TypeError(f"sampling_config must be a dict, not {type(config).__name__}")
    allowed = {"mode", "group_size", "n_samples_per_prompt", "min_policy_version", "max_policy_version", "dp_ranks"}
    for k in config:
        if k not in allowed:
            raise ValueError(f"sampling_config: unknown key {k!r} (known: {', '.join(sorted(allowed))})")
    if "group_size" in config and "n_samples_per_prompt" in config:
        raise ValueError("sampling_config: give group_size or n_samples_per_prompt, not both")
    g = config.get("group_size", config.get("n_samples_per_prompt"))
    if g is not None:
        group_size = _check_int("sampling_config group size", g, 1, 2**32 - 1)
        mode = "whole_group"
    if "mode" in config:
        mode = config["mode"]
        if mode not in ("fifo", "whole_group"):
            raise ValueError(f"sampling_config mode must be 'fifo' or 'whole_group', not {mode!r}")
    if "min_policy_version" in config:
        lo = _check_int("sampling_config min_policy_version", config["min_policy_version"], *_I64)
    if "max_policy_version" in config:
        hi = _check_int("sampling_config max_policy_version", config["max_policy_version"], *_I64)
    if "dp_ranks" in config:
        dp_ranks = _check_int("sampling_config dp_ranks", config["dp_ranks"], 1, 2**32 - 1)
    return (mode, group_size, lo, hi, dp_ranks)


def _partition_missing(e: Error) -> bool:
    return isinstance(e, errors.NotFound) and (
        "unknown partition" in e.message or "was cleared while waiting" in e.message
    )


# ---------------------------------------------------------------- the client


class Client:
    """A connection to a TransferQueue hub. Thread-safe; make one with
    :func:`connect` (a ``sluice_queue_server``) or :func:`start_hub` (a hub in
    this process)."""

    def __init__(self, impl: Any):
        self._impl = impl
        self._lock = threading.Lock()
        self._schemas: Dict[str, ColumnSchema] = {}
        self._tasks: set = set()
        self._partitions: set = set()
        self._closed = False

    # -- connection

    @property
    def transport(self) -> str:
        """"shm" (same-host shared-memory data plane), "tcp" or "in_process"."""
        return self._impl.transport

    @property
    def endpoint(self) -> Optional[str]:
        return self._impl.endpoint or None

    @property
    def shm_segment(self) -> Optional[str]:
        """The shared-memory arena's name when payloads go through it."""
        return self._impl.shm_segment or None

    def close(self) -> None:
        """Stops this client: later calls raise ``errors.Aborted``, and calls
        blocked in ``get_meta`` return with it. Tensors already read stay
        valid. For a hub started in this process, closes the hub. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._impl.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.Aborted("the TransferQueue client is closed")

    # -- schema

    def _refresh(self) -> None:
        raw_columns, tasks = self._impl.describe()
        schemas, strings = {}, set()
        for name, dtype, shape in raw_columns:
            if name.startswith(STRING_MARKER_PREFIX):
                strings.add(name[len(STRING_MARKER_PREFIX) :])
                continue
            schemas[name] = (_DTYPES_BY_NAME[dtype], tuple(None if d == -1 else d for d in shape))
        out = {}
        for name, (dtype, shape) in schemas.items():
            is_str = name in strings and dtype == torch.uint8 and shape == (None,)
            out[name] = ColumnSchema(name, dtype, shape, string=is_str)
        with self._lock:
            self._schemas = out
            self._tasks = set(tasks)

    def _schema(self, name: str) -> Optional[ColumnSchema]:
        with self._lock:
            s = self._schemas.get(name)
        if s is None:
            self._refresh()
            with self._lock:
                s = self._schemas.get(name)
        return s

    def describe(self) -> Dict[str, ColumnSchema]:
        """The hub's columns by name, in registration order."""
        self._check_open()
        self._refresh()
        with self._lock:
            return dict(self._schemas)

    def tasks(self) -> List[str]:
        """The hub's registered consumer tasks."""
        self._check_open()
        self._refresh()
        with self._lock:
            return sorted(self._tasks)

    def register_columns(self, schemas: Iterable[ColumnSchema]) -> None:
        """Registers columns (all or none). Registering an identical schema
        again is a no-op; another schema under a registered name is
        ``errors.InvalidArgument``. ``put`` registers unknown columns itself
        (inferred from the data), so this is needed only to fix a schema in
        advance (e.g. a variable-length column whose first batch happens to
        have equal lengths)."""
        self._check_open()
        schemas = list(schemas)
        for s in schemas:
            if not isinstance(s, ColumnSchema):
                raise TypeError(f"register_columns takes ColumnSchema values, not {type(s).__name__}")
        self._register(schemas)

    def register_column(self, name: str, dtype: Optional[torch.dtype] = None, shape: Sequence[Optional[int]] = (),
                        *, string: bool = False) -> ColumnSchema:
        """Registers one column: ``register_column("reward", torch.float32)``,
        ``register_column("tokens", torch.int64, (None,))``, or a string column
        ``register_column("answer", string=True)`` (which also marks an
        existing uint8 column of shape (None,) as holding UTF-8 text)."""
        if string:
            if dtype not in (None, torch.uint8) or tuple(shape) not in ((), (None,)):
                raise ValueError(f"string column {name!r}: its dtype and shape are fixed (uint8, (None,))")
            schema = ColumnSchema.strings(name)
        else:
            if dtype is None:
                raise TypeError(f"register_column({name!r}): a dtype is needed (or string=True)")
            schema = ColumnSchema(name, dtype, tuple(shape))
        self.register_columns([schema])
        return schema

    def _register(self, schemas: List[ColumnSchema]) -> None:
        if not schemas:
            return
        wire = []
        for s in schemas:
            wire.append(s._wire())
            if s.string:
                wire.append((STRING_MARKER_PREFIX + s.name, "U8", []))
        self._impl.register_columns(wire)
        self._refresh()

    def register_task(self, task: str) -> None:
        """Registers a consumer task. ``get_meta`` registers its task itself;
        register every consumer task up front when rows may be acked by one
        task before another first asks: a row is freed once every task
        registered at the time has acked it."""
        self._check_open()
        _check_name("task", task)
        self._impl.register_task(task)
        with self._lock:
            self._tasks.add(task)

    def create_partition(self, partition_id: str, group_size: int = 0,
                         consumers: Optional[Sequence[str]] = None) -> bool:
        """Creates a partition; True if created, False if it existed with the
        same group size (``errors.AlreadyExists`` with another). ``put`` and
        ``kv_*put`` create missing partitions themselves (group size 0); create
        one explicitly to declare a GRPO group size or to restrict it to some
        consumer tasks (registered, e.g. with ``register_task``)."""
        self._check_open()
        _check_name("partition", partition_id)
        group_size = _check_int("group_size", group_size, 0, 2**32 - 1)
        consumers = [] if consumers is None else _names("consumers", consumers, allow_empty=True)
        created = self._impl.create_partition(partition_id, group_size, consumers)
        with self._lock:
            self._partitions.add(partition_id)
        return created

    def _ensure_partition(self, partition_id: str, force: bool = False) -> None:
        with self._lock:
            if partition_id in self._partitions and not force:
                return
        try:
            self._impl.create_partition(partition_id, 0, [])
        except errors.AlreadyExists:
            pass  # it exists, with a group size
        with self._lock:
            self._partitions.add(partition_id)

    def _prepare(self, data: Any, rows: Optional[int]) -> Tuple[int, Dict[str, tuple], List[str], List[ColumnSchema]]:
        """Checks `data` against the hub's schemas and returns (batch size,
        wire columns, names, schemas to register: the unknown columns',
        inferred from the data). Changes nothing on the hub."""
        if not isinstance(data, Mapping):
            raise TypeError(f"data must be a dict of column name -> values, not {type(data).__name__}")
        if not data:
            raise ValueError("data has no columns")
        cols = [_parse_column(name, value) for name, value in data.items()]
        sizes = {c.name: c.rows for c in cols}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"the columns' batch sizes disagree: {sizes}")
        n = cols[0].rows
        if rows is not None and n != rows:
            raise ValueError(f"data has {n} rows, the batch has {rows}")
        new = []
        for c in cols:
            schema = self._schema(c.name)
            if schema is None:
                schema = c.inferred
                new.append(schema)
            _check_against(c, schema)
        wire = {c.name: _to_wire(c) for c in cols}  # may raise (text not encodable)
        return n, wire, [c.name for c in cols], new

    def _kinds(self, names: Iterable[str], stack: bool) -> Dict[str, str]:
        kinds = {}
        for name in names:
            s = self._schema(name)
            if s is None:
                continue
            kinds[name] = "str" if s.string else ("views" if s.ragged or not stack else "stack")
        return kinds

    def _finish(self, data: Dict[str, Any], kinds: Dict[str, str], stack: bool) -> Dict[str, Any]:
        """Converts columns the extension returned as raw views because their
        schema was not known yet (registered after the last refresh)."""
        for name in list(data):
            if name in kinds:
                continue
            kind = self._kinds([name], stack).get(name, "views")
            rows = data[name]
            if kind == "str":
                data[name] = [bytes(t.tolist()).decode("utf-8") for t in rows]
            elif kind == "stack":
                data[name] = torch.stack(rows)
        return data

    # -- producers

    def put(self, data: Mapping[str, Any], metadata: Optional[BatchMeta] = None,
            partition_id: Optional[str] = None, *, tags: Optional[Sequence[Mapping[str, str]]] = None,
            group_ids: Optional[Sequence[int]] = None, policy_versions: Union[int, Sequence[int], None] = None,
            token_lengths: Optional[Sequence[int]] = None) -> BatchMeta:
        """Writes a batch, all or nothing.

        Without ``metadata``: creates ``batch`` new rows in ``partition_id``
        (created if missing) with these columns. With a ``metadata`` (from
        ``get_meta`` or ``put``): writes new columns of its rows (each column
        of a row is written once). ``data`` maps column name to a tensor
        [batch, ...], a list of tensors (variable length) or a list of str.
        Tags: ``tags`` (one dict of str -> str per row), ``group_ids`` (new
        rows only), ``policy_versions`` (one int or one per row),
        ``token_lengths``; on existing rows they patch the rows' tags (user
        tags merged). Returns the rows' BatchMeta (for existing rows,
        ``metadata`` with the new fields; its lease, if any, is unchanged).
        """
        self._check_open()
        if metadata is not None and not isinstance(metadata, BatchMeta):
            raise TypeError(f"metadata must be a BatchMeta, not {type(metadata).__name__}")
        if metadata is None and partition_id is None:
            raise ValueError("put needs a partition_id (new rows) or a metadata (columns of existing rows)")
        if metadata is not None and partition_id is not None and partition_id != metadata.partition_id:
            raise ValueError(f"partition_id {partition_id!r} differs from the metadata's {metadata.partition_id!r}")
        if partition_id is not None:
            _check_name("partition", partition_id)
        if metadata is not None and metadata.size == 0:
            raise ValueError("metadata holds no rows")
        n, wire, names, new_columns = self._prepare(data, None if metadata is None else metadata.size)

        user = [None] * n if tags is None else [_user_tags(f"tags[{i}]", t) for i, t in
                                                 enumerate(_per_row("tags", tags, n))]
        versions = [None] * n
        if policy_versions is not None:
            if isinstance(policy_versions, Sequence) and not isinstance(policy_versions, (str, bytes)):
                versions = [_check_int(f"policy_versions[{i}]", v, *_I64)
                            for i, v in enumerate(_per_row("policy_versions", policy_versions, n))]
            else:
                versions = [_check_int("policy_versions", policy_versions, *_I64)] * n
        lengths = [None] * n
        if token_lengths is not None:
            lengths = [_check_int(f"token_lengths[{i}]", v, 0, _I64[1])
                       for i, v in enumerate(_per_row("token_lengths", token_lengths, n))]

        if metadata is None:
            groups = [-1] * n
            if group_ids is not None:
                groups = [_check_int(f"group_ids[{i}]", g, -1, _I64[1])
                          for i, g in enumerate(_per_row("group_ids", group_ids, n))]
            if group_ids is None and tags is None and policy_versions is None and token_lengths is None:
                row_tags = [RowTags()] * n  # one shared (frozen) value
                wire_tags = [_tags_tuple(row_tags[0])] * n
            else:
                row_tags = [RowTags(groups[i], -1 if versions[i] is None else versions[i],
                                    0 if lengths[i] is None else lengths[i], user[i] or {}) for i in range(n)]
                wire_tags = [_tags_tuple(t) for t in row_tags]
            self._register(new_columns)
            self._ensure_partition(partition_id)
            try:
                rows = self._impl.put_rows(partition_id, wire_tags, wire)
            except errors.NotFound as e:
                if not _partition_missing(e):
                    raise
                self._ensure_partition(partition_id, force=True)  # cleared meanwhile: create it again
                rows = self._impl.put_rows(partition_id, wire_tags, wire)
            return BatchMeta(global_indexes=tuple(rows), partition_id=partition_id, fields=tuple(names),
                             tags=tuple(row_tags))

        if group_ids is not None:
            raise ValueError("group_ids are fixed when rows are created; they cannot be given for existing rows")
        patches = []
        if tags is not None or policy_versions is not None or token_lengths is not None:
            patches = [(versions[i], lengths[i], user[i] or {}) for i in range(n)]
        self._register(new_columns)
        self._impl.put_columns(list(metadata.global_indexes), wire, patches)
        fields = tuple(metadata.fields) + tuple(x for x in names if x not in metadata.fields)
        return dataclasses.replace(metadata, fields=fields)

    # -- consumers

    def get_meta(self, data_fields: Union[str, Sequence[str]], batch_size: int, partition_id: str,
                 mode: str = "fetch", task_name: Optional[str] = None,
                 sampling_config: Optional[Mapping[str, Any]] = None, *, timeout: float = 0.0,
                 lease_timeout: Optional[float] = None, holder: str = "") -> BatchMeta:
        """Leases ``batch_size`` rows of ``partition_id`` whose ``data_fields``
        are all written and that task ``task_name`` has not consumed.

        Waits up to ``timeout`` seconds for that many rows (also for the
        partition to be created), then raises ``errors.Timeout`` (a
        ``TimeoutError``). ``lease_timeout``: seconds before the lease expires
        (default: the hub's). ``sampling_config``: ``mode`` ("fifo" or
        "whole_group"), ``group_size`` (alias ``n_samples_per_prompt``; implies
        whole groups), ``min_policy_version`` / ``max_policy_version``,
        ``dp_ranks`` (token-balanced split over data-parallel ranks).
        ``holder``: who holds the lease (e.g. ``f"worker-3/{os.getpid()}"``),
        so that a supervisor can ``release_holder`` it when that process dies.
        ``ack`` the batch once consumed (or ``release`` it).
        """
        if not isinstance(holder, str) or len(holder.encode()) > 256:
            raise ValueError("holder must be a str of at most 256 bytes")
        self._check_open()
        fields = _names("data_fields", data_fields)
        batch_size = _check_int("batch_size", batch_size, 1, 2**32 - 1)
        _check_name("partition", partition_id)
        if mode != "fetch":
            raise ValueError(
                f"mode {mode!r} is not supported: only 'fetch' (lease rows the task has not consumed); "
                "see docs/python.md"
            )
        if task_name is None:
            raise ValueError("get_meta needs a task_name (the consumer task the rows are leased to)")
        _check_name("task", task_name)
        policy = _parse_sampling(sampling_config)
        timeout = _check_seconds("timeout", timeout, allow_zero=True)
        lease_ms = 0 if lease_timeout is None else _ms(_check_seconds("lease_timeout", lease_timeout, False))
        for f in fields:
            if self._schema(f) is None:
                raise ValueError(f"unknown field {f!r}: no such column is registered")
        with self._lock:
            known = task_name in self._tasks
        if not known:
            self._impl.register_task(task_name)
            with self._lock:
                self._tasks.add(task_name)

        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                raw = self._impl.get_meta(task_name, fields, batch_size, partition_id, policy, _ms(left), lease_ms,
                                          holder)
                break
            except errors.NotFound as e:
                if not _partition_missing(e):
                    raise
                if time.monotonic() >= deadline:
                    if timeout == 0:
                        raise
                    raise errors.Timeout(
                        f"get_meta: partition {partition_id!r} does not exist (waited {timeout:g} s for it)"
                    ) from None
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                self._check_open()
        lease_id, task, partition, columns, rows, ranks, dp_ranks, deadline_s = raw
        return BatchMeta(
            global_indexes=tuple(r[0] for r in rows),
            partition_id=partition,
            fields=tuple(columns),
            task_name=task,
            lease_id=lease_id,
            deadline=deadline_s,
            tags=tuple(_row_tags(r[1]) for r in rows),
            ranks=tuple(ranks),
            dp_ranks=dp_ranks,
        )

    def get_data(self, metadata: BatchMeta, fields: Union[str, Sequence[str], None] = None, *,
                 stack: bool = True) -> Dict[str, Any]:
        """The batch's columns (``fields``: a subset of ``metadata.fields``;
        default all of them), rows in ``metadata.global_indexes`` order.

        A fixed-shape column is one new tensor [batch, ...] (a copy); with
        ``stack=False`` it is a list of per-row tensors instead. A
        variable-length column is a list of per-row tensors, and those lists
        are views of the hub's memory where it can be viewed (the
        shared-memory arena, the received message, an in-process hub's
        storage): treat them as read-only (``.clone()`` to modify). A string
        column is a list of str. Reading does not touch the lease.
        """
        self._check_open()
        if not isinstance(metadata, BatchMeta):
            raise TypeError(f"metadata must be a BatchMeta, not {type(metadata).__name__}")
        if metadata.size == 0:
            raise ValueError("metadata holds no rows")
        wanted = list(metadata.fields) if fields is None else _names("fields", fields)
        for f in wanted:
            if f not in metadata.fields:
                raise ValueError(f"field {f!r} is not in the batch (its fields: {', '.join(metadata.fields)})")
        kinds = self._kinds(wanted, stack)
        raw = self._impl.get_data(metadata.lease_id, list(metadata.global_indexes), list(metadata.fields), wanted,
                                  kinds)
        self._finish(raw, kinds, stack)
        return {f: raw[f] for f in wanted}

    @staticmethod
    def _lease_of(meta: Union[BatchMeta, int]) -> int:
        if isinstance(meta, BatchMeta):
            if meta.lease_id == 0:
                raise ValueError("this BatchMeta holds no lease (it came from put, not get_meta)")
            return meta.lease_id
        return _check_int("lease id", meta, 1, 2**64 - 1)

    def ack(self, metadata: Union[BatchMeta, int]) -> Dict[str, int]:
        """Finishes a lease: its rows are consumed by its task, for good.
        ``errors.FailedPrecondition`` if the lease expired (its rows went to
        another consumer), was acked or released; ``errors.NotFound`` for an
        unknown lease."""
        self._check_open()
        acked, cleared, freed = self._impl.ack(self._lease_of(metadata))
        return {"rows_acked": acked, "rows_cleared": cleared, "rows_freed": freed}

    def release(self, metadata: Union[BatchMeta, int]) -> Dict[str, int]:
        """Gives a lease's rows back to its task now (errors as ack)."""
        self._check_open()
        returned, cleared = self._impl.release(self._lease_of(metadata))
        return {"rows_returned": returned, "rows_cleared": cleared}

    def release_holder(self, holder: str) -> Dict[str, int]:
        """Gives every lease taken with ``get_meta(..., holder=holder)`` back
        to its task now: for a supervisor that saw that consumer die (its rows
        would otherwise wait for the leases to run out). Returns the counts."""
        self._check_open()
        if not isinstance(holder, str) or not holder:
            raise ValueError("holder must be a non-empty str")
        leases, returned, cleared = self._impl.release_holder(holder)
        return {"leases_released": leases, "rows_returned": returned, "rows_cleared": cleared}

    def renew(self, metadata: Union[BatchMeta, int], lease_timeout: Optional[float] = None) -> float:
        """Keeps a lease alive: it now expires ``lease_timeout`` seconds from
        now (None: the hub's default). A consumer working longer than its lease
        renews before the deadline; one that dies stops, and its rows go back
        to the task at the last deadline. Returns the new deadline on
        ``time.monotonic()``'s clock (a BatchMeta keeps the deadline it was
        granted with). Errors as ack."""
        self._check_open()
        lease_ms = 0 if lease_timeout is None else _ms(_check_seconds("lease_timeout", lease_timeout, False))
        return self._impl.renew(self._lease_of(metadata), lease_ms)

    def clear_partition(self, partition_id: str) -> int:
        """Frees every row of the partition, whatever its state, and removes
        the partition. Returns the rows cleared. ``errors.NotFound`` if it does
        not exist."""
        self._check_open()
        _check_name("partition", partition_id)
        with self._lock:
            self._partitions.discard(partition_id)
        return self._impl.clear_partition(partition_id)

    # -- key-value view

    def kv_put(self, key: str, partition_id: str, fields: Optional[Mapping[str, Any]] = None,
               tag: Optional[Mapping[str, str]] = None) -> None:
        """Writes one key: ``fields`` maps column -> that key's value (a tensor,
        the row itself, or a str); ``tag`` is merged into the key's tags."""
        self._check_open()
        _check_name("key", key)
        batch = None
        if fields is not None:
            if not isinstance(fields, Mapping):
                raise TypeError(f"fields must be a dict, not {type(fields).__name__}")
            batch = {}
            for name, v in fields.items():
                if isinstance(v, torch.Tensor):
                    batch[name] = v.unsqueeze(0)
                elif isinstance(v, str):
                    batch[name] = [v]
                else:
                    raise TypeError(f"kv_put field {name!r}: a tensor or a str, not {type(v).__name__}")
        self.kv_batch_put([key], partition_id, batch, None if tag is None else [tag])

    def kv_batch_put(self, keys: Sequence[str], partition_id: str, fields: Optional[Mapping[str, Any]] = None,
                     tags: Optional[Sequence[Mapping[str, str]]] = None) -> None:
        """Writes several keys, all or nothing. ``fields`` as ``put``'s data
        (batch = ``len(keys)``); ``tags`` one dict per key, merged into the
        key's tags. A new key gets a new row; an existing key gets the new
        columns (a column already written is ``errors.AlreadyExists``:
        ``kv_clear`` the key to replace it). The partition is created if
        missing."""
        self._check_open()
        keys = _names("keys", keys)
        _check_name("partition", partition_id)
        if fields is None and tags is None:
            raise ValueError("kv_batch_put needs fields or tags")
        wire, new_columns = {}, []
        if fields is not None:
            _, wire, _, new_columns = self._prepare(fields, len(keys))
        patches, new_tags = [], []
        if tags is not None:
            users = [_user_tags(f"tags[{i}]", t) for i, t in enumerate(_per_row("tags", tags, len(keys)))]
            patches = [(None, None, u) for u in users]
            new_tags = [(-1, -1, 0, u) for u in users]
        self._register(new_columns)
        self._ensure_partition(partition_id)
        try:
            self._impl.kv_put(partition_id, keys, new_tags, patches, wire)
        except errors.NotFound as e:
            if not _partition_missing(e):
                raise
            self._ensure_partition(partition_id, force=True)
            self._impl.kv_put(partition_id, keys, new_tags, patches, wire)

    def kv_batch_get(self, keys: Union[str, Sequence[str]], partition_id: str,
                     select_fields: Union[str, Sequence[str], None] = None, *, stack: bool = True) -> Dict[str, Any]:
        """The columns of ``keys`` (rows in the order of ``keys``), converted as
        in ``get_data``. ``select_fields`` None: the fields every key has.
        ``errors.NotFound`` if a key or a selected field of one is missing."""
        self._check_open()
        keys = _names("keys", keys)
        _check_name("partition", partition_id)
        wanted = [] if select_fields is None else _names("select_fields", select_fields)
        with self._lock:
            known = list(self._schemas)
        kinds = self._kinds(wanted if wanted else known, stack)
        _, raw = self._impl.kv_get(partition_id, keys, wanted, kinds)
        self._finish(raw, kinds, stack)
        if not wanted:  # the hub's column (registration) order
            with self._lock:
                rank = {name: i for i, name in enumerate(self._schemas)}
            wanted = sorted(raw, key=lambda n: rank.get(n, len(rank)))
        return {f: raw[f] for f in wanted}

    def kv_entries(self, partition_id: str) -> List[KVEntry]:
        """Every key of the partition (sorted), with its row id, tags and fields."""
        self._check_open()
        _check_name("partition", partition_id)
        return [KVEntry(k, row, _row_tags(tags), tuple(cols)) for k, row, tags, cols in
                self._impl.kv_list(partition_id)]

    def kv_list(self, partition_id: str) -> Dict[str, Dict[str, Dict[str, str]]]:
        """``{partition_id: {key: tags}}`` (the user tags), as TransferQueue's."""
        return {partition_id: {e.key: dict(e.tags.user) for e in self.kv_entries(partition_id)}}

    def kv_clear(self, keys: Union[str, Sequence[str]], partition_id: str) -> int:
        """Frees the keys' rows (all or nothing). Returns the rows cleared."""
        self._check_open()
        keys = _names("keys", keys)
        _check_name("partition", partition_id)
        return self._impl.kv_clear(partition_id, keys)

    # -- inspection

    def stats(self) -> Dict[str, Any]:
        """The hub's counters: rows, bytes, leases, and per task ready /
        leased / acked / acked_total / waiting."""
        self._check_open()
        return self._impl.stats()


# ---------------------------------------------------------------- making clients


def _read_token_file(path: str) -> str:
    with open(path, "rb") as f:
        raw = f.read()
    token = raw.rstrip(b" \t\r\n")
    if not token:
        raise ValueError(f"token file {path!r} is empty")
    return token.decode("utf-8")


def connect(endpoint: str, *, token: Optional[str] = None, token_file: Optional[str] = None, shm: str = "auto",
            rpc_timeout: float = 10.0) -> Client:
    """Connects to a ``sluice_queue_server`` at ``endpoint`` ("tcp://HOST:PORT"
    or "ipc://PATH"). ``shm``: "auto" uses the server's shared-memory arena
    when it has one and this host can open it (same host), "off" never,
    "required" fails unless it can. ``token`` / ``token_file``: the server's
    shared secret. ``rpc_timeout``: seconds a reply may take beyond what the
    request itself waits. ``errors.Unavailable`` if the server does not
    answer."""
    if not isinstance(endpoint, str):
        raise TypeError(f"endpoint must be a str, not {type(endpoint).__name__}")
    if token is not None and token_file is not None:
        raise ValueError("give token or token_file, not both")
    if token_file is not None:
        token = _read_token_file(token_file)
    if token is None:
        token = ""
    if not isinstance(token, str):
        raise TypeError(f"token must be a str, not {type(token).__name__}")
    if len(token.encode()) > 256:
        raise ValueError("token is longer than 256 bytes")
    if shm not in ("auto", "off", "required"):
        raise ValueError(f"shm must be 'auto', 'off' or 'required', not {shm!r}")
    rpc_ms = _ms(_check_seconds("rpc_timeout", rpc_timeout, allow_zero=False))
    return Client(_impl.Client.connect(endpoint, token, shm, rpc_ms))


def start_hub(*, capacity_bytes: int = 8 << 30, capacity_rows: int = 1 << 20, storage_units: int = 2,
              lease_timeout: float = 60.0, max_batch_rows: int = 65536, max_tensor_bytes: int = 1 << 30) -> Client:
    """A hub inside this process (no server; other processes cannot reach
    it) and a client of it. ``lease_timeout``: the default lease in seconds.
    Closing the client closes the hub."""
    return Client(
        _impl.Client.in_process(
            _check_int("capacity_bytes", capacity_bytes, 1, 2**64 - 1),
            _check_int("capacity_rows", capacity_rows, 1, 2**64 - 1),
            _check_int("storage_units", storage_units, 1, 1024),
            _ms(_check_seconds("lease_timeout", lease_timeout, allow_zero=False)),
            _check_int("max_batch_rows", max_batch_rows, 1, 2**32 - 1),
            _check_int("max_tensor_bytes", max_tensor_bytes, 1, 2**64 - 1),
        )
    )


# ---------------------------------------------------------------- module-level API (TransferQueue's shape)

_default_lock = threading.Lock()
_default: Optional[Client] = None
_default_conf: Optional[dict] = None

_CONF_KEYS = {"endpoint", "token", "token_file", "shm", "rpc_timeout", "hub"}


def init(conf: Optional[Mapping[str, Any]] = None) -> Client:
    """Makes this process's default client (used by the module-level ``kv_*``
    functions and ``get_client``). ``conf`` keys: ``endpoint`` (a server;
    absent: a hub in this process), ``token``, ``token_file``, ``shm``,
    ``rpc_timeout`` (see ``connect``), ``hub`` (a dict of ``start_hub``
    arguments). A second ``init`` with the same conf (or none) returns the
    same client; with another conf it is a ValueError (``close()`` first)."""
    global _default, _default_conf
    if conf is not None and not isinstance(conf, Mapping):
        raise TypeError(f"conf must be a dict, not {type(conf).__name__}")
    conf = dict(conf or {})
    for k in conf:
        if k not in _CONF_KEYS:
            raise ValueError(f"init: unknown conf key {k!r} (known: {', '.join(sorted(_CONF_KEYS))})")
    with _default_lock:
        if _default is not None:
            if conf and conf != _default_conf:
                raise ValueError("init: already initialized with another conf; call close() first")
            return _default
        endpoint = conf.get("endpoint")
        if endpoint is None:
            for k in ("token", "token_file", "shm", "rpc_timeout"):
                if k in conf:
                    raise ValueError(f"init: {k!r} needs an 'endpoint'")
            hub = conf.get("hub") or {}
            if not isinstance(hub, Mapping):
                raise TypeError("init: 'hub' must be a dict of start_hub arguments")
            client = start_hub(**hub)
        else:
            if "hub" in conf:
                raise ValueError("init: 'hub' and 'endpoint' exclude each other")
            client = connect(endpoint, token=conf.get("token"), token_file=conf.get("token_file"),
                             shm=conf.get("shm", "auto"), rpc_timeout=conf.get("rpc_timeout", 10.0))
        _default, _default_conf = client, conf
        return client


def get_client() -> Client:
    """The default client made by ``init``."""
    with _default_lock:
        if _default is None:
            raise RuntimeError("sluice.transfer_queue.init() has not been called")
        return _default


def close() -> None:
    """Closes the default client (see ``Client.close``); ``init`` may be
    called again."""
    global _default, _default_conf
    with _default_lock:
        client, _default, _default_conf = _default, None, None
    if client is not None:
        client.close()


def kv_put(key: str, partition_id: str, fields: Optional[Mapping[str, Any]] = None,
           tag: Optional[Mapping[str, str]] = None) -> None:
    return get_client().kv_put(key, partition_id, fields, tag)


def kv_batch_put(keys: Sequence[str], partition_id: str, fields: Optional[Mapping[str, Any]] = None,
                 tags: Optional[Sequence[Mapping[str, str]]] = None) -> None:
    return get_client().kv_batch_put(keys, partition_id, fields, tags)


def kv_batch_get(keys: Union[str, Sequence[str]], partition_id: str,
                 select_fields: Union[str, Sequence[str], None] = None) -> Dict[str, Any]:
    return get_client().kv_batch_get(keys, partition_id, select_fields)


def kv_list(partition_id: str) -> Dict[str, Dict[str, Dict[str, str]]]:
    return get_client().kv_list(partition_id)


def kv_clear(keys: Union[str, Sequence[str]], partition_id: str) -> int:
    return get_client().kv_clear(keys, partition_id)


__all__ = [
    "BatchMeta",
    "Client",
    "ColumnSchema",
    "Error",
    "KVEntry",
    "RowTags",
    "STRING_MARKER_PREFIX",
    "SUPPORTED_DTYPES",
    "close",
    "connect",
    "get_client",
    "init",
    "kv_batch_get",
    "kv_batch_put",
    "kv_clear",
    "kv_list",
    "kv_put",
    "start_hub",
]
