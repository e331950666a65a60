#!/usr/bin/env python3
"""PyTorch eager KV-cache decode baseline for `loom bench serve --decode`.

A gpt2-124m-shaped decoder (12 layers, d_model 768, 12 heads, vocabulary 50304, fp32, random
weights) written plainly in PyTorch eager mode with a preallocated KV cache: prefill of the
prompt, then one token at a time (greedy). Prints single-stream and batch-16 decode tokens/s
and the flags that make `loom bench serve` print its ratios to them:

    /usr/bin/python3 bench/torch_decode_baseline.py --threads 2
    build/loom bench serve --decode --no-load --torch-single S --torch-batch B

Prerequisite: PyTorch (Debian: `apt-get install -y python3-torch`, 1.13, for the system's
/usr/bin/python3). Skips (exit 0, a message saying so) when torch is not installed.
"""
import argparse
import json
import math
import sys
import time


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return -1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens per stream")
    ap.add_argument("--batch", type=int, default=16, help="streams of the batched run")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50304)
    args = ap.parse_args()
    for name in ("threads", "prompt", "tokens", "batch", "layers", "d_model", "heads", "vocab"):
        if getattr(args, name) < 1:
            sys.exit(f"--{name.replace('_', '-')} must be >= 1")
    if args.tokens < 2:
        sys.exit("--tokens must be >= 2 (decode rate is timed after the first token)")
    if args.d_model % args.heads:
        sys.exit(f"--heads {args.heads} must divide --d-model {args.d_model}")
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print(f"skipped: PyTorch is not installed for {sys.executable} (Debian: apt-get install "
              "python3-torch, then run this with /usr/bin/python3); no baseline figures")
        return 0

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    L, C, H, V = args.layers, args.d_model, args.heads, args.vocab
    D = C // H
    T = args.prompt + args.tokens

    def w(*shape):
        return torch.randn(*shape) * 0.02

    layers = [
        dict(ln1=(torch.ones(C), torch.zeros(C)), qkv=(w(3 * C, C), torch.zeros(3 * C)),
             proj=(w(C, C), torch.zeros(C)), ln2=(torch.ones(C), torch.zeros(C)),
             fc=(w(4 * C, C), torch.zeros(4 * C)), mp=(w(C, 4 * C), torch.zeros(C)))
        for _ in range(L)
    ]
    wte, wpe, lnf = w(V, C), w(T, C), (torch.ones(C), torch.zeros(C))

    def attend(q, keys, vals, mask):
        """softmax(q k^T / sqrt(D), masked) v: PyTorch 2's fused kernel where there is one, else
        the same in plain ops (Debian's python3-torch is 1.13, before scaled_dot_product_attention).
        """
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
        s = (q @ keys.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ vals

    def forward(tokens, pos0, kc, vc):
        """tokens [B, n] at positions pos0.. ; kc/vc: per layer [B, H, T, D], filled in place."""
        B, n = tokens.shape
        x = wte[tokens] + wpe[pos0:pos0 + n]
        for l, p in enumerate(layers):
            h = F.layer_norm(x, (C,), *p["ln1"])
            q, k, v = F.linear(h, *p["qkv"]).view(B, n, 3, H, D).permute(2, 0, 3, 1, 4)
            kc[l][:, :, pos0:pos0 + n] = k
            vc[l][:, :, pos0:pos0 + n] = v
            keys, vals = kc[l][:, :, :pos0 + n], vc[l][:, :, :pos0 + n]
            # Causal within the new tokens; every cached position is visible.
            mask = torch.ones(n, pos0 + n, dtype=torch.bool).tril(diagonal=pos0)
            a = attend(q, keys, vals, mask)
            x = x + F.linear(a.transpose(1, 2).reshape(B, n, C), *p["proj"])
            h = F.layer_norm(x, (C,), *p["ln2"])
            x = x + F.linear(F.gelu(F.linear(h, *p["fc"]), approximate="tanh"), *p["mp"])
        return F.linear(F.layer_norm(x[:, -1], (C,), *lnf), wte)  # tied head, last row only

    def decode_rate(B):
        g = torch.Generator().manual_seed(B)
        prompt = torch.randint(0, V, (B, args.prompt), generator=g)
        kc = [torch.zeros(B, H, T, D) for _ in range(L)]
        vc = [torch.zeros(B, H, T, D) for _ in range(L)]
        with torch.inference_mode():
            nxt = forward(prompt, 0, kc, vc).argmax(-1, keepdim=True)  # prefill: token 1
            t0 = time.perf_counter()
            for i in range(1, args.tokens):
                nxt = forward(nxt, args.prompt + i - 1, kc, vc).argmax(-1, keepdim=True)
            dt = time.perf_counter() - t0
        return B * (args.tokens - 1) / dt

    load_before = load_average()
    decode_rate(1)  # warm-up: allocator, thread pool, kernels
    single = decode_rate(1)
    batch = decode_rate(args.batch)
    params = L * (12 * C * C + 13 * C) + V * C + T * C + 2 * C
    out = dict(baseline="pytorch-eager-kv-cache", torch=torch.__version__, threads=args.threads,
               params=params, prompt=args.prompt, tokens=args.tokens,
               single_stream_tokens_per_s=single, batch=args.batch,
               batch_tokens_per_s=batch, load_average_before=load_before,
               load_average_after=load_average())
    print(f"PyTorch {torch.__version__} eager, KV cache, fp32, {args.threads} threads: "
          f"single stream {single:.2f} tok/s, batch {args.batch} {batch:.2f} tok/s "
          f"(load {load_before:.2f} -> {load_average():.2f})")
    print(f"compare: loom bench serve --decode --no-load --streams {args.batch} "
          f"--torch-single {single:.2f} --torch-batch {batch:.2f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
