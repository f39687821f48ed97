"""GRPO in plain PyTorch as Sluice's trainer role, while Sluice's C++ rollout
and reward roles generate and score (docs/python.md, "Trainers in Python"):

  sluice train --config=configs/arithmetic.yaml \
      pipeline.trainer_command="/usr/bin/python3 python/examples/grpo_trainer.py"

The launcher publishes the starting weights and names the hub, the weight
store and the run's settings in $SLUICE_RUN_INFO. Each step takes the step's
own prompts as whole groups from the hub's train task, trains one AdamW step
on the PPO-clipped GRPO loss, publishes, and only then acks the groups: the
rollout's staleness bound reads those acks, and a trainer that dies leaves
its groups to be delivered again. The model is a Llama / Qwen2 / Qwen3
decoder written out below, with the parameter names of Sluice's C++ model.
"""
import json, math, os, time
import torch
import torch.nn as nn
import torch.nn.functional as F
from sluice import checkpoint_engine, transfer_queue


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        E, H, KV, D, eps = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        self.H, self.KV, self.D = H, KV, D
        a = self.self_attn = nn.Module()
        a.q_proj, a.k_proj, a.v_proj = (nn.Linear(E, n * D, bias=c["attention_bias"]) for n in (H, KV, KV))
        a.o_proj = nn.Linear(H * D, E, bias=False)
        if c["model_type"] == "qwen3":
            a.q_norm, a.k_norm = RMSNorm(D, eps), RMSNorm(D, eps)
        m = self.mlp = nn.Module()
        m.gate_proj, m.up_proj = nn.Linear(E, c["intermediate_size"], bias=False), nn.Linear(E, c["intermediate_size"], bias=False)
        m.down_proj = nn.Linear(c["intermediate_size"], E, bias=False)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(E, eps), RMSNorm(E, eps)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        a, h = self.self_attn, self.input_layernorm(x)
        q, k, v = (p(h).view(B, T, n, self.D).transpose(1, 2) for p, n in ((a.q_proj, self.H), (a.k_proj, self.KV), (a.v_proj, self.KV)))
        if hasattr(a, "q_norm"):
            q, k = a.q_norm(q), a.k_norm(k)
        half = lambda t: torch.cat((-t[..., self.D // 2:], t[..., :self.D // 2]), -1)  # HF rotate_half
        q, k = q * cos + half(q) * sin, k * cos + half(k) * sin
        k, v = k.repeat_interleave(self.H // self.KV, 1), v.repeat_interleave(self.H // self.KV, 1)
        att = ((q @ k.transpose(2, 3)) / math.sqrt(self.D) + mask).softmax(-1) @ v
        x = x + a.o_proj(att.transpose(1, 2).reshape(B, T, -1))
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class CausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        if c.get("rope_scaling"):
            raise SystemExit("grpo_trainer.py: rope_scaling is not written out in this example")
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.model.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.model.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        if not c["tie_word_embeddings"]:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        inv = c["rope_theta"] ** (-torch.arange(0, c["head_dim"], 2, dtype=torch.float64) / c["head_dim"])
        ang = torch.outer(torch.arange(c["max_position_embeddings"], dtype=torch.float64), inv)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos().float(), persistent=False)
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin().float(), persistent=False)

    def forward(self, tokens):
        T = tokens.shape[1]
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, self.cos[:T], self.sin[:T], mask)
        head = self.lm_head.weight if hasattr(self, "lm_head") else self.model.embed_tokens.weight
        return self.model.norm(x) @ head.T


def response_logprobs(model, prompts, responses, temperature):
    """Per-token logprobs of each response given its prompt, [B, R] padded."""
    seqs = [torch.cat((p, r)).long() for p, r in zip(prompts, responses)]
    tokens = nn.utils.rnn.pad_sequence(seqs, batch_first=True)
    lp = (model(tokens)[:, :-1] / temperature).log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]
    R = max(1, max(len(r) for r in responses))
    idx = torch.tensor([[len(p) - 1 + j for j in range(R)] for p in prompts]).clamp(max=lp.shape[1] - 1)
    return lp.gather(1, idx)


def tracer(info):
    """span(name, t0, t1) adds a span to the run's trace (run.trace: Chrome trace-event JSON lines)."""
    out = open(info["trace"], "a") if info.get("trace") else None
    line = lambda e: out and (out.write(json.dumps({"pid": info["trace_track"], "tid": os.getpid(), **e}) + "\n"),
                              out.flush())
    line({"ph": "M", "name": "process_name", "args": {"name": "trainer (python)"}})
    return lambda name, t0, t1: line({"ph": "X", "name": name, "cat": "trainer", "ts": int(t0 * 1e6),
                                      "dur": int((t1 - t0) * 1e6)})  # time.monotonic() is the host's clock


def main():
    info = json.load(open(os.environ["SLUICE_RUN_INFO"]))
    span = tracer(info)
    P, G, T = info["prompts_per_step"], info["group_size"], info["temperature"]
    model = CausalLM(json.load(open(os.path.join(info["model_dir"], "config.json"))))
    reader = checkpoint_engine.ShmSubscriber(info["weight_store"], shm_prefix=info["shm_prefix"])
    with reader.acquire() as weights:  # the launcher published the starting version
        weights.copy_into(model)
        version = weights.version
    publisher = checkpoint_engine.ShmPublisher(info["weight_store"], reader.layout, shm_prefix=info["shm_prefix"])
    reader.close()
    opt = torch.optim.AdamW(model.parameters(), lr=info["lr"], weight_decay=info["weight_decay"])
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / max(1, info["warmup_steps"])))
    hub = transfer_queue.connect(info["hub"])
    held, trained, start = {}, set(), time.monotonic()  # groups by prompt cursor
    for step in range(info["start_step"], info["steps"]):
        t0, want = time.monotonic(), range(step * P, step * P + P)
        while not all(c in held for c in want):  # this step's prompts; later ones wait for their step
            try:
                meta = hub.get_meta(info["columns"], G, info["partition"], task_name=info["task"],
                                    sampling_config={"group_size": G}, timeout=1.0,
                                    lease_timeout=info["lease_seconds"])
            except TimeoutError:
                continue
            cursor = meta.tags[0].group_id
            if cursor in trained:  # delivered again after its lease ran out: trained once
                hub.ack(meta)
                continue
            held[cursor] = (meta, hub.get_data(meta, stack=False))
        groups = [held.pop(c) for c in want]
        span("wait for groups", t0, time.monotonic())
        rows = {k: [t for _, d in groups for t in d[k]] for k in ("prompt", "response", "logprobs", "versions")}
        rewards = torch.stack([r for _, d in groups for r in d["reward"]]).view(P, G).double()
        adv = rewards - rewards.mean(1, keepdim=True)
        if info["divide_adv_by_std"]:
            adv = adv / (rewards.std(1, keepdim=True) + 1e-6)
        behavior = nn.utils.rnn.pad_sequence(rows["logprobs"], batch_first=True)
        mask = nn.utils.rnn.pad_sequence([torch.ones(len(r)) for r in rows["response"]], batch_first=True)
        # Answers generated wholly by the weights trained now (a weight switch mid-answer leaves the
        # earlier tokens' cache from older weights): their logprobs must match the rollout's.
        same = torch.tensor([bool((v == version).all()) for v in rows["versions"]])[:, None]
        t1 = time.monotonic()
        lp = response_logprobs(model, rows["prompt"], rows["response"], T)
        gap = (lp.detach() - behavior).abs() * mask
        ratio = (lp - behavior).exp()
        a = adv.reshape(-1, 1).float()
        pg = -torch.min(ratio * a, ratio.clamp(1 - info["clip_low"], 1 + info["clip_high"]) * a) * mask
        keep = (rewards.std(1) > 0).repeat_interleave(G) if info["dynamic_sampling"] else torch.ones(P * G) > 0
        if info["loss_agg"] == "seq-mean":  # each answer's token mean, then the mean over answers
            loss = (pg.sum(1) / mask.sum(1).clamp(min=1))[keep].sum() / keep.sum().clamp(min=1)
        else:
            loss = pg[keep].sum() / mask[keep].sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), info["max_grad_norm"])
        opt.step()
        warmup.step()
        t2 = time.monotonic()
        span("train step", t1, t2)
        if (step + 1) % info["sync_interval"] == 0 or step + 1 == info["steps"]:
            version += 1
            publisher.publish(model.state_dict(), version)
            span("publish", t2, time.monotonic())
        for meta, _ in groups:  # published first, then acked
            hub.ack(meta)
        trained.update(want)
        row = {"step": step + 1, "version": version, "trainer": "python", "prompts": list(want),
               "loss": loss.item(), "reward_mean": rewards.mean().item(),
               "accuracy": (rewards >= 1).double().mean().item(),
               "response_len_mean": mask.sum().item() / len(rows["response"]),
               "rollout_logprob_gap_mean": (gap.sum() / mask.sum()).item(),
               "same_version_logprob_gap_max": (gap * same).max().item(),
               "wait_seconds": t1 - t0, "train_seconds": time.monotonic() - t1,
               "elapsed_seconds": time.monotonic() - start}
        with open(info["metrics"], "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"step {step + 1}/{info['steps']}: reward {row['reward_mean']:.3f} loss {row['loss']:.4f}", flush=True)
    publisher.close()
    hub.close()


if __name__ == "__main__":
    main()
