#!/usr/bin/python3
"""The PyTorch peer of `toy bench finetune`: LoRA fine-tuning speed and memory, plain PyTorch.

Run with Debian's python3-torch (the `python3` first on PATH may lack torch), e.g.

    /usr/bin/python3 bench/peers/finetune_lora_peer.py --dim 576 --layers 30 --heads 9 --kv-heads 3 \
        --ffn 1536 --vocab 49152 --ctx 512 --batch 4 --steps 2 --threads 2

The model is a Llama-shaped decoder as SmolLM2 has it (RMSNorm, RoPE on halves, GQA, SwiGLU,
tied head), random and frozen; LoRA adapters (rank --rank, alpha --alpha, A small Gaussian,
B zero — as PEFT's "gaussian" init) on all seven projections of every block train with AdamW.
Each block runs under torch.utils.checkpoint (toy's --recompute). A step: a batch of random
token windows, forward, cross-entropy over every position, backward, clip, AdamW, zero grad.
Prints one JSON line: {"tokens_per_s": ..., "peak_rss_mb": ..., "torch": ..., "threads": ...};
tokens per second count every step, the first included (as `toy finetune` reports them).
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in [("dim", 576), ("layers", 30), ("heads", 9), ("kv-heads", 3), ("ffn", 1536),
                          ("vocab", 49152), ("ctx", 512), ("batch", 4), ("steps", 2), ("rank", 8),
                          ("threads", 1), ("seed", 1337)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--lr", type=float, default=1e-4)
    return p.parse_args()


class LoraLinear(torch.nn.Module):
    def __init__(self, fan_in, fan_out, rank, alpha):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(fan_out, fan_in) * 0.02, requires_grad=False)
        self.a = torch.nn.Parameter(torch.randn(rank, fan_in) / math.sqrt(fan_in))
        self.b = torch.nn.Parameter(torch.zeros(fan_out, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return F.linear(x, self.weight) + F.linear(F.linear(x, self.a), self.b) * self.scale


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):  # x [B, H, T, d], rotate_half (NEOX) as HF's Llama
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.h, self.kv, self.d = a.heads, a.kv_heads, a.dim // a.heads
        mk = lambda i, o: LoraLinear(i, o, a.rank, a.alpha)
        self.q, self.k, self.v = mk(a.dim, a.dim), mk(a.dim, self.kv * self.d), mk(a.dim, self.kv * self.d)
        self.o = mk(a.dim, a.dim)
        self.gate, self.up, self.down = mk(a.dim, a.ffn), mk(a.dim, a.ffn), mk(a.ffn, a.dim)
        self.n1, self.n2 = RMSNorm(a.dim), RMSNorm(a.dim)

    def forward(self, x, cos, sin, mask):
        B, T, D = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, T, self.h, self.d).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv, self.d).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv, self.d).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = self.h // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.d) + mask
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(y)
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    emb = torch.nn.Parameter(torch.randn(a.vocab, a.dim) * 0.02, requires_grad=False)
    blocks = torch.nn.ModuleList([Block(a) for _ in range(a.layers)])
    norm = RMSNorm(a.dim)
    d = a.dim // a.heads
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.outer(torch.arange(a.ctx).float(), inv)
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
    mask = torch.full((a.ctx, a.ctx), float("-inf")).triu(1)
    params = [p for p in blocks.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(a.seed)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.ctx + 1), generator=g)
        x = F.embedding(ids[:, :-1], emb)
        for blk in blocks:
            x = checkpoint(blk, x, cos, sin, mask, use_reentrant=False)
        logits = F.linear(norm(x), emb)
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    secs = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"tokens_per_s": a.steps * a.batch * a.ctx / secs, "peak_rss_mb": rss_mb,
                      "torch": torch.__version__, "threads": a.threads, "loss": float(loss)}))


if __name__ == "__main__":
    main()
