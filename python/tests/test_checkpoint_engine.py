"""The CheckpointEngine from Python (sluice.checkpoint_engine): the
shared-memory store between a Python publisher and Python and C++ readers in
other processes, and the in-process VersionStore.

Every test uses its own segment prefix, so nothing collides with other runs;
leftover segments are removed afterwards. The C++ peers are the shared-memory
store's own test binary run in one of its child modes
($SLUICE_CHECKPOINT_ENGINE_SHM_TEST, set by CTest).
"""

import gc
import json
import math
import os
import pathlib
import random
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from sluice import checkpoint_engine as ce
from sluice import errors

from checkpoint_child import mismatch, weights
from conftest import REPO, wait_until

CHILD = str(pathlib.Path(__file__).resolve().parent / "checkpoint_child.py")


@pytest.fixture
def store():
    """(prefix, store_name), unique to the test; every segment under the
    prefix is removed afterwards."""
    prefix = f"slpy{os.getpid()}x{random.getrandbits(32):08x}"
    yield prefix, "policy"
    gc.collect()
    for name in segments(prefix):
        os.unlink(f"/dev/shm/{name}")


def segments(prefix: str) -> list:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix + "."))


def start_child(mode: str, prefix: str, store_name: str, version: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, CHILD, mode, prefix, store_name, str(version)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ))


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().decode().strip() if ready else ""


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()
    proc.stderr.close()


# ---------------------------------------------------------------- publish and read


def test_versions_published_from_python_are_read_whole_and_without_copies(store):
    prefix, name = store
    with ce.ShmPublisher(name, shm_prefix=prefix) as pub:
        assert pub.layout is None and pub.latest_version() == ce.NO_VERSION
        assert pub.publish(weights(0)) == 0  # the layout comes from the first state_dict
        assert [s.name for s in pub.layout] == sorted(weights(0))  # name order, as the C++ LayoutOf
        assert pub.publish(weights(1)) == 1
        assert pub.publish(weights(7), version=7) == 7
        with ce.ShmSubscriber(name, shm_prefix=prefix, expected_layout=weights(0)) as sub:
            assert sub.layout == pub.layout
            assert sub.latest_version() == 7
            with sub.acquire() as w:
                assert w.version == 7 and mismatch(w, 7) == ""
                assert w.checksum("embed.weight") != 0
                w.verify()
                # The views lie in the version's shared-memory segment.
                assert mapped_file(w["embed.weight"].data_ptr()).startswith(f"/dev/shm/{prefix}.{name}.")
                assert w["embed.weight"].data_ptr() == w["embed.weight"].data_ptr()
            assert w.released
            with pytest.raises(ValueError, match="released"):
                w["embed.weight"]
            with pytest.raises(errors.NotFound, match="version 1 is not in shared memory"):
                sub.acquire(1)  # superseded and unpinned: freed
            assert pub.stats()["versions_in_memory"] == [7]
    assert segments(prefix) == []  # the last participant removed the store


def mapped_file(address: int) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else ""
    return ""


def test_pinned_versions_stay_intact_while_newer_ones_are_published(store):
    prefix, name = store
    pub = ce.ShmPublisher(name, weights(0), shm_prefix=prefix, max_pins_per_reader=2)
    pub.publish(weights(0))
    sub = ce.ShmSubscriber(name, shm_prefix=prefix)
    held = sub.acquire()
    embed = held["embed.weight"]
    for v in range(1, 8):
        pub.publish(weights(v))
        assert mismatch(held, 0) == ""
        stats = pub.stats()
        assert stats["pinned"] == [(0, 1)]
        assert stats["versions_in_memory"] == [0, v]
        assert stats["bytes_held"] <= stats["max_bytes_held"]
    assert pub.stats()["segments_recycled"] >= 5  # newer versions reused freed segments, never the pinned one
    # A second distinct pin is allowed, a third is not (max_pins_per_reader=2).
    latest = sub.acquire()
    pub.publish(weights(8))
    with pytest.raises(errors.ResourceExhausted, match="already pins 2 versions"):
        sub.acquire()
    latest.release()
    # Releasing the handle leaves the version pinned by the view taken from it.
    held.release()
    assert pub.stats()["pinned"] == [(0, 1)]
    assert torch.equal(embed, weights(0)["embed.weight"])
    del embed
    gc.collect()
    stats = pub.stats()
    assert stats["pinned"] == [] and stats["versions_in_memory"] == [8]
    sub.close()
    pub.close()


def test_failed_publishes_leave_the_old_version_serving(store, monkeypatch):
    prefix, name = store
    pub = ce.ShmPublisher(name, weights(0), shm_prefix=prefix)
    pub.publish(weights(3), version=3)
    sub = ce.ShmSubscriber(name, shm_prefix=prefix)

    class Boom(Exception):
        pass

    def interrupted_on_the_third_tensor():
        real_put = ce.StagedPublish.put
        calls = []

        def put(self, name, tensor):
            calls.append(name)
            if len(calls) == 3:
                raise KeyboardInterrupt  # Ctrl-C half way through the puts
            real_put(self, name, tensor)

        with monkeypatch.context() as m:
            m.setattr(ce.StagedPublish, "put", put)
            pub.publish(weights(4))

    wrong_shape = dict(weights(4), **{"embed.weight": torch.zeros(32, 64)})
    wrong_dtype = dict(weights(4), **{"steps": torch.zeros(4, dtype=torch.int32)})
    missing = {k: v for k, v in weights(4).items() if k != "mask"}
    extra = dict(weights(4), extra=torch.zeros(1))
    not_a_tensor = dict(weights(4), mask=[True] * 8)

    def staged_then_raise():
        with pub.begin_publish() as staged:
            staged.put("embed.weight", weights(4)["embed.weight"])
            raise Boom("trainer failed half way")

    def commit_with_a_tensor_missing():
        with pub.begin_publish() as staged:
            for k, t in missing.items():
                staged.put(k, t)

    cases = [
        (lambda: pub.publish(wrong_shape), ValueError, r"'embed.weight' is torch.float32 \[32, 64\], the layout says"),
        (lambda: pub.publish(wrong_dtype), ValueError, r"'steps' is torch.int32 \[4\], the layout says torch.int64"),
        (lambda: pub.publish(missing), ValueError, r"missing 'mask'"),
        (lambda: pub.publish(extra), ValueError, r"not in the layout: 'extra'"),
        (lambda: pub.publish(not_a_tensor), TypeError, r"tensor 'mask': a torch.Tensor, not list"),
        (interrupted_on_the_third_tensor, KeyboardInterrupt, ""),
        (staged_then_raise, Boom, "half way"),
        (commit_with_a_tensor_missing, errors.FailedPrecondition, "mask"),
        (lambda: pub.publish(weights(4), version=3), errors.AlreadyExists, ""),
        (lambda: pub.publish(weights(4), version=2), errors.FailedPrecondition, ""),
    ]
    for i, (call, exc, match) in enumerate(cases):
        with pytest.raises(exc, match=match):
            call()
        stats = pub.stats()
        assert stats["latest_version"] == 3 and stats["commits"] == 1, f"case {i}"
        assert stats["staging_version"] == -1 and stats["versions_in_memory"] == [3], f"case {i}"
        with sub.acquire() as w:
            assert w.version == 3 and mismatch(w, 3) == "", f"case {i}"
    assert pub.stats()["aborts"] == 3  # the three that had begun staging
    # The next publish takes the next number and works.
    assert pub.publish(weights(4)) == 4
    with sub.acquire() as w:
        assert mismatch(w, 4) == ""
    sub.close()
    pub.close()


def test_staged_publish_by_hand(store):
    prefix, name = store
    pub = ce.ShmPublisher(name, [ce.TensorSpec("b", torch.float32, (3,)), ce.TensorSpec("a", torch.int64, (2, 2))],
                          shm_prefix=prefix)
    assert [s.name for s in pub.layout] == ["b", "a"]  # an explicit layout keeps its order
    staged = pub.begin_publish(5)
    assert staged.version == 5 and staged.state == "open"
    staged.put("a", torch.arange(4).reshape(2, 2).t())  # non-contiguous: copied contiguous
    with pytest.raises(errors.AlreadyExists):
        staged.put("a", torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="not in the store's layout"):
        staged.put("c", torch.zeros(3))
    with pytest.raises(errors.FailedPrecondition, match="'b'"):
        staged.commit()  # a tensor missing: the publish stays open
    assert staged.state == "open"
    with pytest.raises(errors.FailedPrecondition, match="another publish"):
        pub.begin_publish(6)
    staged.put("b", torch.tensor([1.0, 2.0, 3.0], requires_grad=True))
    assert staged.commit() == 5 and staged.state == "committed"
    with pytest.raises(errors.FailedPrecondition, match="already committed or aborted"):
        staged.put("b", torch.zeros(3))
    sub = ce.ShmSubscriber(name, shm_prefix=prefix)
    with sub.acquire(5) as w:
        assert torch.equal(w["a"], torch.tensor([[0, 2], [1, 3]]))
        assert list(w) == ["b", "a"]
    aborted = pub.begin_publish()
    aborted.put("b", torch.zeros(3))
    aborted.abort()
    assert aborted.state == "aborted" and pub.latest_version() == 5
    sub.close()
    pub.close()


def test_wait_for_version_waits_without_the_gil_and_times_out(store):
    prefix, name = store
    pub = ce.ShmPublisher(name, weights(0), shm_prefix=prefix)
    sub = ce.ShmSubscriber(name, shm_prefix=prefix)
    start = time.monotonic()
    expired = r"no version >= 0 .* within 300 ms; latest is -1; publisher pid \d+ is alive"
    with pytest.raises(errors.Timeout, match=expired):
        sub.wait_for_version(0, 0.3)
    assert 0.3 <= time.monotonic() - start < 5
    with pytest.raises(TimeoutError):
        sub.wait_for_version(0, 0)
    with pytest.raises(errors.NotFound, match="no version has been committed"):
        sub.acquire()

    # Signal handlers run during a long wait, and their exception ends it.
    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        start = time.monotonic()
        with pytest.raises(Interrupted):
            sub.wait_for_version(0, 30.0)
        assert time.monotonic() - start < 5
        timer.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)

    # A waiter blocks only itself: this thread publishes meanwhile.
    got = {}

    def wait():
        with sub.wait_for_version(2, 20.0) as w:
            got["version"], got["ok"] = w.version, mismatch(w, w.version) == ""

    waiter = threading.Thread(target=wait)
    waiter.start()
    for v in range(3):
        time.sleep(0.05)
        pub.publish(weights(v))
    waiter.join(timeout=20)
    assert got == {"version": 2, "ok": True}
    sub.close()
    pub.close()


# ---------------------------------------------------------------- other processes


def test_a_reader_process_reads_python_versions_and_its_pins_die_with_it(store):
    prefix, name = store
    pub = ce.ShmPublisher(name, weights(0), shm_prefix=prefix, max_readers=1)
    pub.publish(weights(0))
    child = start_child("read-and-hold", prefix, name, 1)
    try:
        wait_until(lambda: pub.stats()["readers_attached"] == 1 or child.poll() is not None, 60,
                   "the reader process to attach")
        assert child.poll() is None, f"the reader process died: {child.stderr.read().decode()}"
        pub.publish(weights(1))
        line = read_line(child, 60)
        assert line, "the reader process said nothing"
        report = json.loads(line)
        assert report == {"pid": child.pid, "version": 1, "views": "", "copies": ""}
        assert pub.stats()["pinned"] == [(1, 1)]
        # SIGKILLed while holding version 1: the publisher goes on, and the
        # next commit reclaims the slot and frees the version.
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        for v in range(2, 5):
            pub.publish(weights(v))
        stats = pub.stats()
        assert stats["pinned"] == [] and stats["versions_in_memory"] == [4]
        assert stats["readers_attached"] == 0 and stats["dead_readers"] == 0
        # Its slot (the only one) is free again.
        with ce.ShmSubscriber(name, shm_prefix=prefix) as sub, sub.acquire() as w:
            assert mismatch(w, 4) == ""
    finally:
        kill(child)
    pub.close()


def test_writing_into_a_shared_memory_view_kills_the_writer(store):
    prefix, name = store
    pub = ce.ShmPublisher(name, weights(0), shm_prefix=prefix)
    pub.publish(weights(0))
    child = start_child("write-to-view", prefix, name, 0)
    try:
        assert read_line(child, 60) == "ready"
        assert child.wait(timeout=30) == -signal.SIGSEGV
    finally:
        kill(child)
    with ce.ShmSubscriber(name, shm_prefix=prefix) as sub, sub.acquire() as w:
        assert mismatch(w, 0) == ""
        w.verify()
    pub.close()


# The layout and values of the C++ tests' weights (shm_test_util.cc:
# TestLayout, MakeTensor): every element encodes (version, tensor, index).
CPP_LAYOUT = [
    ce.TensorSpec("embed", torch.float32, (32, 512)),
    ce.TensorSpec("w_i64", torch.int64, (4096,)),
    ce.TensorSpec("w_i32", torch.int32, (64, 128)),
    ce.TensorSpec("norm", torch.float32, (4096,)),
]


def cpp_weights(v: int) -> dict:
    out = {}
    for t, spec in enumerate(CPP_LAYOUT):
        i = torch.arange(math.prod(spec.shape), dtype=torch.int64)
        if spec.dtype == torch.float32:
            x = (v * 4096 + (i + t * 37) % 4096).to(torch.float32)
        elif spec.dtype == torch.int64:
            x = (v << 32) | (t << 24) | i
        else:
            x = (v * 1000000 + t * 100000 + i % 100000).to(torch.int32)
        out[spec.name] = x.reshape(spec.shape)
    return out


def cpp_test_binary() -> str:
    path = os.environ.get("SLUICE_CHECKPOINT_ENGINE_SHM_TEST")
    if path is None:
        path = str(REPO / "build" / "release" / "src" / "checkpoint_engine" / "sluice_checkpoint_engine_shm_test")
        if not os.access(path, os.X_OK):
            pytest.skip(f"no C++ peer at {path} (build sluice_checkpoint_engine_shm_test)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"SLUICE_CHECKPOINT_ENGINE_SHM_TEST={path} is not executable")
    return path


def run_cpp_child(mode: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [cpp_test_binary(), "--gtest_also_run_disabled_tests", f"--gtest_filter=ShmChild.DISABLED_{mode}",
         "--gtest_brief=1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ, **env))


def test_a_cpp_reader_reads_versions_published_from_python(store):
    prefix, name = store
    versions = 12
    pub = ce.ShmPublisher(name, CPP_LAYOUT, shm_prefix=prefix)
    child = run_cpp_child("Reader", {"SLUICE_SHM_TEST_PREFIX": prefix, "SLUICE_SHM_TEST_STORE": name,
                                     "SLUICE_SHM_TEST_VERSIONS": str(versions), "SLUICE_SHM_TEST_SEED": "7"})
    try:
        wait_until(lambda: pub.stats()["readers_attached"] == 1 or child.poll() is not None, 30,
                   "the C++ reader to attach")
        for v in range(1, versions + 1):
            pub.publish(cpp_weights(v), version=v)
            time.sleep(0.002)
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10)
    assert child.returncode == 0, out.decode()
    assert "snapshots checked" in out.decode()  # it pinned, checked views and verified copies
    pub.close()


def test_python_reads_versions_published_from_cpp(store):
    prefix, name = store
    versions = 8
    child = run_cpp_child("Publisher", {"SLUICE_SHM_TEST_PREFIX": prefix, "SLUICE_SHM_TEST_STORE": name,
                                        "SLUICE_SHM_TEST_VERSIONS": str(versions),
                                        "SLUICE_SHM_TEST_WAIT_READERS": "1"})
    seen = []
    try:
        with ce.ShmSubscriber(name, shm_prefix=prefix, attach_timeout=30.0, expected_layout=CPP_LAYOUT) as sub:
            while not seen or seen[-1] < versions:
                with sub.wait_for_version(seen[-1] + 1 if seen else 1, 30.0) as w:
                    want = cpp_weights(w.version)
                    for spec in CPP_LAYOUT:
                        assert torch.equal(w[spec.name], want[spec.name]), f"version {w.version} {spec.name}"
                    copy = {k: torch.empty_like(t) for k, t in want.items()}
                    w.copy_into(copy)
                    assert all(torch.equal(copy[k], want[k]) for k in want)
                    seen.append(w.version)
            out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10)
    assert child.returncode == 0, out.decode()
    assert seen == sorted(set(seen)) and seen[-1] == versions


# ---------------------------------------------------------------- copies, devices, the in-process store


def test_copy_into_modules_state_dicts_and_strided_tensors(store):
    prefix, name = store
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    trained = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    with torch.no_grad():
        for p in trained.parameters():
            p.uniform_(-1, 1)
    pub = ce.ShmPublisher(name, shm_prefix=prefix)
    # Parameters that require grad, and a transposed (non-contiguous) view.
    state = dict(trained.named_parameters())
    state["0.weight"] = trained[0].weight.t().contiguous().t()
    assert not state["0.weight"].is_contiguous()
    pub.publish(state)
    sub = ce.ShmSubscriber(name, shm_prefix=prefix)
    with sub.acquire() as w:
        w.copy_into(model)
        for k, t in trained.state_dict().items():
            assert torch.equal(model.state_dict()[k], t), k
        # A strided destination goes through a host buffer.
        dst = {k: torch.zeros(t.shape[::-1], dtype=t.dtype).t() if t.dim() == 2 else torch.zeros_like(t)
               for k, t in w.items()}
        assert not dst["0.weight"].is_contiguous()
        w.copy_into(dst)
        assert all(torch.equal(dst[k], w[k]) for k in w)
        # Mismatches are refused before anything is copied.
        target = {k: torch.zeros_like(t) for k, t in w.items()}
        target["1.bias"] = torch.zeros(4)
        with pytest.raises(ValueError, match=r"'1.bias' is torch.float32 \[4\], the layout says torch.float32 \[3\]"):
            w.copy_into(target)
        assert all(t.count_nonzero() == 0 for t in target.values())
        with pytest.raises(ValueError, match="missing '0.weight', '1.bias', '1.weight'"):
            w.copy_into({"0.bias": torch.zeros(3)})
        partial = {"0.bias": torch.zeros(3), "unrelated": torch.zeros(1)}
        w.copy_into(partial, strict=False)
        assert torch.equal(partial["0.bias"], trained[0].bias.detach()) and partial["unrelated"].item() == 0
        with pytest.raises(ValueError, match="meta device"):
            w.copy_into({k: torch.empty_like(t, device="meta") for k, t in w.items()})
        with pytest.raises(TypeError, match="Mapping"):
            w.copy_into([torch.zeros(3)])
    sub.close()
    pub.close()


def test_version_store_in_process():
    store = ce.VersionStore(weights(0), max_pinned_versions=2)
    assert store.latest_version() == ce.NO_VERSION
    with pytest.raises(errors.NotFound):
        store.acquire()
    assert store.publish(weights(0)) == 0
    first = store.acquire()
    got = {}
    waiter = threading.Thread(target=lambda: got.update(w=store.wait_for_version(3, 20.0)))
    waiter.start()
    for v in range(1, 4):
        store.publish(weights(v))
    waiter.join(timeout=20)
    assert got["w"].version == 3 and mismatch(got["w"], 3) == ""
    assert mismatch(first, 0) == ""  # pinned: intact
    assert store.stats()["pinned"] == [(0, len(first) + 1), (3, len(got["w"]) + 1)]  # each view is a pin
    store.publish(weights(4))
    with pytest.raises(errors.ResourceExhausted):
        store.acquire()  # a third distinct version (max_pinned_versions=2)
    with pytest.raises(ValueError, match=r"'steps' is torch.int32"):
        store.publish(dict(weights(5), steps=torch.zeros(4, dtype=torch.int32)))
    assert store.latest_version() == 4
    copy = {k: torch.zeros_like(t) for k, t in weights(0).items()}
    got["w"].copy_into(copy)
    assert mismatch(copy, 3) == ""
    first.release()
    got["w"].release()
    gc.collect()
    assert store.stats()["pinned"] == [] and store.stats()["versions_in_memory"] == [4]
    with pytest.raises(errors.Timeout, match="no version >= 9 was committed to the in-process store within 50 ms"):
        store.wait_for_version(9, 0.05)
    store.close()
    with pytest.raises(errors.Aborted):
        store.publish(weights(6))


def test_the_largest_version_is_refused_clearly_and_the_store_keeps_working():
    # Version 2**63 - 1 wedged the store: the default next publish (latest + 1)
    # failed with a pybind signature dump, and no version could follow.
    store = ce.VersionStore(weights(0))
    with pytest.raises(ValueError, match=r"version must be in 0\.\.4611686018427387904, not 9223372036854775807"):
        store.publish(weights(0), version=2**63 - 1)
    assert store.latest_version() == ce.NO_VERSION  # nothing was stored
    assert store.publish(weights(1), version=2**62 - 1) == 2**62 - 1
    assert store.publish(weights(2)) == 2**62  # the default next one, the last there is
    with pytest.raises(ValueError, match="version 4611686018427387904 is the last a store accepts"):
        store.publish(weights(3))
    assert mismatch(store.acquire(), 2) == ""  # and it keeps serving
    store.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_are_published_through_the_host_and_copied_back():
    store = ce.VersionStore(weights(0))
    store.publish({k: t.cuda() for k, t in weights(1).items()})
    with store.acquire() as w:
        assert all(t.device.type == "cpu" for t in w.values()) and mismatch(w, 1) == ""
        on_gpu = {k: torch.zeros_like(t, device="cuda") for k, t in weights(0).items()}
        w.copy_into(on_gpu)
        assert mismatch({k: t.cpu() for k, t in on_gpu.items()}, 1) == ""
    store.close()


# ---------------------------------------------------------------- bad inputs and closing


def test_bad_inputs_raise_clear_errors_and_store_nothing(store):
    prefix, name = store
    pub = ce.ShmPublisher(name, weights(0), shm_prefix=prefix)
    pub.publish(weights(0))
    sub = ce.ShmSubscriber(name, shm_prefix=prefix)
    before = pub.stats()
    cases = [
        (lambda: pub.publish([torch.zeros(1)]), TypeError, "state_dict must be a Mapping"),
        (lambda: pub.publish({}), ValueError, "state_dict is empty"),
        (lambda: pub.publish({1: torch.zeros(1)}), TypeError, r"tensor names must be str, not int \(1\)"),
        (lambda: pub.publish(dict(weights(1), mask=1.5)), TypeError, "tensor 'mask': a torch.Tensor, not float"),
        (lambda: pub.publish(dict(weights(1), mask=torch.zeros(8, dtype=torch.complex64))), TypeError,
         "tensor 'mask': dtype torch.complex64 is not supported"),
        (lambda: pub.publish(dict(weights(1), mask=torch.zeros(8).to_sparse())), TypeError,
         "tensor 'mask': only dense"),
        (lambda: pub.publish(dict(weights(1), mask=torch.zeros(8, dtype=torch.bool, device="meta"))), ValueError,
         "tensor 'mask' is on the meta device"),
        (lambda: pub.publish(weights(1), version=-1), ValueError, "version must be in 0"),
        (lambda: pub.publish(weights(1), version=True), TypeError, "version must be an int"),
        (lambda: pub.publish(weights(1), version=1.0), TypeError, "version must be an int"),
        (lambda: sub.acquire(-2), ValueError, "version must be in 0"),
        (lambda: sub.acquire(5), errors.NotFound, "version 5 is not in shared memory"),
        (lambda: sub.wait_for_version(1, -1), ValueError, "timeout must be >= 0"),
        (lambda: sub.wait_for_version(1, float("nan")), ValueError, "timeout must be"),
        (lambda: sub.wait_for_version("1", 1), TypeError, "at_least must be an int"),
        (lambda: ce.ShmPublisher("bad/name"), ValueError, "store_name 'bad/name' must be 1..100 characters"),
        (lambda: ce.ShmPublisher("a b", shm_prefix=prefix), ValueError, "store_name 'a b'"),
        (lambda: ce.ShmPublisher("", shm_prefix=prefix), ValueError, "store_name ''"),
        (lambda: ce.ShmPublisher("x" * 101, shm_prefix=prefix), ValueError, "must be 1..100"),
        (lambda: ce.ShmPublisher(b"policy", shm_prefix=prefix), TypeError, "store_name must be a str"),
        (lambda: ce.ShmSubscriber(name, shm_prefix="../etc"), ValueError, "shm_prefix '../etc'"),
        (lambda: ce.ShmPublisher(name, weights(0), shm_prefix=prefix), errors.FailedPrecondition,
         "live publisher"),
        (lambda: ce.ShmPublisher("other", [], shm_prefix=prefix), ValueError, "layout is empty"),
        (lambda: ce.ShmPublisher("other", [("a", torch.float32, (1,)), ("a", torch.int8, (2,))], shm_prefix=prefix),
         ValueError, "names tensor 'a' twice"),
        (lambda: ce.ShmPublisher("other", [("a", torch.complex64, (1,))], shm_prefix=prefix), TypeError,
         "dtype torch.complex64 is not supported"),
        (lambda: ce.ShmPublisher("other", [("a", torch.float32, (-1,))], shm_prefix=prefix), ValueError,
         "negative dimension"),
        (lambda: ce.ShmPublisher("other", "weights", shm_prefix=prefix), TypeError, "layout must be"),
        (lambda: ce.ShmPublisher("other", shm_prefix=prefix).publish({"a": [1]}), TypeError,
         "tensor 'a': a torch.Tensor, not list"),
        (lambda: ce.ShmSubscriber("missing", shm_prefix=prefix), errors.NotFound, ""),
        (lambda: ce.ShmSubscriber(name, shm_prefix=prefix, expected_layout={"x": torch.zeros(1)}),
         errors.FailedPrecondition, "layout differs"),
        (lambda: ce.ShmSubscriber(name, shm_prefix=prefix, attach_timeout="1"), TypeError, "attach_timeout"),
        (lambda: ce.ShmPublisher(name, shm_prefix=prefix, max_readers=0), ValueError, "max_readers must be in 1..4096"),
        (lambda: ce.VersionStore(None), ValueError, "needs a layout"),
        (lambda: checksum_of(sub, "nope"), errors.NotFound, "no tensor 'nope'"),
    ]
    for i, (call, exc, match) in enumerate(cases):
        with pytest.raises(exc, match=match):
            call()
        after = pub.stats()
        for key in ("latest_version", "commits", "aborts", "versions_in_memory", "staging_version", "pinned"):
            assert after[key] == before[key], f"case {i}: {key} {before[key]} -> {after[key]}"
    assert segments(prefix) == [f"{prefix}.{name}.control", f"{prefix}.{name}.v0"]
    with sub.acquire() as w:
        assert mismatch(w, 0) == ""
    sub.close()
    pub.close()


def checksum_of(sub: "ce.ShmSubscriber", name: str) -> int:
    with sub.acquire() as w:
        return w.checksum(name)


def test_closing_detaches_and_views_outlive_their_subscriber(store):
    prefix, name = store
    pub = ce.ShmPublisher(name, shm_prefix=prefix)
    pub.publish(weights(0))
    sub = ce.ShmSubscriber(name, shm_prefix=prefix)
    w = sub.acquire()
    embed = w["embed.weight"]
    sub.close()
    sub.close()  # idempotent
    with pytest.raises(errors.Aborted, match="ShmSubscriber is closed"):
        sub.latest_version()
    assert mismatch(w, 0) == ""  # the handle keeps the attachment
    assert pub.stats()["readers_attached"] == 1
    w.release()
    assert pub.stats()["readers_attached"] == 1  # the view still holds it
    del embed
    gc.collect()
    assert pub.stats()["readers_attached"] == 0
    pub.close()
    with pytest.raises(errors.Aborted, match="ShmPublisher is closed"):
        pub.publish(weights(1))
    assert segments(prefix) == []
    # A new publisher creates the store again; versions start over.
    with ce.ShmPublisher(name, weights(0), shm_prefix=prefix) as again:
        assert again.latest_version() == ce.NO_VERSION
        assert again.publish(weights(0)) == 0
    assert segments(prefix) == []
    ce.destroy_shm_store(name, shm_prefix=prefix)  # nothing left: fine
    with pytest.raises(errors.NotFound):
        ce.sweep_shm_store(name, shm_prefix=prefix)
