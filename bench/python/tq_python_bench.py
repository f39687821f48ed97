"""The Python TransferQueue client against the C++ one, in one run.

  PYTHONPATH=build/release/python /usr/bin/python3 bench/python/tq_python_bench.py [--repeats 3] [--quick]

1. Round trips of 4 KiB rows, batch 1 and 256, over the shared-memory arena
   and over loopback TCP: one round trip is put (new rows), get_meta (lease),
   get_data, ack, as tq_bench's C++ round trip is with --get=steps (PutRows,
   GetMeta, GetData, Ack). The C++ figures come from tq_bench (same build) run between the
   Python repeats; the Python ones from a sluice_queue_server started here.
   Each side has one client thread; the servers run in their own processes.
   Printed: median seconds per round trip over the repeats, rows/s, and
   Python / C++.
2. Reading 16 MiB rows over the arena: get_data of a variable-length column
   (tensors that view the arena, no copy), of a fixed-shape column (one copy
   into a new tensor), against torch's copy of 16 MiB into a buffer already
   touched (memcpy) and into a new tensor (whose pages the copy faults in).

Every loop is bounded by a count and a time. Needs build/release (or
--build DIR) with bench/transfer_queue/tq_bench and apps/sluice_queue_server.
"""

import argparse
import json
import os
import pathlib
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
ROW = 4096
BATCHES = (1, 256)
TRANSPORTS = ("shm", "tcp")
BIG_ROW = 16 << 20


class Server:
    """A sluice_queue_server child on a free loopback port."""

    def __init__(self, binary: str, shm_bytes: int):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([binary, "--bind=tcp://127.0.0.1:0", f"--shm-bytes={shm_bytes}"],
                                     stdout=subprocess.PIPE, stderr=self.log)
        ready, _, _ = select.select([self.proc.stdout], [], [], 20.0)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("tcp://"):
            self.stop()
            self.log.seek(0)
            sys.exit(f"sluice_queue_server did not start: {line!r} {self.log.read().decode(errors='replace')}")
        self.endpoint = line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def python_round_trips(client, batch: int, seconds: float, max_trips: int) -> float:
    """Seconds per round trip (put, get_meta, get_data, ack) of `batch` 4 KiB rows."""
    partition = f"bench-{batch}"
    data = {"payload": torch.randint(0, 255, (batch, ROW), dtype=torch.uint8)}

    def trip():
        client.put(data, partition_id=partition)
        meta = client.get_meta(["payload"], batch_size=batch, partition_id=partition, task_name="bench",
                               timeout=5.0)
        got = client.get_data(meta)
        if got["payload"].shape[0] != batch:
            raise RuntimeError(f"get_data returned {got['payload'].shape[0]} rows, not {batch}")
        client.ack(meta)

    for _ in range(10):  # warm-up: schemas registered, partition made, arena pages touched
        trip()
    done, start = 0, time.perf_counter()
    while done < max_trips and (done == 0 or time.perf_counter() - start < seconds):
        trip()
        done += 1
    elapsed = time.perf_counter() - start
    client.clear_partition(partition)
    return elapsed / done


def cpp_round_trips(tq_bench: str, repeats_seen: dict) -> None:
    """One tq_bench run (one repeat): its median seconds per round trip per (transport, batch)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [tq_bench, "--transports=" + ",".join(TRANSPORTS), "--sizes=4K",
               "--batches=" + ",".join(map(str, BATCHES)), "--repeats=1", "--get=steps", "--sections=roundtrip",
               f"--json={out.name}"]
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        if run.returncode != 0:
            sys.exit(f"tq_bench failed ({run.returncode}):\n{run.stdout.decode(errors='replace')[-3000:]}")
        report = json.load(open(out.name))
    for r in report["round_trips"]:
        if r.get("skipped") or r["row_bytes"] != ROW or r["transport"] not in TRANSPORTS:
            continue
        repeats_seen.setdefault((r["transport"], r["batch"]), []).append(r["median_seconds"])


def zero_copy(client, iterations: int) -> dict:
    """Median seconds to read one 16 MiB row: as views, as a copy, and torch's
    copy into a touched buffer (memcpy) and into a new tensor (fresh)."""
    source = torch.randint(0, 255, (BIG_ROW,), dtype=torch.uint8)
    client.put({"big_ragged": [source]}, partition_id="big")
    client.put({"big_fixed": source.unsqueeze(0)}, partition_id="big")
    out = {"view": [], "copy": [], "memcpy": [], "fresh": []}
    dst = torch.empty_like(source)
    for _ in range(iterations):
        meta = client.get_meta(["big_ragged"], batch_size=1, partition_id="big", task_name="view", timeout=5.0)
        t0 = time.perf_counter()
        got = client.get_data(meta)["big_ragged"][0]
        out["view"].append(time.perf_counter() - t0)
        if got.numel() != BIG_ROW or int(got[12345]) != int(source[12345]):
            raise RuntimeError("the 16 MiB view does not hold the row")
        del got
        client.release(meta)
        meta = client.get_meta(["big_fixed"], batch_size=1, partition_id="big", task_name="copy", timeout=5.0)
        t0 = time.perf_counter()
        got = client.get_data(meta)["big_fixed"]
        out["copy"].append(time.perf_counter() - t0)
        if not torch.equal(got[0], source):
            raise RuntimeError("the 16 MiB copy differs from the row")
        del got
        client.release(meta)
        t0 = time.perf_counter()
        dst.copy_(source)
        out["memcpy"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fresh = torch.empty_like(source)  # a new tensor's pages are faulted in by the copy
        fresh.copy_(source)
        out["fresh"].append(time.perf_counter() - t0)
        del fresh
    client.clear_partition("big")
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=str(REPO / "build" / "release"), help="the build directory")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (C++ then Python), 1..20")
    p.add_argument("--seconds", type=float, default=1.0, help="Python round trips per configuration and repeat")
    p.add_argument("--quick", action="store_true", help="1 repeat, 0.3 s per configuration")
    p.add_argument("--json", default="", help="also write the results here")
    a = p.parse_args()
    if not 1 <= a.repeats <= 20:
        sys.exit("--repeats must be in 1..20")
    if not 0.05 <= a.seconds <= 30:
        sys.exit("--seconds must be in 0.05..30")
    if a.quick:
        a.repeats, a.seconds = 1, 0.3
    build = pathlib.Path(a.build)
    tq_bench = build / "bench" / "transfer_queue" / "tq_bench"
    server_bin = build / "apps" / "sluice_queue_server"
    for f in (tq_bench, server_bin):
        if not os.access(f, os.X_OK):
            sys.exit(f"no {f}: build the release preset first")

    torch.set_num_threads(1)
    from sluice import transfer_queue as tq

    server = Server(str(server_bin), 256 << 20)
    clients = {"shm": tq.connect(server.endpoint), "tcp": tq.connect(server.endpoint, shm="off")}
    for t, c in clients.items():
        if c.transport != t:
            sys.exit(f"the {t} client came up as {c.transport}")
        c.register_task("bench")
    cpp, py = {}, {}
    try:
        for r in range(a.repeats):
            cpp_round_trips(str(tq_bench), cpp)
            for t in TRANSPORTS:
                for b in BATCHES:
                    py.setdefault((t, b), []).append(
                        python_round_trips(clients[t], b, a.seconds, 200000 // b))
            print(f"repeat {r + 1}/{a.repeats} done", file=sys.stderr, flush=True)
        for task in ("view", "copy"):
            clients["shm"].register_task(task)
        big = zero_copy(clients["shm"], 5 if a.quick else 15)
    finally:
        for c in clients.values():
            c.close()
        server.stop()

    print(f"Python vs C++ TransferQueue clients, {ROW // 1024} KiB rows, one client thread each, "
          f"{os.cpu_count()} CPUs, median of {a.repeats} interleaved repeats")
    print("round trip = put, get_meta, get_data, ack; C++: tq_bench's own server child; Python: sluice_queue_server")
    print(f"{'transport':<10}{'batch':>6}{'C++ us/trip':>14}{'Python us/trip':>16}{'Python rows/s':>15}{'Python/C++':>12}")
    rows = []
    for t in TRANSPORTS:
        for b in BATCHES:
            c = statistics.median(cpp[(t, b)]) if (t, b) in cpp else float("nan")
            y = statistics.median(py[(t, b)])
            rows.append({"transport": t, "batch": b, "cpp_seconds": c, "python_seconds": y, "ratio": y / c})
            print(f"{t:<10}{b:>6}{c * 1e6:>14.1f}{y * 1e6:>16.1f}{b / y:>15.0f}{y / c:>11.2f}x")
    print(f"\n16 MiB row over the arena (median of {5 if a.quick else 15}): get_data as a view "
          f"{big['view'] * 1e6:.0f} us, as a copy into a new tensor {big['copy'] * 1e6:.0f} us; torch copy into a "
          f"touched buffer (memcpy) {big['memcpy'] * 1e6:.0f} us, into a new tensor {big['fresh'] * 1e6:.0f} us")
    print(f"view / memcpy: {big['view'] / big['memcpy']:.3f}x   copy / memcpy: {big['copy'] / big['memcpy']:.2f}x   "
          f"copy / new-tensor copy: {big['copy'] / big['fresh']:.2f}x")
    four_k = [r for r in rows if r["batch"] == 1]
    print("target: Python round trip at most 2x C++'s at 4 KiB (batch 1): " +
          ", ".join(f"{r['transport']} {r['ratio']:.2f}x {'met' if r['ratio'] <= 2 else 'MISSED'}" for r in four_k))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"round_trips": rows, "big_row": big, "repeats": a.repeats, "cpus": os.cpu_count()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
