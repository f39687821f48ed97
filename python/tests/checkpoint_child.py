"""Weights whose every element encodes its version, and the reader process
that test_checkpoint_engine.py starts (``python checkpoint_child.py MODE
PREFIX STORE VERSION``):

* ``read-and-hold``: attaches, waits for VERSION, checks the views and a
  verified copy, prints one JSON line, then holds the pin until killed
  (at most 60 s).
* ``write-to-view``: attaches, pins VERSION, prints ``ready``, then writes
  into a view (which must kill it: the mapping is read-only).
"""

import json
import os
import sys
import time

import torch


def weights(version: int) -> dict:
    """A state_dict of every kind the store keeps, each element a function of
    (version, tensor, index)."""
    v = version
    return {
        "embed.weight": (torch.arange(64 * 32, dtype=torch.float32) + v * 10000).reshape(64, 32),
        "layer.bias": torch.full((32,), float(v), dtype=torch.bfloat16),
        "layer.scale": torch.full((2, 3), v / 4, dtype=torch.float16),
        "steps": torch.arange(4, dtype=torch.int64) + (v << 40),
        "mask": (torch.arange(8) + v) % 2 == 0,
        "temperature": torch.tensor(v + 0.5, dtype=torch.float64),
        "codes": (torch.arange(16, dtype=torch.int32) * 7 + v).to(torch.int8),
    }


def mismatch(tensors, version: int) -> str:
    """"" if `tensors` (a mapping) holds exactly weights(version); else what differs."""
    want = weights(version)
    if sorted(tensors) != sorted(want):
        return f"names {sorted(tensors)} != {sorted(want)}"
    for name, w in want.items():
        t = tensors[name]
        if t.dtype != w.dtype or t.shape != w.shape:
            return f"{name}: {t.dtype} {list(t.shape)} != {w.dtype} {list(w.shape)}"
        if not torch.equal(t, w):
            return f"{name}: values differ from version {version}"
    return ""


def main(argv) -> int:
    mode, prefix, store, version = argv[1], argv[2], argv[3], int(argv[4])
    from sluice import checkpoint_engine as ce

    sub = ce.ShmSubscriber(store, shm_prefix=prefix, attach_timeout=20.0)
    pinned = sub.wait_for_version(version, 20.0)
    if mode == "read-and-hold":
        copies = {name: torch.zeros_like(t) for name, t in weights(0).items()}
        pinned.copy_into(copies)
        pinned.verify()
        print(json.dumps({"pid": os.getpid(), "version": pinned.version, "views": mismatch(pinned, pinned.version),
                          "copies": mismatch(copies, pinned.version)}), flush=True)
        time.sleep(60)
        return 2
    if mode == "write-to-view":
        print("ready", flush=True)
        pinned["embed.weight"].add_(1)
        print("survived a write into a read-only view", flush=True)
        return 3
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 4


if __name__ == "__main__":
    sys.exit(main(sys.argv))
