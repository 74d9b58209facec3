#!/usr/bin/python3
"""The PyTorch peer of `toy bench vision`: training and inference speed of a plain ViT.

Run with Debian's python3-torch (the `python3` first on PATH may lack torch), e.g.

    /usr/bin/python3 bench/peers/vit_peer.py --image 28 --channels 1 --patch 4 --dim 128 \
        --layers 6 --heads 4 --mlp 256 --classes 10 --batch 128 --steps 5 --warmup 2 --threads 1

The model is toy's ViT (models/vit.h) written the usual PyTorch way: nn.Conv2d patch
embedding with stride = patch, a class token, learned positions, pre-norm blocks (nn.LayerNorm,
fused qkv nn.Linear, all heads in one batched matmul + softmax — torch 1.13, Debian 12's, has
no scaled_dot_product_attention — exact nn.GELU MLP), a final LayerNorm and a linear head.
A training step: forward on a random batch, label-smoothed cross-entropy, backward, clip the
global gradient norm, AdamW (weight decay on matrices), zero the gradients. --mode infer times
forward passes under torch.no_grad() instead. Prints one JSON line {"images_per_s": X, ...}.
"""
import argparse
import json
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in [("image", 28), ("channels", 1), ("patch", 4), ("dim", 128), ("layers", 6), ("heads", 4),
                          ("mlp", 256), ("classes", 10), ("batch", 128), ("steps", 5), ("warmup", 2),
                          ("threads", 1), ("blas-threads", 0), ("seed", 1)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    return p.parse_args()


ARGS = parse_args()
if ARGS.blas_threads > 0:  # before torch loads OpenBLAS
    os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.blas_threads)

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"vit_peer.py: cannot import torch ({e}); apt-get install python3-torch libopenblas0-pthread")


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads = a.heads
        self.ln1 = nn.LayerNorm(a.dim, eps=1e-6)
        self.qkv = nn.Linear(a.dim, 3 * a.dim)
        self.proj = nn.Linear(a.dim, a.dim)
        self.ln2 = nn.LayerNorm(a.dim, eps=1e-6)
        self.up = nn.Linear(a.dim, a.mlp)
        self.act = nn.GELU()
        self.down = nn.Linear(a.mlp, a.dim)

    def forward(self, x):
        B, T, D = x.shape
        H = self.heads
        q, k, v = self.qkv(self.ln1(x)).reshape(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) * (D // H) ** -0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.down(self.act(self.up(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, a):
        super().__init__()
        n = (a.image // a.patch) ** 2
        self.patch = nn.Conv2d(a.channels, a.dim, a.patch, stride=a.patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, a.dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, a.dim) * 0.02)
        self.blocks = nn.ModuleList([Block(a) for _ in range(a.layers)])
        self.norm = nn.LayerNorm(a.dim, eps=1e-6)
        self.head = nn.Linear(a.dim, a.classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)[:, 0])


def main():
    a = ARGS
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = ViT(a)
    x = torch.randn(a.batch, a.channels, a.image, a.image)
    y = torch.randint(0, a.classes, (a.batch,))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-3)

    def train_step():
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer_step():
        with torch.no_grad():
            model(x)

    step = train_step if a.mode == "train" else infer_step
    if a.mode == "infer":
        model.eval()
    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = time.perf_counter() - t0
    print(json.dumps({"images_per_s": a.steps * a.batch / dt, "threads": a.threads, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
