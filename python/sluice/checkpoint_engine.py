"""The CheckpointEngine from Python: Sluice's versioned weight hub.

A trainer publishes numbered, immutable weight versions (a ``state_dict``);
readers pin the version they use and move to a newer one when they choose.
Two stores, with the C++ core's contract (docs/checkpoint_engine.md;
docs/python.md has the guide):

* :class:`ShmPublisher` / :class:`ShmSubscriber`: the same-host store over
  POSIX shared memory. One publisher process, any number of reader processes
  (Python or C++). Readers get tensors that view the shared memory without a
  copy.
* :class:`VersionStore`: the in-process store, publisher and reader in one
  object (for one process, and for tests).

The guarantees, for both:

* **Two-phase publish.** ``publish(state_dict)`` stages every tensor (copied
  in and checksummed), then commits: the version becomes the latest at once,
  whole. A publish that fails in any way (a wrong state_dict, an exception
  half way, a store error) is aborted and the previous version keeps serving;
  the same version number may be published again.
* **Pins.** ``acquire()`` and ``wait_for_version()`` return a
  :class:`PinnedWeights`: its tensors stay valid and unchanged while the
  handle or any tensor taken from it is alive, however many versions are
  published meanwhile. A version neither latest nor pinned is freed.
* **Read-only views.** A pinned version's tensors view the store's memory.
  Never write to them: over shared memory the mapping is read-only and a
  write kills the process (SIGSEGV); in process a write corrupts the version
  for every reader (``verify()`` detects it). ``clone()`` a tensor to modify
  it, or ``copy_into`` your own tensors.

Errors from the core raise :class:`sluice.errors.Error` subclasses (e.g.
``errors.Timeout``, also a ``TimeoutError``); mistakes caught here (a value
that is not a tensor, a dtype or shape that does not match the layout, a
missing tensor, a bad store name) raise ``TypeError`` / ``ValueError`` naming
what is wrong, before anything is staged.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import threading
import types
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import _C, _dtypes, errors

_impl = _C.checkpoint_engine

#: The torch dtypes a tensor may have.
SUPPORTED_DTYPES = tuple(_dtypes.DTYPE_NAMES)

#: ``latest_version()`` before the first commit.
NO_VERSION = -1

_STORE_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")
_MAX_SECONDS = 7 * 24 * 3600 * 52
#: The largest version a store accepts (as the C++ publishers): room is left
#: for "the latest + 1" wherever a next version is computed.
_MAX_VERSION = 2**62


# ---------------------------------------------------------------- layouts


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor of a store's layout: name, dtype and shape. Every version
    holds exactly the tensors of the layout."""

    name: str
    dtype: torch.dtype
    shape: Tuple[int, ...]

    def __post_init__(self):
        _check_tensor_name(self.name)
        if self.dtype not in _dtypes.DTYPE_NAMES:
            raise TypeError(f"tensor {self.name!r}: dtype {self.dtype} is not supported ({_dtypes.dtype_list()})")
        if isinstance(self.shape, (str, bytes, torch.Tensor)):
            raise TypeError(f"tensor {self.name!r}: shape must be a tuple of ints")
        try:
            shape = tuple(self.shape)
        except TypeError:
            raise TypeError(f"tensor {self.name!r}: shape must be a tuple of ints") from None
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, int):
                raise TypeError(f"tensor {self.name!r}: shape {shape}: dimensions must be ints")
            if d < 0:
                raise ValueError(f"tensor {self.name!r}: shape {shape} has a negative dimension")
        object.__setattr__(self, "shape", shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _element_size(self.dtype)

    def _wire(self) -> tuple:
        return (self.name, _dtypes.DTYPE_NAMES[self.dtype], list(self.shape))

    @staticmethod
    def _from_wire(raw: tuple) -> "TensorSpec":
        name, dtype, shape = raw
        return TensorSpec(name, _dtypes.DTYPES_BY_NAME[dtype], tuple(shape))


def layout_of(state_dict: Mapping[str, torch.Tensor]) -> List[TensorSpec]:
    """The layout of ``state_dict``: one :class:`TensorSpec` per entry, in
    name order (as the C++ ``LayoutOf``, so Python and C++ roles given the
    same weights agree on the layout). Tensors on any device, ``meta``
    included, give their dtype and shape."""
    _check_mapping(state_dict)
    specs = []
    for name, t in state_dict.items():
        _check_tensor_name(name)
        _check_tensor_value(name, t, allow_meta=True)
        specs.append(TensorSpec(name, t.dtype, tuple(t.shape)))
    return sorted(specs, key=lambda s: s.name)


def _as_layout(layout: Any) -> List[TensorSpec]:
    """A layout from a state_dict (name order) or a sequence of TensorSpec /
    (name, dtype, shape) tuples (order kept)."""
    if isinstance(layout, Mapping):
        return layout_of(layout)
    if isinstance(layout, (str, bytes, torch.Tensor)) or not isinstance(layout, Sequence):
        raise TypeError(f"layout must be a state_dict or a list of TensorSpec, not {type(layout).__name__}")
    specs = []
    for i, s in enumerate(layout):
        if isinstance(s, TensorSpec):
            specs.append(s)
        elif isinstance(s, tuple) and len(s) == 3:
            specs.append(TensorSpec(*s))
        else:
            raise TypeError(f"layout[{i}] must be a TensorSpec or a (name, dtype, shape) tuple, not {type(s).__name__}")
    if not specs:
        raise ValueError("layout is empty: a store holds at least one tensor")
    seen = set()
    for s in specs:
        if s.name in seen:
            raise ValueError(f"layout names tensor {s.name!r} twice")
        seen.add(s.name)
    return specs


# ---------------------------------------------------------------- checks


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _check_tensor_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"tensor names must be str, not {type(name).__name__} ({name!r})")
    if not name:
        raise ValueError("tensor name is empty")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"tensor name {name!r} is not valid UTF-8") from None
    return name


def _check_mapping(state_dict: Any) -> None:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a Mapping of str to torch.Tensor, not {type(state_dict).__name__}")
    if len(state_dict) == 0:
        raise ValueError("state_dict is empty")


def _check_tensor_value(name: str, t: Any, allow_meta: bool = False) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tensor {name!r}: a torch.Tensor, not {type(t).__name__}")
    if t.layout != torch.strided or getattr(t, "is_nested", False):
        raise TypeError(f"tensor {name!r}: only dense (strided) tensors, not {t.layout}")
    if t.dtype not in _dtypes.DTYPE_NAMES:
        raise TypeError(f"tensor {name!r}: dtype {t.dtype} is not supported ({_dtypes.dtype_list()})")
    if t.device.type == "meta" and not allow_meta:
        raise ValueError(f"tensor {name!r} is on the meta device: it has no data")


def _check_matches(name: str, t: torch.Tensor, spec: TensorSpec) -> None:
    if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
        raise ValueError(
            f"tensor {name!r} is {t.dtype} {list(t.shape)}, the layout says {spec.dtype} {list(spec.shape)}"
        )


def _check_state_dict(state_dict: Any, layout: Sequence[TensorSpec]) -> None:
    """Everything a publish needs from ``state_dict``, checked before anything
    is staged: exactly the layout's names, tensors of its dtypes and shapes."""
    _check_mapping(state_dict)
    by_name = {s.name: s for s in layout}
    extra = []
    for name, t in state_dict.items():
        _check_tensor_name(name)
        if name not in by_name:
            extra.append(name)
            continue
        _check_tensor_value(name, t)
        _check_matches(name, t, by_name[name])
    missing = [s.name for s in layout if s.name not in state_dict]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {_names_list(missing)}")
        if extra:
            parts.append(f"not in the layout: {_names_list(extra)}")
        raise ValueError(f"state_dict does not match the store's layout ({'; '.join(parts)})")


def _names_list(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _host(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a CPU, contiguous tensor the store can copy from:
    ``t`` itself when it is one, else one copy (from another device, or of a
    strided view)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if not t.is_contiguous():
        t = t.contiguous()
    return t


def _check_store_name(what: str, name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, not {type(name).__name__}")
    if not _STORE_NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} must be 1..100 characters of letters, digits, '_' and '-'")
    return name


def _check_int(what: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(v).__name__}") from None
    if i < lo or i > hi:
        raise ValueError(f"{what} must be in {lo}..{hi}, not {i}")
    return i


def _ms(what: str, seconds: Any, allow_zero: bool = True) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    f = float(seconds)
    if not math.isfinite(f) or f < 0 or (f == 0 and not allow_zero) or f > _MAX_SECONDS:
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'} and finite seconds, not {seconds}")
    return int(math.ceil(f * 1000.0))


def _check_version(v: Any) -> int:
    return _check_int("version", v, 0, _MAX_VERSION)


# ---------------------------------------------------------------- publishing


class StagedPublish:
    """One publish in progress (from ``begin_publish``): ``put`` every tensor
    of the layout, then ``commit``. As a context manager it commits on a
    clean exit and aborts when the block raises (or the commit fails), so
    the previous version keeps serving::

        with publisher.begin_publish() as staged:
            for name, tensor in weights():
                staged.put(name, tensor)
        print(staged.version)

    ``abort()`` ends it without committing; so does dropping it. One thread
    at a time (calls from several threads are serialized)."""

    def __init__(self, impl: Any, layout: Sequence[TensorSpec]):
        self._impl = impl
        self._by_name = {s.name: s for s in layout}
        self._state = "open"

    @property
    def version(self) -> int:
        """The version this publish commits."""
        return self._impl.version

    @property
    def state(self) -> str:
        """``"open"``, ``"committed"`` or ``"aborted"``."""
        return self._state

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Copies ``tensor`` into staging and checksums the copy. A tensor on
        another device is copied to the host first, a non-contiguous one
        made contiguous (one copy each). ``ValueError`` / ``TypeError`` for a
        name not in the layout or a tensor of another dtype or shape;
        ``errors.AlreadyExists`` if ``name`` was put already in this publish
        (nothing changes on any error)."""
        _check_tensor_name(name)
        spec = self._by_name.get(name)
        if spec is None:
            raise ValueError(f"tensor {name!r} is not in the store's layout")
        _check_tensor_value(name, tensor)
        _check_matches(name, tensor, spec)
        self._impl.put(name, _host(tensor))

    def commit(self) -> int:
        """Makes the version the latest, atomically; returns it.
        ``errors.FailedPrecondition`` naming tensors not put yet (the publish
        stays open); ``errors.DataLoss`` if staged bytes changed since their
        put (the publish is aborted). On any error the previous version keeps
        serving."""
        try:
            self._impl.commit()
        except errors.DataLoss:
            self._state = "aborted"
            raise
        self._state = "committed"
        return self.version

    def abort(self) -> None:
        """Drops the staged tensors; the version number may be used again.
        No-op once committed or aborted."""
        self._impl.abort()
        if self._state == "open":
            self._state = "aborted"

    def __enter__(self) -> "StagedPublish":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._state != "open":
            return
        if exc_type is not None:
            self.abort()
            return
        try:
            self.commit()
        except BaseException:
            self.abort()
            raise

    def __repr__(self) -> str:
        return f"StagedPublish(version={self.version}, {self._state})"


class _Publisher:
    """What the two publishers share: the layout (possibly taken from the
    first state_dict), version numbering, publish."""

    _impl: Any
    _layout: Optional[List[TensorSpec]]

    def _check_open(self) -> Any:
        if self._closed:
            raise errors.Aborted(f"{type(self).__name__} is closed")
        return self._impl

    def _ensure_store(self, state_dict: Any) -> None:
        """Attaches with the layout of ``state_dict`` if none is known yet."""

    @property
    def layout(self) -> Optional[List[TensorSpec]]:
        """The store's layout (None until the first publish when the
        publisher was made without one)."""
        return None if self._layout is None else list(self._layout)

    def latest_version(self) -> int:
        """The newest committed version; ``NO_VERSION`` (-1) before the first."""
        impl = self._check_open()
        return NO_VERSION if impl is None else impl.latest_version()

    def begin_publish(self, version: Optional[int] = None) -> StagedPublish:
        """Reserves ``version`` (default: ``latest_version() + 1``) for staging.
        ``errors.AlreadyExists`` if it is the latest, ``errors.FailedPrecondition``
        if it is older or another publish is open; ``ValueError`` if the
        layout is not known yet (give one, or ``publish`` a state_dict
        first)."""
        impl = self._check_open()
        if impl is None:
            raise ValueError("the store's layout is not known yet: pass layout= or publish() a state_dict first")
        if version is None:
            latest = impl.latest_version()
            if latest >= _MAX_VERSION:
                raise ValueError(f"version {latest} is the last a store accepts (versions are in 0..{_MAX_VERSION}): "
                                 "no version can follow it; publish to a new store")
            v = latest + 1
        else:
            v = _check_version(version)
        return StagedPublish(impl.begin_publish(v), self._layout)

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: Optional[int] = None) -> int:
        """Publishes ``state_dict`` as ``version`` (default: the latest + 1)
        and returns the version. ``state_dict`` must hold exactly the
        layout's tensors (names, dtypes, shapes; any device: others are
        copied to the host one tensor at a time); everything is checked
        before anything is staged. All or nothing: on any error, or an
        exception while staging, the publish is aborted and the previous
        version keeps serving."""
        self._check_open()
        self._ensure_store(state_dict)
        _check_state_dict(state_dict, self._layout)
        with self.begin_publish(version) as staged:
            for spec in self._layout:
                staged.put(spec.name, state_dict[spec.name])
        return staged.version

    def version_bytes(self) -> int:
        """Bytes of one version's tensors (0 while the layout is unknown)."""
        impl = self._check_open()
        return 0 if impl is None else impl.version_bytes()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShmPublisher(_Publisher):
    """The publisher of a shared-memory store (``/dev/shm/<shm_prefix>.<store_name>.*``).

    ``layout``: a state_dict (its layout, in name order), a list of
    :class:`TensorSpec` (order kept), or None: taken from the first
    ``publish``'s state_dict, the store being created then. The store is
    created, or taken over from a publisher that is gone (the next version
    must exceed its latest). One live publisher per store:
    ``errors.FailedPrecondition`` names the other one's pid, or the first
    layout difference with an existing store.

    Options (``ShmPublisherOptions``): ``max_tensor_bytes`` (largest tensor,
    default 4 GiB), ``max_readers`` (1..4096, default 32) and
    ``max_pins_per_reader`` (distinct versions one subscriber may pin at
    once, 1..64, default 4): fixed by whoever creates the store;
    ``lock_timeout`` (seconds, default 5); ``recycle_segments`` (stage into a
    freed version's segment, default True).

    ``close()`` detaches (an open publish is aborted); when no subscriber
    remains attached, every segment of the store is removed. Readers keep
    serving the latest version after the publisher is gone. Thread-safe.
    """

    def __init__(self, store_name: str, layout: Any = None, *, shm_prefix: str = "sluice",
                 max_tensor_bytes: int = 4 << 30, max_readers: int = 32, max_pins_per_reader: int = 4,
                 lock_timeout: float = 5.0, recycle_segments: bool = True):
        self.store_name = _check_store_name("store_name", store_name)
        self.shm_prefix = _check_store_name("shm_prefix", shm_prefix)
        self._options = (
            _check_int("max_tensor_bytes", max_tensor_bytes, 1, 2**63 - 1),
            _check_int("max_readers", max_readers, 1, 4096),
            _check_int("max_pins_per_reader", max_pins_per_reader, 1, 64),
            _ms("lock_timeout", lock_timeout, allow_zero=False),
            bool(recycle_segments),
        )
        self._attach_lock = threading.Lock()
        self._impl = None
        self._layout = None
        self._closed = False
        if layout is not None:
            self._attach(_as_layout(layout))

    def _attach(self, layout: List[TensorSpec]) -> None:
        with self._attach_lock:
            if self._impl is not None:
                return
            self._impl = _impl.ShmPublisher.attach(self.store_name, self.shm_prefix, [s._wire() for s in layout],
                                                   *self._options)
            self._layout = [TensorSpec._from_wire(s) for s in self._impl.layout()]

    def _ensure_store(self, state_dict: Any) -> None:
        if self._impl is None:
            self._attach(layout_of(state_dict))

    @property
    def control_segment(self) -> Optional[str]:
        """The control segment's name (``/<prefix>.<store>.control``), or None
        before the store is attached."""
        impl = self._check_open()
        return None if impl is None else impl.control_segment()

    def stats(self) -> Dict[str, Any]:
        """A consistent snapshot of the store: ``latest_version``,
        ``versions_in_memory``, ``pinned`` ([(version, reader slots)]),
        ``staging_version``, byte figures (``bytes_held`` <=
        ``max_bytes_held``), ``commits``, ``aborts``, ``readers_attached``,
        ``dead_readers``, ``publisher_pid``, ``segments_recycled``, ...
        (docs/python.md)."""
        impl = self._check_open()
        if impl is None:
            raise ValueError("the store is not attached yet: pass layout= or publish() a state_dict first")
        return impl.stats()

    def sweep(self) -> None:
        """Reclaims dead readers' slots and pins now and frees what they held
        (commits do this too)."""
        impl = self._check_open()
        if impl is not None:
            impl.sweep()

    def close(self) -> None:
        """Detaches from the store (see the class); later calls raise
        ``errors.Aborted``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._attach_lock:
            impl, self._impl = self._impl, None
        if impl is not None:
            impl.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"latest={self.latest_version()}"
        return f"ShmPublisher({self.shm_prefix}.{self.store_name}, {state})"


class VersionStore(_Publisher):
    """The in-process store: publisher and reader in one object.

    ``layout`` as for :class:`ShmPublisher` (required here).
    ``max_pinned_versions`` (default 0: unlimited): pinning a further
    distinct version raises ``errors.ResourceExhausted``. ``reuse_buffers``:
    stage the next version into a freed version's buffers. Memory: at most
    (distinct pinned versions + 2) versions. Thread-safe.
    """

    def __init__(self, layout: Any, *, max_tensor_bytes: int = 4 << 30, max_pinned_versions: int = 0,
                 reuse_buffers: bool = False):
        if layout is None:
            raise ValueError("VersionStore needs a layout (a state_dict or a list of TensorSpec)")
        specs = _as_layout(layout)
        self._impl = _impl.VersionStore.create(
            [s._wire() for s in specs],
            _check_int("max_tensor_bytes", max_tensor_bytes, 1, 2**63 - 1),
            _check_int("max_pinned_versions", max_pinned_versions, 0, 2**63 - 1),
            bool(reuse_buffers),
        )
        self._layout = [TensorSpec._from_wire(s) for s in self._impl.layout()]
        self._closed = False

    def acquire(self, version: Optional[int] = None) -> "PinnedWeights":
        """Pins ``version`` (default: the latest). ``errors.NotFound`` if
        nothing was committed yet, or the version was never committed or was
        freed; ``errors.ResourceExhausted`` past ``max_pinned_versions``."""
        impl = self._check_open()
        return PinnedWeights(impl.acquire(None if version is None else _check_version(version)), self._layout)

    def wait_for_version(self, at_least: int, timeout: float) -> "PinnedWeights":
        """Waits up to ``timeout`` seconds until a version >= ``at_least`` is
        committed, then pins the latest. ``errors.Timeout`` (a
        ``TimeoutError``) naming the latest version on expiry. The GIL is
        released while waiting; signal handlers run every 0.2 s."""
        impl = self._check_open()
        return PinnedWeights(
            impl.wait_for_version(_check_int("at_least", at_least, 0, _MAX_VERSION), _ms("timeout", timeout)),
            self._layout)

    def stats(self) -> Dict[str, Any]:
        """A consistent snapshot: as ``ShmPublisher.stats`` without the
        shared-memory fields (``pinned`` counts handles and views)."""
        return self._check_open().stats()

    def close(self) -> None:
        """Later calls raise ``errors.Aborted``; versions still pinned stay
        valid until released. Idempotent."""
        if self._closed:
            return
        self._closed = True
        impl, self._impl = self._impl, None
        impl.close()

    def __repr__(self) -> str:
        return f"VersionStore({'closed' if self._closed else f'latest={self.latest_version()}'})"


# ---------------------------------------------------------------- reading


class PinnedWeights(Mapping):
    """One pinned version: ``version`` and a read-only mapping of tensor name
    -> ``torch.Tensor`` (layout order) that views the store's memory without
    a copy.

    The version stays in memory, unchanged, while this handle is held or any
    tensor taken from it is alive: ``release()`` (or leaving the ``with``
    block) drops the handle's pin, the last tensor dropped frees the rest.
    **Never write to the tensors** (module docstring): ``clone()`` them, or
    ``copy_into`` tensors of your own."""

    def __init__(self, impl: Any, layout: Sequence[TensorSpec]):
        self._impl = impl
        self._layout = layout
        self._version = impl.version
        self._tensors: Optional[Dict[str, torch.Tensor]] = dict(impl.tensors())

    @property
    def version(self) -> int:
        return self._version

    @property
    def released(self) -> bool:
        return self._tensors is None

    @property
    def tensors(self) -> Mapping[str, torch.Tensor]:
        """name -> tensor view (read-only mapping)."""
        return types.MappingProxyType(self._held())

    def _held(self) -> Dict[str, torch.Tensor]:
        if self._tensors is None:
            raise ValueError(f"version {self._version} was released")
        return self._tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        tensors = self._held()
        if name not in tensors:
            raise KeyError(name)
        return tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._held())

    def __len__(self) -> int:
        return len(self._held())

    def checksum(self, name: str) -> int:
        """The 64-bit checksum recorded when ``name`` was published."""
        self._held()
        _check_tensor_name(name)
        return self._impl.checksum(name)

    def verify(self) -> None:
        """Recomputes every tensor's checksum; ``errors.DataLoss`` naming the
        first tensor whose bytes changed."""
        self._held()
        self._impl.verify()

    def copy_into(self, destination: Union[Mapping[str, torch.Tensor], torch.nn.Module], *,
                  strict: bool = True) -> None:
        """Copies the version into existing tensors: a state_dict-like
        mapping, or a module (its ``state_dict()``, which shares the
        parameters' storage), outside autograd as ``load_state_dict`` does.

        Every destination must have the tensor's dtype and shape (a
        ``ValueError`` naming it otherwise; nothing is copied then). CPU
        contiguous destinations get one copy; others (another device, a
        strided view) go through a host buffer. ``strict`` (default): the
        names must be exactly the layout's; ``strict=False`` copies the
        names both have. Over shared memory each copy is checked against the
        publisher's checksum (``verify_copies``, default on):
        ``errors.DataLoss`` naming the tensor, with the tensors before it
        already copied."""
        self._held()
        if isinstance(destination, torch.nn.Module):
            destination = destination.state_dict()
        if not isinstance(destination, Mapping):
            raise TypeError(f"copy_into needs a Mapping of str to torch.Tensor or a torch.nn.Module, "
                            f"not {type(destination).__name__}")
        by_name = {s.name: s for s in self._layout}
        for name in destination:
            _check_tensor_name(name)
        if strict:
            missing = [s.name for s in self._layout if s.name not in destination]
            extra = [n for n in destination if n not in by_name]
            if missing or extra:
                parts = ([f"missing {_names_list(missing)}"] if missing else []) + (
                    [f"not in the layout: {_names_list(extra)}"] if extra else [])
                raise ValueError(f"copy_into: the destination does not match the layout ({'; '.join(parts)}); "
                                 "strict=False copies the names both have")
        direct, staged = [], []
        for spec in self._layout:
            if spec.name not in destination:
                continue
            dst = destination[spec.name]
            _check_tensor_value(spec.name, dst)
            _check_matches(spec.name, dst, spec)
            if dst.device.type == "cpu" and dst.is_contiguous():
                direct.append((spec.name, dst.detach()))
            else:
                staged.append((spec.name, dst))
        buffers = [(name, torch.empty(dst.shape, dtype=dst.dtype)) for name, dst in staged]
        self._impl.copy_into(direct + buffers)
        with torch.no_grad():
            for (name, dst), (_, buf) in zip(staged, buffers):
                dst.copy_(buf)

    def release(self) -> None:
        """Drops this handle's pin (tensors taken from it keep their own).
        Idempotent."""
        if self._tensors is None:
            return
        self._tensors = None
        self._impl.release()

    def __enter__(self) -> "PinnedWeights":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._tensors is None else f"{len(self._tensors)} tensors"
        return f"PinnedWeights(version={self._version}, {state})"


class ShmSubscriber:
    """A reader of a shared-memory store, in any process of the host.

    Attaching claims one of the store's reader slots (a dead reader's slot is
    reclaimed first): ``errors.NotFound`` if the store does not exist within
    ``attach_timeout`` seconds (default 0: one try), ``errors.ResourceExhausted``
    if every slot is held by a live process, ``errors.FailedPrecondition`` if
    ``expected_layout`` (a state_dict or a list of :class:`TensorSpec`) is
    given and the store's differs (the first difference named).
    ``verify_copies`` (default True): ``copy_into`` checks every copy
    against the publisher's checksum. ``lock_timeout``: seconds (default 5).

    One subscriber pins at most the store's ``max_pins_per_reader`` distinct
    versions at once (``errors.ResourceExhausted`` past that; acquiring a
    version it pins already is free). A process that dies (even by SIGKILL)
    holding pins blocks nobody: its slot and pins are reclaimed by the next
    commit, attach or sweep. ``close()`` detaches once every
    ``PinnedWeights`` and tensor from it is gone. Thread-safe; not
    fork-safe (a forked child attaches anew).
    """

    def __init__(self, store_name: str, *, shm_prefix: str = "sluice", expected_layout: Any = None,
                 attach_timeout: float = 0.0, lock_timeout: float = 5.0, verify_copies: bool = True):
        self.store_name = _check_store_name("store_name", store_name)
        self.shm_prefix = _check_store_name("shm_prefix", shm_prefix)
        expected = None if expected_layout is None else [s._wire() for s in _as_layout(expected_layout)]
        self._closed = False
        self._impl = _impl.ShmSubscriber.attach(self.store_name, self.shm_prefix, expected,
                                                _ms("attach_timeout", attach_timeout),
                                                _ms("lock_timeout", lock_timeout, allow_zero=False),
                                                bool(verify_copies))
        self._layout = [TensorSpec._from_wire(s) for s in self._impl.layout()]

    def _check_open(self) -> Any:
        if self._closed:
            raise errors.Aborted("ShmSubscriber is closed")
        return self._impl

    @property
    def layout(self) -> List[TensorSpec]:
        """The store's layout, as recorded in shared memory."""
        return list(self._layout)

    def latest_version(self) -> int:
        """The newest committed version (no lock: fit for polling);
        ``NO_VERSION`` (-1) before the first."""
        return self._check_open().latest_version()

    def acquire(self, version: Optional[int] = None) -> PinnedWeights:
        """Pins ``version`` (default: the latest). ``errors.NotFound`` if
        nothing was committed yet, or ``version`` was never committed or
        already freed; ``errors.ResourceExhausted`` past
        ``max_pins_per_reader``."""
        impl = self._check_open()
        return PinnedWeights(impl.acquire(None if version is None else _check_version(version)), self._layout)

    def wait_for_version(self, at_least: int, timeout: float) -> PinnedWeights:
        """Waits up to ``timeout`` seconds until a version >= ``at_least`` is
        committed, then pins the latest. ``errors.Timeout`` (a
        ``TimeoutError``) on expiry, naming the latest version and whether
        a publisher is alive. The GIL is released while waiting; signal
        handlers run every 0.2 s (Ctrl-C interrupts the wait)."""
        impl = self._check_open()
        return PinnedWeights(
            impl.wait_for_version(_check_int("at_least", at_least, 0, _MAX_VERSION), _ms("timeout", timeout)),
            self._layout)

    def version_bytes(self) -> int:
        return self._check_open().version_bytes()

    def stats(self) -> Dict[str, Any]:
        """The store's snapshot, as ``ShmPublisher.stats``."""
        return self._check_open().stats()

    def close(self) -> None:
        """Later calls raise ``errors.Aborted``; the slot is given back once
        every pinned version from this subscriber is released. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._impl.close()

    def __enter__(self) -> "ShmSubscriber":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShmSubscriber({self.shm_prefix}.{self.store_name})"


# ---------------------------------------------------------------- store tools


def sweep_shm_store(store_name: str, *, shm_prefix: str = "sluice", lock_timeout: float = 5.0) -> None:
    """Repairs a store (dead readers' pins, a dead publisher's staging,
    orphans) and removes it if no live process is attached.
    ``errors.NotFound`` if there is no such store."""
    _impl.sweep_shm_store(_check_store_name("shm_prefix", shm_prefix), _check_store_name("store_name", store_name),
                          _ms("lock_timeout", lock_timeout, allow_zero=False))


def destroy_shm_store(store_name: str, *, shm_prefix: str = "sluice") -> None:
    """Removes every segment of the store, live or not (attached processes
    keep their mappings; no one attaches again). For cleaning up after a
    run."""
    _impl.destroy_shm_store(_check_store_name("shm_prefix", shm_prefix), _check_store_name("store_name", store_name))


__all__ = [
    "NO_VERSION",
    "PinnedWeights",
    "SUPPORTED_DTYPES",
    "ShmPublisher",
    "ShmSubscriber",
    "StagedPublish",
    "TensorSpec",
    "VersionStore",
    "destroy_shm_store",
    "layout_of",
    "sweep_shm_store",
]
