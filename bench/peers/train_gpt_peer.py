#!/usr/bin/python3
"""The PyTorch peer of `toy bench train`: training speed of a plain nanoGPT-style GPT.

Run with Debian's python3-torch (the `python3` first on PATH may lack torch), e.g.

    /usr/bin/python3 bench/peers/train_gpt_peer.py --layers 4 --heads 4 --dim 128 --ctx 64 \
        --batch 12 --vocab 65 --steps 20 --warmup 3 --reps 3 --threads 1

Each step is what nanoGPT's train.py does on CPU: sample random windows of the token stream,
forward + cross-entropy, backward, clip the global gradient norm, AdamW step, zero the
gradients. It prints one JSON line: {"tokens_per_s": median over reps, ...}.

The model is written the way nanoGPT writes it (fused qkv Linear, all heads in one batched
matmul, LayerNorm with bias, GELU MLP, tied head), except that attention is matmul + causal
mask + softmax: torch 1.13 (Debian 12) has no scaled_dot_product_attention.

The token stream is the same on both sides of the benchmark: token i is splitmix64 of
(seed + (i + 1) * golden ratio) modulo the vocabulary (toy computes the same numbers in C++).
Speed does not depend on the text, but this way neither side gets an easier input.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=20, help="timed steps per repetition")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before the first repetition")
    p.add_argument("--reps", type=int, default=3, help="repetitions (the median is reported)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--blas-threads", type=int, default=0,
                   help="OpenBLAS threads (default 0: OpenBLAS's own choice, all cores)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--stream-tokens", type=int, default=1 << 16, help="length of the synthetic token stream")
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="bf16: forward and loss under torch.autocast(cpu, bfloat16), toy's --precision bf16")
    return p.parse_args()


ARGS = parse_args()
# OpenBLAS sizes its own thread pool when it is loaded, independently of torch's threads, so
# it must be set before torch is imported. By default it is left alone: on this project's
# 2-core machines torch at 1 thread with OpenBLAS on both cores for the GEMMs is the fastest
# configuration of the peer (torch at 2 threads with OpenBLAS at 2 oversubscribes the cores).
if ARGS.blas_threads > 0:
    os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.blas_threads)

try:
    import numpy as np  # python3-torch depends on python3-numpy
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"train_gpt_peer.py: cannot import torch/numpy ({e}); apt-get install python3-torch "
             "libopenblas0-pthread")


def token_stream(n, vocab, seed):
    """splitmix64(seed + (i + 1) * golden) % vocab for i in [0, n), as int64."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return torch.from_numpy((z % np.uint64(vocab)).astype(np.int64))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, ctx):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)).view(1, 1, ctx, ctx))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)  # (B, H, T, d)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, dim, heads, ctx):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, ctx)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.dim)
        self.wpe = nn.Embedding(a.ctx, a.dim)
        self.h = nn.ModuleList([Block(a.dim, a.heads, a.ctx) for _ in range(a.layers)])
        self.ln_f = nn.LayerNorm(a.dim)
        self.lm_head = nn.Linear(a.dim, a.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied head
        # nanoGPT's init (does not change the speed; here so the loss behaves like a real run).
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * a.layers))

    def forward(self, idx, targets):
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def loaded_blas():
    """The BLAS library this process has mapped (Debian's torch calls libblas.so.3, which the
    alternatives system points at OpenBLAS when libopenblas0-pthread is installed)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower() and "/" in line}
        real = sorted({os.path.realpath(p) for p in paths})
        return ", ".join(real) if real else None
    except OSError:
        return None


def main():
    a = ARGS
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    data = token_stream(a.stream_tokens, a.vocab, a.seed)
    model = GPT(a)
    model.train()
    # nanoGPT's configure_optimizers: weight decay on matrices and embeddings only.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2))

    def get_batch():
        # nanoGPT's get_batch: B random windows of ctx + 1 tokens.
        ix = torch.randint(len(data) - a.ctx, (a.batch,))
        x = torch.stack([data[i:i + a.ctx] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + a.ctx] for i in ix])
        return x, y

    losses = []

    def step():
        x, y = get_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())

    for _ in range(a.warmup):
        step()
    rates = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        rates.append(a.steps * a.batch * a.ctx / (time.perf_counter() - t0))
    print(json.dumps({"tokens_per_s": statistics.median(rates), "reps": rates, "threads": a.threads,
                      "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
                      "torch": torch.__version__, "precision": a.precision, "blas": loaded_blas(), "last_loss": losses[-1] if losses else None}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
