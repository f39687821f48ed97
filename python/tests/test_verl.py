"""sluice.verl against a real sluice_queue_server: the calls verl's
TransferQueue integration makes, with verl's value shapes."""

import asyncio

import pytest
import torch

from conftest import SHM_FLAGS


@pytest.fixture(params=["tcp", "shm"])
def verl(request, start_server):
    from sluice import verl as v

    server = start_server(*(SHM_FLAGS if request.param == "shm" else ()))
    v.init({"endpoint": server.endpoint})
    assert v.get_client().transport == request.param
    yield v
    v.close()


def test_the_verl_flow(verl):
    # The trainer registers prompts: typed tags, variable-length prompts.
    uids = ["p0", "p1", "p2"]
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])]
    meta = verl.kv_batch_put(keys=uids, partition_id="train",
                             tags=[{"is_prompt": True, "status": "pending", "global_steps": 3}] * 3,
                             fields={"input_ids": prompts, "data_source": ["a", "b", "c"]})
    assert isinstance(meta, verl.KVBatchMeta) and meta.size == 3 and meta.partition_id == "train"

    # Agent loops: status updates and trajectories, from asyncio; the
    # responses as verl's tensordict utilities make them (a nested tensor).
    async def agent_loop():
        await verl.async_kv_put(key="p1", partition_id="train", tag={"status": "running"})
        keys = ["p0_0_0", "p0_0_1"]
        responses = [torch.tensor([7, 8]), torch.tensor([9, 10, 11, 12])]
        nested = torch.nested.nested_tensor(responses)
        await verl.async_kv_batch_put(keys=keys, partition_id="train",
                                      fields={"responses": nested, "rewards": torch.tensor([1.0, 0.0])},
                                      tags=[{"status": "success", "response_len": 2, "global_steps": 3,
                                             "min_global_steps": 2, "max_global_steps": 3},
                                            {"status": "success", "response_len": 4, "global_steps": 3,
                                             "min_global_steps": 3, "max_global_steps": 3}])
        return await verl.async_kv_list()

    listed = asyncio.run(agent_loop())
    # The replay buffer polls kv_list() and classifies by tag, types intact.
    train = listed["train"]
    assert train["p1"] == {"is_prompt": True, "status": "running", "global_steps": 3}
    assert train["p0"]["is_prompt"] is True and train["p0"]["global_steps"] == 3
    done = sorted(k for k, t in train.items() if t.get("status") == "success")
    assert done == ["p0_0_0", "p0_0_1"]
    assert train["p0_0_1"]["response_len"] == 4 and isinstance(train["p0_0_1"]["response_len"], int)

    got = verl.kv_batch_get(keys=done, partition_id="train", select_fields=["responses", "rewards"])
    assert getattr(got["responses"], "is_nested", False)
    assert [t.tolist() for t in got["responses"].unbind()] == [[7, 8], [9, 10, 11, 12]]
    assert got["rewards"].tolist() == [1.0, 0.0]
    as_list = asyncio.run(verl.async_kv_batch_get(["p2", "p0"], "train", ["input_ids", "data_source"],
                                                  ragged="list"))
    assert [t.tolist() for t in as_list["input_ids"]] == [[5, 6], [1, 2, 3]]
    assert as_list["data_source"] == ["c", "a"]

    assert verl.kv_clear(partition_id="train", keys=done) == 2
    assert sorted(verl.kv_list("train")["train"]) == uids
    assert asyncio.run(verl.async_kv_clear(partition_id="train")) == 3
    assert verl.kv_list() == {"train": {}}


def test_tag_types_round_trip(verl):
    tag = {"b": False, "n": None, "i": -7, "f": 2.5, "s": "3", "t": "true", "e": ""}
    verl.kv_put("k", "p", tag=tag)
    assert verl.kv_list("p") == {"p": {"k": tag}}
    for k, v in verl.kv_list("p")["p"]["k"].items():
        assert type(v) is type(tag[k]), k
    # A tag written as plain text by another client reads back as that text.
    verl.get_client().kv_put("other", "p", tag={"status": "pending", "count": "12"})
    assert verl.kv_list("p")["p"]["other"] == {"status": "pending", "count": 12}


def test_tensordict_like_inputs(verl):
    class NonTensorStack:  # the interface verl's NonTensorStack offers here
        def __init__(self, items):
            self.items = items

        def tolist(self):
            return list(self.items)

    class TensorDictLike:
        def __init__(self, d):
            self.d = d

        def keys(self):
            return self.d.keys()

        def __getitem__(self, k):
            return self.d[k]

    td = TensorDictLike({"x": torch.arange(6).view(2, 3), "name": NonTensorStack(["u", "v"])})
    verl.kv_batch_put(["a", "b"], "td", fields=td)
    got = verl.kv_batch_get(["b", "a"], "td")
    assert got["x"].tolist() == [[3, 4, 5], [0, 1, 2]]
    assert got["name"] == ["v", "u"]
    verl.kv_put("c", "td", fields=TensorDictLike({"x": torch.tensor([6, 7, 8]), "name": "w"}))
    assert verl.kv_batch_get("c", "td")["name"] == ["w"]


def test_bad_inputs_store_nothing(verl):
    cases = [
        (TypeError, lambda: verl.kv_batch_put(["a"], "bad", tags=[{"x": [1, 2]}])),
        (TypeError, lambda: verl.kv_batch_put(["a"], "bad", tags=[{1: "x"}])),
        (TypeError, lambda: verl.kv_batch_put(["a"], "bad", tags={"x": 1})),
        (ValueError, lambda: verl.kv_batch_put(["a"], "bad", tags=[{"x": float("nan")}])),
        (ValueError, lambda: verl.kv_batch_put(["a", "b"], "bad", tags=[{"x": 1}])),
        (TypeError, lambda: verl.kv_batch_put("ab", "bad", tags=[{"x": 1}])),
        (TypeError, lambda: verl.kv_batch_put(["a"], "bad", fields={"obj": [{"not": "storable"}]})),
        (TypeError, lambda: verl.kv_batch_put(["a", "b"], "bad", fields={"mixed": [torch.ones(1), "s"]})),
        (ValueError, lambda: verl.kv_batch_put(["a", "b"], "bad", fields={"x": torch.ones(3, 2)})),
        (ValueError, lambda: verl.kv_batch_put(["a", "b"], "bad", fields={"x": torch.tensor(1.0)})),
        (ValueError, lambda: verl.kv_batch_put(["a", "b"], "bad", fields={"x": [torch.ones(1)]})),
        (TypeError, lambda: verl.kv_batch_put(["a"], "bad", fields=[torch.ones(1)])),
        (TypeError, lambda: verl.kv_batch_put(["a"], "bad", fields={3: torch.ones(1)})),
        (TypeError, lambda: verl.kv_batch_put(["a"], "bad", fields={"x": 3})),
        (TypeError, lambda: verl.kv_put("a", "bad", tag={"x": object()})),
        (TypeError, lambda: verl.kv_put("a", "bad", fields=[1])),
        (TypeError, lambda: verl.kv_clear(keys=["a"])),
        (ValueError, lambda: verl.kv_batch_get(["a"], "bad", ragged="jagged")),
        (ValueError, lambda: verl.KVBatchMeta("p", ["a", "b"], [{}])),
    ]
    from sluice import errors

    for i, (exc, call) in enumerate(cases):
        with pytest.raises(exc):
            call()
    # Nothing reached the hub: not even the partition was made.
    with pytest.raises(errors.NotFound):
        verl.kv_list("bad")
    assert verl.kv_list() == {}
