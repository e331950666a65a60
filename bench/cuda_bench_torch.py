#!/usr/bin/env python3
"""Baseline for bench_cuda: the same GPT-2 shape trained in the machine's PyTorch, eager and
torch.compile, bf16 autocast, scaled_dot_product_attention (causal), fused AdamW, grad clipping.
Prints tokens/s and MFU in the format bench_cuda uses, so the two can be read side by side.

    python3 bench/cuda_bench_torch.py [--batch 16] [--seq 1024] [--steps 10] [--warmup 3]
                                      [--peak-tflops 989.4] [--modes eager,compile]
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.mp = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mp(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, C=768, H=12, V=50304, T=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.T  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def flops_per_token(L=12, C=768, V=50304, T=1024):
    # As ModelConfig::train_flops_per_token: 6 FLOPs per token per matmul weight (the tied head
    # included) + causal attention.
    matmul = L * 12 * C * C + V * C
    return 6 * matmul + 6 * L * T * C


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    ap.add_argument("--modes", default="eager,compile")
    a = ap.parse_args()
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    N = a.batch * a.seq
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}, batch {a.batch} x {a.seq}")
    for mode in a.modes.split(","):
        torch.manual_seed(0)
        model = GPT(T=a.seq).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), fused=True)
        fwd = torch.compile(model) if mode == "compile" else model
        idx = torch.randint(0, 50304, (a.batch, a.seq), device=dev)
        tgt = torch.roll(idx, -1, dims=1)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(idx, tgt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss

        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / a.steps
        flops = flops_per_token(T=a.seq) * N / dt
        print(f"[{mode}] step {dt * 1e3:.2f} ms, {N / dt:.0f} tokens/s, "
              f"{flops / 1e12:.1f} TFLOP/s, MFU {100 * flops / 1e12 / a.peak_tflops:.1f}%, "
              f"loss {loss.item():.4f}, peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        del model, opt, fwd
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
