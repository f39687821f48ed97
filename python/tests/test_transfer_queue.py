"""sluice.transfer_queue against a real sluice_queue_server process (over TCP
and over the same-host shared-memory arena), plus the in-process hub."""

import gc
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import sluice
from sluice import errors
from sluice import transfer_queue as tq

from conftest import SHM_FLAGS, wait_until

ALL_DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def sample(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g, dtype=torch.int64).to(dtype)


def arena_ranges(segment):
    """The address ranges where this process maps the arena `segment`."""
    path = "/dev/shm" + segment
    out = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == path:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    assert out, f"{path} is not mapped in this process"
    return out


def in_arena(t, ranges):
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    return any(lo <= start and end <= hi for lo, hi in ranges)


# ---------------------------------------------------------------- round trips


def test_import_and_version():
    assert sluice.__version__
    assert issubclass(tq.Error, Exception) and tq.Error is errors.Error
    assert issubclass(errors.Timeout, TimeoutError) and issubclass(errors.InvalidArgument, ValueError)


def test_round_trip_fixed_variable_and_string_columns(hub):
    _, client = hub
    n = 5
    data = {f"fixed_{str(d).split('.')[1]}": sample(d, (n, 3, 2), i) for i, d in enumerate(ALL_DTYPES)}
    data["scalar"] = torch.arange(n, dtype=torch.int64) * 7
    data["tokens"] = [torch.arange(i * 3, dtype=torch.int32) for i in range(n)]  # row 0 is empty
    data["pairs"] = [sample(torch.float32, (i + 1, 2), 100 + i) for i in range(n)]
    data["text"] = ["", "plain", "héllo wörld", "数据 🚀", "a\x00b"]
    data["transposed"] = torch.arange(n * 4, dtype=torch.float32).reshape(4, n).t()  # not contiguous: copied
    assert not data["transposed"].is_contiguous()

    meta = client.put(data, partition_id="train", group_ids=list(range(n)), policy_versions=3,
                      token_lengths=[10, 11, 12, 13, 14], tags=[{"i": str(i)} for i in range(n)])
    assert meta.size == n and meta.partition_id == "train" and meta.lease_id == 0
    assert set(meta.fields) == set(data)

    schemas = client.describe()
    assert schemas["tokens"].shape == (None,) and schemas["tokens"].dtype == torch.int32
    assert schemas["pairs"].shape == (None, 2)
    assert schemas["scalar"].shape == ()
    assert schemas["fixed_bfloat16"].shape == (3, 2) and schemas["fixed_bfloat16"].dtype == torch.bfloat16
    assert schemas["text"].string and not schemas["tokens"].string
    assert not any(name.startswith(tq.STRING_MARKER_PREFIX) for name in schemas)

    got_meta = client.get_meta(list(data), n, "train", task_name="trainer", timeout=5)
    assert sorted(got_meta.global_indexes) == sorted(meta.global_indexes)
    assert got_meta.lease_id > 0 and got_meta.task_name == "trainer"
    assert 0 < got_meta.time_left() <= 60.5
    by_row = {r: i for i, r in enumerate(meta.global_indexes)}
    order = [by_row[r] for r in got_meta.global_indexes]  # position in the put of each leased row
    for pos, tags in zip(order, got_meta.tags):
        assert tags == tq.RowTags(group_id=pos, policy_version=3, token_length=10 + pos, user={"i": str(pos)})

    out = client.get_data(got_meta)
    assert list(out) == list(got_meta.fields)
    for name, value in data.items():
        if isinstance(value, torch.Tensor):
            assert out[name].dtype == value.dtype and out[name].shape == value.shape, name
            assert torch.equal(out[name], value[order]), name
        elif isinstance(value[0], torch.Tensor):
            assert len(out[name]) == n
            for pos, t in zip(order, out[name]):
                assert t.dtype == value[pos].dtype and torch.equal(t, value[pos]), name
        else:
            assert out[name] == [value[pos] for pos in order]
            assert all(type(s) is str for s in out[name])

    # A subset, fixed columns unstacked (one tensor per row).
    part = client.get_data(got_meta, ["scalar", "fixed_float32"], stack=False)
    assert list(part) == ["scalar", "fixed_float32"]
    assert [int(t) for t in part["scalar"]] == [7 * pos for pos in order]
    assert all(t.shape == (3, 2) for t in part["fixed_float32"])

    assert client.ack(got_meta)["rows_acked"] == n
    stats = client.stats()
    assert stats["tasks"]["trainer"]["acked_total"] == n
    assert stats["tasks"]["trainer"]["ready"] == 0


def test_put_columns_of_leased_rows_then_other_task(hub):
    _, client = hub
    client.register_task("reward")
    client.register_task("train")
    client.register_column("reward", torch.float32, ())
    client.put({"prompt": [torch.tensor([1, 2]), torch.tensor([3])]}, partition_id="p")
    # The reward task leases rows, writes their reward and acks them.
    m = client.get_meta("prompt", 2, "p", task_name="reward", timeout=5)
    with pytest.raises(errors.Timeout):
        client.get_meta(["prompt", "reward"], 1, "p", task_name="train")  # not written yet
    m2 = client.put({"reward": torch.tensor([0.5, 1.5]), "verdict": ["ok", "bad"]}, m, token_lengths=[2, 1])
    assert m2.lease_id == m.lease_id and m2.fields == ("prompt", "reward", "verdict")
    client.ack(m)
    t = client.get_meta(["prompt", "reward", "verdict"], 2, "p", task_name="train", timeout=5)
    d = client.get_data(t)
    first = {r: i for i, r in enumerate(m.global_indexes)}
    assert [float(x) for x in d["reward"]] == [[0.5, 1.5][first[r]] for r in t.global_indexes]
    assert d["verdict"] == [["ok", "bad"][first[r]] for r in t.global_indexes]
    assert sorted(tag.token_length for tag in t.tags) == [1, 2]
    client.ack(t)
    assert client.stats()["rows"] == 0, "rows acked by both tasks are freed"


def test_sampling_whole_groups_and_release(hub):
    _, client = hub
    client.create_partition("g", group_size=2)
    client.put({"x": torch.arange(6)}, partition_id="g", group_ids=[0, 0, 1, 1, 2, 2],
               policy_versions=[1, 1, 2, 2, 0, 0], token_lengths=[5, 5, 3, 3, 4, 4])
    m = client.get_meta("x", 4, "g", task_name="t", sampling_config={"n_samples_per_prompt": 2})
    groups = [tag.group_id for tag in m.tags]
    assert sorted(groups) == [0, 0, 2, 2], "oldest policy first, whole groups"
    assert client.release(m)["rows_returned"] == 4
    m = client.get_meta("x", 2, "g", task_name="t", sampling_config={"group_size": 2, "min_policy_version": 2})
    assert [tag.group_id for tag in m.tags] == [1, 1]
    deadline = client.renew(m, lease_timeout=120)
    assert 119 < deadline - time.monotonic() <= 120
    client.release(m)
    with pytest.raises(errors.FailedPrecondition):
        client.renew(m)  # released: nothing to renew
    with pytest.raises(errors.FailedPrecondition):
        client.ack(m)  # released: cannot be acked
    with pytest.raises(errors.InvalidArgument) as e:
        client.get_meta("x", 3, "g", task_name="t", sampling_config={"group_size": 2})
    assert e.value.code == "InvalidArgument" and "multiple" in e.value.message
    m = client.get_meta("x", 6, "g", task_name="t", sampling_config={"group_size": 2, "dp_ranks": 3})
    assert m.dp_ranks == 3 and sorted(m.ranks) == [0, 0, 1, 1, 2, 2]
    assert sorted(len(m.rows_of_rank(r)) for r in range(3)) == [2, 2, 2]


def test_a_dead_holders_leases_are_released_at_once(hub):
    _, client = hub
    client.put({"x": torch.arange(3)}, partition_id="h")
    held = client.get_meta("x", 2, "h", task_name="t", lease_timeout=600, holder="worker-1/4242")
    other = client.get_meta("x", 1, "h", task_name="t", lease_timeout=600, holder="worker-2/4343")
    # worker-1 died: its supervisor hands its rows back now, not in 10 minutes.
    assert client.release_holder("worker-1/4242") == {"leases_released": 1, "rows_returned": 2, "rows_cleared": 0}
    again = client.get_meta("x", 2, "h", task_name="t")
    assert sorted(again.global_indexes) == sorted(held.global_indexes)
    with pytest.raises(errors.FailedPrecondition):
        client.ack(held)
    client.ack(other)
    assert client.release_holder("worker-1/4242")["leases_released"] == 0
    with pytest.raises(ValueError):
        client.release_holder("")
    with pytest.raises(ValueError):
        client.get_meta("x", 1, "h", task_name="t", holder="h" * 257)


def test_kv_layer(hub):
    _, client = hub
    client.kv_batch_put(["u1", "u2"], "kv", {"prompt": [torch.tensor([1, 2, 3]), torch.tensor([4])],
                                               "text": ["one", "two"]}, tags=[{"status": "pending"}] * 2)
    client.kv_put("u2", "kv", {"score": torch.tensor(0.25)}, tag={"status": "done"})
    client.kv_put("u3", "kv", tag={"status": "new"})  # a key with tags only
    assert client.kv_list("kv") == {"kv": {"u1": {"status": "pending"}, "u2": {"status": "done"},
                                           "u3": {"status": "new"}}}
    entries = {e.key: e for e in client.kv_entries("kv")}
    assert entries["u2"].fields == ("prompt", "text", "score") and entries["u3"].fields == ()

    got = client.kv_batch_get(["u2", "u1"], "kv")  # the fields both have
    assert list(got) == ["prompt", "text"]
    assert [t.tolist() for t in got["prompt"]] == [[4], [1, 2, 3]]
    assert got["text"] == ["two", "one"]
    assert client.kv_batch_get("u2", "kv", "score")["score"].tolist() == [0.25]
    with pytest.raises(errors.NotFound):
        client.kv_batch_get(["u1"], "kv", ["score"])
    with pytest.raises(errors.NotFound):
        client.kv_batch_get(["u1", "nope"], "kv")
    with pytest.raises(errors.AlreadyExists):
        client.kv_put("u1", "kv", {"text": "again"})
    assert client.kv_clear(["u1", "u3"], "kv") == 2
    assert list(client.kv_list("kv")["kv"]) == ["u2"]
    client.kv_put("u1", "kv", {"text": "replaced"})
    assert client.kv_batch_get("u1", "kv")["text"] == ["replaced"]


def test_columns_registered_by_another_client(hub):
    server, producer = hub
    consumer = tq.connect(server.endpoint)
    producer.kv_put("k", "kv", {"first": torch.tensor([1])})
    assert consumer.kv_batch_get("k", "kv")["first"].tolist() == [[1]]  # the consumer now caches the schemas
    producer.kv_put("k", "kv", {"late_text": "hi", "late_fixed": torch.tensor([2.0, 3.0])})
    got = consumer.kv_batch_get("k", "kv")  # columns it has not seen: learned from the hub, converted alike
    assert list(got) == ["first", "late_text", "late_fixed"], "in registration order"
    assert got["late_text"] == ["hi"]
    assert torch.equal(got["late_fixed"], torch.tensor([[2.0, 3.0]]))
    consumer.close()


def test_marking_a_server_registered_column_as_strings(start_server):
    server = start_server("--columns=answer:U8:*,score:F32:", "--tasks=reward")
    client = tq.connect(server.endpoint)
    assert client.tasks() == ["reward"]
    schemas = client.describe()
    assert schemas["answer"] == tq.ColumnSchema("answer", torch.uint8, (None,)) and not schemas["answer"].string
    with pytest.raises(TypeError):
        client.put({"answer": ["42"]}, partition_id="p")
    raw = client.put({"answer": [torch.tensor(list(b"17"), dtype=torch.uint8)]}, partition_id="p")
    assert client.register_column("answer", string=True).string
    assert client.describe()["answer"].string
    client.put({"answer": ["42"], "score": torch.tensor([1.0])}, partition_id="p")
    m = client.get_meta("answer", 2, "p", task_name="reward")
    assert client.get_data(m)["answer"] == ["17", "42"], "bytes a C++ producer wrote read as str too"
    assert raw.size == 1
    client.close()


# ---------------------------------------------------------------- zero copy


def test_shm_reads_view_the_arena_and_pin_it(start_server):
    server = start_server(*SHM_FLAGS)
    client = tq.connect(server.endpoint, shm="required")
    assert client.transport == "shm"
    meta = client.put({"v": [torch.full((1000,), 1.0), torch.full((10,), 5.0)], "f": torch.ones(2, 64)},
                      partition_id="p")
    ranges = arena_ranges(client.shm_segment)

    a = client.get_data(meta)
    assert all(in_arena(t, ranges) for t in a["v"]), "variable-length rows view the arena"
    assert not in_arena(a["f"], ranges), "a stacked fixed column is a new tensor"
    unstacked = client.get_data(meta, "f", stack=False)["f"]
    assert all(in_arena(t, ranges) for t in unstacked)
    b = client.get_data(meta, "v")
    assert [t.data_ptr() for t in b["v"]] == [t.data_ptr() for t in a["v"]], "two reads share the bytes"

    # Over a connection without the arena the same rows arrive in messages.
    plain = tq.connect(server.endpoint, shm="off")
    assert plain.transport == "tcp"
    assert not any(in_arena(t, ranges) for t in plain.get_data(meta, "v")["v"])
    plain.close()

    del a, b, unstacked
    gc.collect()
    client.clear_partition("p")

    # A held view pins its block: clearing its row and writing a new one of
    # the same size does not reuse it (first fit would put it there)...
    m1 = client.put({"v": [torch.full((1000,), 1.0)]}, partition_id="q")
    view = client.get_data(m1)["v"][0]
    address = view.data_ptr()
    client.clear_partition("q")
    m2 = client.put({"v": [torch.full((1000,), 2.0)]}, partition_id="q")
    fresh = client.get_data(m2)["v"][0]
    assert fresh.data_ptr() != address
    assert torch.equal(view, torch.full((1000,), 1.0)), "the held view still reads the old row"
    # ... and once dropped, the block is reused by the next write of that size.
    del view, fresh
    gc.collect()
    client.clear_partition("q")
    m3 = client.put({"v": [torch.full((1000,), 3.0)]}, partition_id="q")
    again = client.get_data(m3)["v"][0]
    assert again.data_ptr() == address
    assert torch.equal(again, torch.full((1000,), 3.0))
    client.close()


# ---------------------------------------------------------------- exactly once


VICTIM = textwrap.dedent(
    """
    import json, sys, time
    from sluice import transfer_queue as tq
    client = tq.connect(sys.argv[1])
    meta = client.get_meta(["x", "text"], 6, "work", task_name="train", timeout=10, lease_timeout=1.0)
    data = client.get_data(meta)  # held (over shm: views pinning the arena) when killed
    print(json.dumps({"lease": meta.lease_id, "transport": client.transport,
                      "values": [int(v) for v in data["x"]], "text": data["text"],
                      "text_types": sorted({type(s).__name__ for s in data["text"]})}), flush=True)
    time.sleep(60)
    """
)


def test_killed_consumer_rows_are_redelivered_exactly_once(start_server):
    """Over TCP and over the arena (two servers, the two victims started
    together): a Python consumer process leases 6 rows, reads them and is
    killed with SIGKILL before acking; this process then consumes all 24
    rows of the task exactly once, the victim's after its lease expired."""
    total = 24
    runs = {}
    for transport in ("tcp", "shm"):
        server = start_server(*(SHM_FLAGS if transport == "shm" else ()))
        client = tq.connect(server.endpoint)
        client.register_task("train")
        for start in range(0, total, 8):
            client.put({"x": torch.arange(start, start + 8),
                        "text": [f"row {i}" for i in range(start, start + 8)]}, partition_id="work")
        victim = subprocess.Popen([sys.executable, "-c", VICTIM, server.endpoint], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=os.environ.copy())
        runs[transport] = (client, victim)

    for transport, (client, victim) in runs.items():
        try:
            ready, _, _ = select.select([victim.stdout], [], [], 60.0)
            line = victim.stdout.readline().decode() if ready else ""
            assert line, f"the {transport} victim printed nothing: {victim.stderr.read1().decode() if ready else ''}"
            got = json.loads(line)
        finally:
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            victim.stdout.close()
            victim.stderr.close()
        assert victim.returncode == -signal.SIGKILL
        assert got["transport"] == transport
        assert got["text"] == [f"row {v}" for v in got["values"]]
        assert got["text_types"] == ["str"], "another process learns the string column from the hub"
        lost = got["values"]
        assert len(lost) == 6

        # This process consumes everything; the dead consumer's rows come
        # back once its lease expires.
        consumed = []
        for _ in range(total // 6 + 2):
            if len(consumed) == total:
                break
            m = client.get_meta(["x", "text"], 6, "work", task_name="train", timeout=10)
            d = client.get_data(m)
            assert d["text"] == [f"row {int(v)}" for v in d["x"]]
            consumed += [int(v) for v in d["x"]]
            client.ack(m)
        assert sorted(consumed) == list(range(total)), f"{transport}: every row once, none lost, none twice"
        assert set(lost) <= set(consumed)

        with pytest.raises(errors.FailedPrecondition) as e:
            client.ack(got["lease"])
        assert "expired" in e.value.message
        with pytest.raises(errors.Timeout):
            client.get_meta(["x"], 1, "work", task_name="train", timeout=0.2)  # nothing left, nothing redelivered
        stats = client.stats()
        assert stats["rows_redelivered"] == 6 and stats["leases_expired"] == 1
        assert stats["tasks"]["train"]["acked_total"] == total and stats["rows"] == 0
        client.close()


# ---------------------------------------------------------------- concurrency


def test_get_meta_releases_the_gil(hub):
    _, client = hub
    client.register_task("t")
    client.register_column("x", torch.int64, ())
    client.create_partition("p")
    result = {}

    def consumer():
        try:
            result["meta"] = client.get_meta("x", 3, "p", task_name="t", timeout=10)
        except BaseException as e:  # reported below
            result["error"] = e

    th = threading.Thread(target=consumer)
    th.start()
    wait_until(lambda: "error" in result or client.stats()["waiting_consumers"] == 1, 10, "the consumer to block")
    assert "error" not in result, result
    spins = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.2:  # Python keeps running while it waits
        spins += 1
    assert spins > 1000
    client.put({"x": torch.arange(3)}, partition_id="p")
    th.join(timeout=10)
    assert not th.is_alive() and "error" not in result, result
    assert result["meta"].size == 3


def test_missing_partition_is_waited_for(hub):
    _, client = hub
    client.register_column("x", torch.int64, ())
    with pytest.raises(errors.NotFound):
        client.get_meta("x", 1, "later", task_name="t")
    with pytest.raises(errors.Timeout) as e:
        client.get_meta("x", 1, "later", task_name="t", timeout=0.1)
    assert "does not exist" in e.value.message
    threading.Timer(0.2, lambda: client.put({"x": torch.arange(1)}, partition_id="later")).start()
    assert client.get_meta("x", 1, "later", task_name="t", timeout=10).size == 1


def test_close_aborts_a_waiting_get_meta(start_server):
    server = start_server()
    client = tq.connect(server.endpoint)
    client.register_column("x", torch.int64, ())
    client.create_partition("p")
    seen = {}

    def consumer():
        try:
            client.get_meta("x", 1, "p", task_name="t", timeout=30)
        except BaseException as e:
            seen["error"] = e

    th = threading.Thread(target=consumer)
    th.start()
    wait_until(lambda: client.stats()["waiting_consumers"] == 1, 10, "the consumer to block")
    client.close()
    th.join(timeout=10)  # the binding re-checks between 0.5 s slices
    assert not th.is_alive()
    assert isinstance(seen.get("error"), errors.Aborted), seen
    with pytest.raises(errors.Aborted):
        client.stats()


# ---------------------------------------------------------------- bad input


def test_bad_inputs_raise_and_store_nothing(hub):
    server, client = hub
    client.put({"x": torch.zeros(2, 3), "tok": [torch.tensor([1]), torch.tensor([1, 2])], "s": ["a", "b"]},
               partition_id="p")
    good = client.get_meta(["x"], 2, "p", task_name="t")
    before = client.stats()
    columns_before = client.describe()

    def put(data, **kw):
        kw.setdefault("partition_id", "p")
        return client.put(data, **kw)

    cases = [
        (TypeError, lambda: put([1, 2])),
        (ValueError, lambda: put({})),
        (ValueError, lambda: put({"x": torch.zeros(2, 3, dtype=torch.float64)})),  # dtype vs schema
        (ValueError, lambda: put({"x": torch.zeros(2, 4)})),  # shape vs schema
        (ValueError, lambda: put({"tok": torch.zeros(2, 2, 2, dtype=torch.int64)})),  # rank vs schema
        (ValueError, lambda: put({"tok": [torch.tensor([1.0])]})),
        (ValueError, lambda: put({"x": torch.zeros(2, 3), "new_col": torch.zeros(3)})),  # batch sizes
        (ValueError, lambda: put({"x": torch.zeros(0, 3)})),
        (ValueError, lambda: put({"x": torch.tensor(1.0)})),
        (ValueError, lambda: put({"x": torch.zeros(2, 3, device="meta")})),  # not on the CPU
        (TypeError, lambda: put({"y": torch.zeros(2, dtype=torch.complex64)})),
        (TypeError, lambda: put({"y": torch.zeros(2, 2).to_sparse()})),
        (TypeError, lambda: put({"y": [torch.zeros(1), "a"]})),
        (TypeError, lambda: put({"y": {"a": 1}})),
        (TypeError, lambda: put({"s": [torch.zeros(1, dtype=torch.uint8)] * 2})),  # tensors for a string column
        (TypeError, lambda: put({"tok": ["a", "b"]})),  # strings for a tensor column
        (ValueError, lambda: put({"y": ["\ud800", "a"]})),  # not encodable as UTF-8
        (ValueError, lambda: put({"y": [torch.zeros(2, 2), torch.zeros(2, 3)]})),
        (ValueError, lambda: put({"sluice.str:y": ["a"]})),
        (ValueError, lambda: put({"x": torch.zeros(2, 3)}, partition_id=None)),
        (ValueError, lambda: put({"x": torch.zeros(3, 3)}, metadata=good, partition_id=None)),  # 3 rows for 2
        (ValueError, lambda: put({"z": torch.zeros(2)}, metadata=good, partition_id=None, group_ids=[1, 2])),
        (TypeError, lambda: put({"z": torch.zeros(2)}, tags=[{"a": 1}, {"a": 2}])),
        (ValueError, lambda: put({"z": torch.zeros(2)}, tags=[{}])),
        (ValueError, lambda: put({"z": torch.zeros(2)}, token_lengths=[-1, 0])),
        (errors.AlreadyExists, lambda: put({"x": torch.zeros(2, 3)}, metadata=good, partition_id=None)),
        (ValueError, lambda: client.get_meta(["nope"], 1, "p", task_name="t")),  # unknown field
        (ValueError, lambda: client.get_meta(["x", "x"], 1, "p", task_name="t")),
        (ValueError, lambda: client.get_meta(["x"], 0, "p", task_name="t")),
        (ValueError, lambda: client.get_meta(["x"], 1, "p")),  # no task
        (ValueError, lambda: client.get_meta(["x"], 1, "p", mode="force_fetch", task_name="t")),
        (ValueError, lambda: client.get_meta(["x"], 1, "p", task_name="t", sampling_config={"dp_rank": 0})),
        (ValueError, lambda: client.get_meta(["x"], 1, "p", task_name="t", timeout=-1)),
        (ValueError, lambda: client.get_meta(["x"], 1, "p", task_name="t", lease_timeout=0)),
        (errors.InvalidArgument, lambda: client.get_meta(["x"], 1, "p", task_name="t",
                                                         sampling_config={"min_policy_version": 5,
                                                                          "max_policy_version": 1})),
        (ValueError, lambda: client.get_data(good, ["tok"])),  # not in the batch
        (TypeError, lambda: client.get_data({"rows": [1]})),
        (errors.NotFound, lambda: client.ack(123456789)),  # unknown lease
        (ValueError, lambda: client.ack(client.put({"x": torch.zeros(1, 3)}, partition_id="other"))),
        (errors.NotFound, lambda: client.release(123456789)),
        (errors.NotFound, lambda: client.clear_partition("never")),
        (ValueError, lambda: client.kv_batch_put(["k", "k"], "kv", {"x": torch.zeros(2, 3)})),
        (ValueError, lambda: client.kv_batch_put(["k"], "kv")),
        (ValueError, lambda: client.kv_batch_put(["k1", "k2"], "kv", {"x": torch.zeros(3, 3)})),
        (TypeError, lambda: client.kv_put("k", "kv", {"x": 3})),
        (errors.NotFound, lambda: client.kv_batch_get(["k"], "never")),
    ]
    for i, (exc, call) in enumerate(cases):
        try:
            call()
        except exc:
            continue
        except Exception as e:  # the wrong exception
            pytest.fail(f"case {i}: {type(e).__name__}: {e} (expected {exc.__name__})")
        pytest.fail(f"case {i}: no {exc.__name__} raised")
    after = client.stats()
    # Only the one valid put into "other" (for the ack case) was stored.
    assert after["rows"] == before["rows"] + 1
    assert after["writes_committed"] == before["writes_committed"] + 1
    assert after["writes_aborted"] == before["writes_aborted"]
    assert set(client.describe()) == set(columns_before), "failed puts registered no column"
    assert client.clear_partition("other") == 1
    # The failed calls left the lease intact.
    assert client.ack(good)["rows_acked"] == 2
    with pytest.raises(errors.FailedPrecondition) as e:
        client.ack(good)
    assert "already acked" in str(e.value)


def test_connection_errors(start_server, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    server = start_server(f"--token-file={token}")
    with pytest.raises(errors.FailedPrecondition):
        tq.connect(server.endpoint, token="wrong")
    with pytest.raises(errors.FailedPrecondition):
        tq.connect(server.endpoint)
    client = tq.connect(server.endpoint, token_file=str(token))
    assert client.stats()["rows"] == 0
    client.close()
    with pytest.raises(errors.FailedPrecondition):
        tq.connect(server.endpoint, token="s3cret", shm="required")  # the server has no arena
    with pytest.raises(errors.InvalidArgument):
        tq.connect("http://127.0.0.1:1")
    with pytest.raises(ValueError):
        tq.connect(server.endpoint, shm="sometimes")
    dead = start_server()
    endpoint = dead.endpoint
    dead.stop()
    with pytest.raises(errors.Unavailable):
        tq.connect(endpoint, rpc_timeout=0.3)


# ---------------------------------------------------------------- in process, module level


def test_in_process_hub_and_module_level_api():
    client = tq.init()
    assert tq.init() is client and tq.get_client() is client and client.transport == "in_process"
    with pytest.raises(ValueError):
        tq.init({"endpoint": "tcp://127.0.0.1:1"})
    tq.kv_batch_put(["a", "b"], "train", {"t": torch.tensor([[1.0], [2.0]])}, tags=[{"s": "x"}, {"s": "y"}])
    tq.kv_put("c", "train", {"t": torch.tensor([3.0])})
    assert tq.kv_batch_get(["c", "a"], "train")["t"].tolist() == [[3.0], [1.0]]
    assert tq.kv_list("train") == {"train": {"a": {"s": "x"}, "b": {"s": "y"}, "c": {}}}
    assert tq.kv_clear("a", "train") == 1

    meta = client.put({"x": torch.arange(4)}, partition_id="p")
    leased = client.get_meta("x", 4, "p", task_name="t")
    restored = pickle.loads(pickle.dumps(leased))
    assert restored == leased
    assert client.get_data(restored)["x"].tolist() == list(range(4))
    assert client.ack(restored)["rows_acked"] == 4
    assert meta.size == 4

    tq.close()
    with pytest.raises(errors.Aborted):
        client.stats()
    with pytest.raises(RuntimeError):
        tq.get_client()
    other = tq.init({"hub": {"storage_units": 1, "lease_timeout": 1.0}})
    assert other is not client
    tq.close()
