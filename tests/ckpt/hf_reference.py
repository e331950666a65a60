#!/usr/bin/env python3
"""A float64 reference of the Hugging Face causal LMs Loom imports (Llama, Qwen2, Qwen3,
Mistral, Phi-3, the mixtures of experts Mixtral and Qwen3-MoE, and Gemma 1, 2 and 3), written from
the published architectures with torch and no Loom code.

  hf_reference.py logits DIR TOKENS OUT   DIR's config.json + model.safetensors (or the sharded
                                          set) -> OUT: float32 logits [len(TOKENS), vocab]
  hf_reference.py hidden DIR TOKENS OUT   the same, OUT: float32 final hidden states (the final
                                          norm's output) [len(TOKENS), hidden_size]
  hf_reference.py make DIR FAMILY SEED    a small random model in FAMILY's transformers layout
                                          (config.json keys and tensor names as transformers
                                          writes them) into DIR

TOKENS is a comma-separated list of token ids at positions 0, 1, ...
"""
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + a:base + b]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).to(torch.float64)
    return out


def read_weights(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(d, "model.safetensors"))
    weights = {}
    with open(index) as f:
        for file in sorted(set(json.load(f)["weight_map"].values())):
            weights.update(read_safetensors(os.path.join(d, file)))
    return weights


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].to(torch.float32).contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half_rope(x, theta):
    # x [T, heads, D]: dimension j pairs with j + D/2, angle pos * theta^(-2j/D).
    T, _, D = x.shape
    inv = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def swiglu(h, gate, up, down):
    return (torch.nn.functional.silu(h @ gate.T) * (h @ up.T)) @ down.T


def sparse_moe(h, router, experts, k, normalise):
    # Softmax over every expert's logit, the top k kept (their weights renormalised to sum to
    # 1 when `normalise`), the chosen experts' outputs summed with those weights.
    probs = (h @ router.T).softmax(-1)
    w, idx = probs.topk(k, dim=-1)
    if normalise:
        w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(h)
    for e, expert in enumerate(experts):
        for slot in range(k):
            rows = idx[:, slot] == e
            if rows.any():
                out[rows] += w[rows, slot, None] * expert(h[rows])
    return out


def mlp(cfg, W, p, h):
    family = cfg["model_type"]
    if family == "mixtral":
        m = p + "block_sparse_moe."
        experts = [lambda x, e=e: swiglu(x, W[m + f"experts.{e}.w1.weight"],
                                         W[m + f"experts.{e}.w3.weight"],
                                         W[m + f"experts.{e}.w2.weight"])
                   for e in range(cfg["num_local_experts"])]
        return sparse_moe(h, W[m + "gate.weight"], experts, cfg["num_experts_per_tok"], True)
    if family == "qwen3_moe":
        m = p + "mlp."
        experts = [lambda x, e=e: swiglu(x, W[m + f"experts.{e}.gate_proj.weight"],
                                         W[m + f"experts.{e}.up_proj.weight"],
                                         W[m + f"experts.{e}.down_proj.weight"])
                   for e in range(cfg["num_experts"])]
        return sparse_moe(h, W[m + "gate.weight"], experts, cfg["num_experts_per_tok"],
                          cfg["norm_topk_prob"])
    return swiglu(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"],
                  W[p + "mlp.down_proj.weight"])


def gemma_norm(x, w, eps):
    # Gemma's RMSNorm scales by (1 + weight): a zero weight is the identity.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def gemma_layer_types(cfg):
    if cfg.get("layer_types"):
        return cfg["layer_types"]
    k = 2 if cfg["model_type"] == "gemma2" else cfg.get("sliding_window_pattern", 6)
    return ["sliding_attention" if (l + 1) % k else "full_attention"
            for l in range(cfg["num_hidden_layers"])]


def gemma_forward(cfg, W, tokens):
    # Gemma: embedding times sqrt(hidden), (1 + w) RMSNorms, GeGLU with the tanh GELU; Gemma 2
    # and 3: the attention and MLP outputs normed before the residual add ("sandwich"), scores
    # scaled by query_pre_attn_scalar^-1/2, windowed layers; Gemma 2 soft-caps scores and
    # logits (cap * tanh(x / cap)); Gemma 3 norms q and k per head and gives windowed layers
    # RoPE base rope_local_base_freq.
    family = cfg["model_type"]
    sandwich = family != "gemma"
    C, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or 256
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    scaling = (cfg["query_pre_attn_scalar"] if sandwich else D) ** -0.5
    attn_cap = cfg.get("attn_logit_softcapping") if sandwich else None
    final_cap = cfg.get("final_logit_softcapping") if sandwich else None
    types = gemma_layer_types(cfg) if sandwich else ["full_attention"] * L
    T = len(tokens)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)] * math.sqrt(C)
    for l in range(L):
        p = f"model.layers.{l}."
        sliding = types[l] == "sliding_attention"
        visible = j <= i
        if sliding:
            visible = visible & (i - j < cfg["sliding_window"])
        th = cfg["rope_local_base_freq"] if family == "gemma3_text" and sliding else theta
        h = gemma_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, D)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, Hkv, D)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, Hkv, D)
        if family == "gemma3_text":
            q = gemma_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = gemma_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rotate_half_rope(q, th), rotate_half_rope(k, th)
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) * scaling
        if attn_cap:
            s = torch.tanh(s / attn_cap) * attn_cap
        s = s.masked_fill(~visible[None], float("-inf")).softmax(-1)
        o = torch.einsum("hts,shd->thd", s, v).reshape(T, H * D) @ W[p + "self_attn.o_proj.weight"].T
        if sandwich:
            x = x + gemma_norm(o, W[p + "post_attention_layernorm.weight"], eps)
            h = gemma_norm(x, W[p + "pre_feedforward_layernorm.weight"], eps)
        else:
            x = x + o
            h = gemma_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.gelu(h @ W[p + "mlp.gate_proj.weight"].T, approximate="tanh")
        m = (gate * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
        x = x + (gemma_norm(m, W[p + "post_feedforward_layernorm.weight"], eps) if sandwich else m)
    x = gemma_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", True) else W["lm_head.weight"]
    logits = x @ head.T
    if final_cap:
        logits = torch.tanh(logits / final_cap) * final_cap
    return logits


def unfuse_phi3(cfg, W):
    # Phi-3 stores q, k, v as one qkv_proj (rows: q heads, k heads, v heads) and gate, up as
    # one gate_up_proj (gate rows first: transformers chunks it in two, gate then up); otherwise
    # it is Llama's model.
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or H
    D = cfg["hidden_size"] // H
    W = dict(W)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        qkv = W.pop(p + "self_attn.qkv_proj.weight")
        W[p + "self_attn.q_proj.weight"] = qkv[:H * D]
        W[p + "self_attn.k_proj.weight"] = qkv[H * D:(H + Hkv) * D]
        W[p + "self_attn.v_proj.weight"] = qkv[(H + Hkv) * D:]
        gate, up = W.pop(p + "mlp.gate_up_proj.weight").chunk(2, dim=0)
        W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"] = gate, up
    return W


def forward(cfg, W, tokens, hidden=False):
    family = cfg["model_type"]
    if family in ("gemma", "gemma2", "gemma3_text"):
        assert not hidden, "the Gemma reference gives logits only"
        return gemma_forward(cfg, W, tokens)
    if family == "phi3":
        assert cfg.get("partial_rotary_factor", 1.0) == 1.0
        W = unfuse_phi3(cfg, W)
    assert family in ("llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen3_moe", "phi3"), family
    assert cfg.get("rope_scaling") is None, "the reference has plain RoPE only"
    C, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or C // H
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    window = cfg.get("sliding_window") if family in ("mistral", "mixtral", "phi3") else None
    T = len(tokens)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    visible = j <= i
    if window is not None:
        visible &= i - j < window  # the last `window` positions, the query's own included
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)

        def proj(name, heads):
            y = h @ W[p + f"self_attn.{name}.weight"].T
            if family == "qwen2":  # Qwen2: biases on q, k and v (not o)
                y = y + W[p + f"self_attn.{name}.bias"]
            return y.reshape(T, heads, D)

        q, k, v = proj("q_proj", H), proj("k_proj", Hkv), proj("v_proj", Hkv)
        if family in ("qwen3", "qwen3_moe"):  # RMSNorm over each head's D, before RoPE
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rotate_half_rope(q, theta), rotate_half_rope(k, theta)
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
        s = s.masked_fill(~visible[None], float("-inf")).softmax(-1)
        o = torch.einsum("hts,shd->thd", s, v).reshape(T, H * D)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        x = x + mlp(cfg, W, p, h)
    x = rms_norm(x, W["model.norm.weight"], eps)
    if hidden:
        return x
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return x @ head.T


def make_gemma(d, family, g):
    C, H, Hkv, D, F, V = 32, 4, 2, 16, 48, 320  # head_dim 16: H * D = 64, not C
    L = {"gemma": 2, "gemma2": 4, "gemma3_text": 4}[family]
    cfg = {"architectures": [{"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                              "gemma3_text": "Gemma3ForCausalLM"}[family]],
           "model_type": family, "hidden_size": C, "intermediate_size": F,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": Hkv,
           "head_dim": D, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "vocab_size": V, "tie_word_embeddings": True,
           "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "float32",
           "initializer_range": 0.02, "use_cache": True, "pad_token_id": 0,
           "bos_token_id": 2, "eos_token_id": 1}
    if family == "gemma":
        cfg.update(hidden_act="gelu_pytorch_tanh", hidden_activation=None)
    else:
        # Small caps and a short window, so that both bind on 48 tokens of a random model.
        cfg.update(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                   sliding_window=8, cache_implementation="hybrid")
    if family == "gemma2":
        cfg.update(attn_logit_softcapping=1.5, final_logit_softcapping=3.0)
    if family == "gemma3_text":
        cfg.update(rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
                   sliding_window_pattern=3, attn_logit_softcapping=None,
                   final_logit_softcapping=None)
        cfg["layer_types"] = gemma_layer_types(cfg)

    def rnd(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    # Norm weights near 0: Gemma's norms scale by 1 + w.
    W = {"model.embed_tokens.weight": rnd(V, C), "model.norm.weight": rnd(C, std=0.1)}
    norms = ["input_layernorm", "post_attention_layernorm"]
    if family != "gemma":
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for l in range(L):
        p = f"model.layers.{l}."
        for n in norms:
            W[p + n + ".weight"] = rnd(C, std=0.1)
        W[p + "self_attn.q_proj.weight"] = rnd(H * D, C)
        W[p + "self_attn.k_proj.weight"] = rnd(Hkv * D, C)
        W[p + "self_attn.v_proj.weight"] = rnd(Hkv * D, C)
        W[p + "self_attn.o_proj.weight"] = rnd(C, H * D)
        if family == "gemma3_text":
            W[p + "self_attn.q_norm.weight"] = rnd(D, std=0.1)
            W[p + "self_attn.k_norm.weight"] = rnd(D, std=0.1)
        W[p + "mlp.gate_proj.weight"] = rnd(F, C)
        W[p + "mlp.up_proj.weight"] = rnd(F, C)
        W[p + "mlp.down_proj.weight"] = rnd(C, F)
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "model.safetensors"), W)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def make(d, family, seed):
    g = torch.Generator().manual_seed(seed)
    if family in ("gemma", "gemma2", "gemma3_text"):
        return make_gemma(d, family, g)
    C, L, H, Hkv, D, F, V = 32, 2, 4, 2, 8, 48, 320
    E, K = 4, 2  # the mixtures of experts: experts, and experts per token
    cfg = {"architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                              "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM",
                              "mixtral": "MixtralForCausalLM", "phi3": "Phi3ForCausalLM",
                              "qwen3_moe": "Qwen3MoeForCausalLM"}[family]],
           "model_type": family, "hidden_act": "silu", "hidden_size": C,
           "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H,
           "num_key_value_heads": Hkv, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "rope_scaling": None, "vocab_size": V,
           "tie_word_embeddings": family == "qwen2", "torch_dtype": "float32",
           "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True}
    if family == "qwen3":
        cfg.update(head_dim=D, attention_bias=False, use_sliding_window=False,
                   sliding_window=None, max_window_layers=L)
    elif family == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=4096, max_window_layers=L)
        D = C // H
    elif family == "mistral":
        cfg.update(head_dim=D, sliding_window=64)
    elif family == "mixtral":
        cfg.update(head_dim=D, sliding_window=None, num_local_experts=E, num_experts_per_tok=K,
                   router_aux_loss_coef=0.02, output_router_logits=False,
                   router_jitter_noise=0.0)
    elif family == "qwen3_moe":
        cfg.update(head_dim=D, attention_bias=False, use_sliding_window=False,
                   sliding_window=None, max_window_layers=L, num_experts=E,
                   num_experts_per_tok=K, moe_intermediate_size=F, decoder_sparse_step=1,
                   mlp_only_layers=[], norm_topk_prob=True, router_aux_loss_coef=0.001,
                   output_router_logits=False)
    elif family == "phi3":
        D = C // H  # Phi-3 has no head_dim field
        cfg.update(sliding_window=64, original_max_position_embeddings=128, resid_pdrop=0.0,
                   embd_pdrop=0.0, partial_rotary_factor=1.0, pad_token_id=0)
    else:
        cfg.update(head_dim=D, attention_bias=False, mlp_bias=False, pretraining_tp=1)

    def rnd(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    W = {"model.embed_tokens.weight": rnd(V, C), "model.norm.weight": 1 + rnd(C, std=0.1)}
    if not cfg["tie_word_embeddings"]:
        W["lm_head.weight"] = rnd(V, C)
    for l in range(L):
        p = f"model.layers.{l}."
        W[p + "input_layernorm.weight"] = 1 + rnd(C, std=0.1)
        W[p + "post_attention_layernorm.weight"] = 1 + rnd(C, std=0.1)
        W[p + "self_attn.q_proj.weight"] = rnd(H * D, C)
        W[p + "self_attn.k_proj.weight"] = rnd(Hkv * D, C)
        W[p + "self_attn.v_proj.weight"] = rnd(Hkv * D, C)
        W[p + "self_attn.o_proj.weight"] = rnd(C, H * D)
        if family == "qwen2":
            for n, rows in (("q_proj", H * D), ("k_proj", Hkv * D), ("v_proj", Hkv * D)):
                W[p + f"self_attn.{n}.bias"] = rnd(rows)
        if family in ("qwen3", "qwen3_moe"):
            W[p + "self_attn.q_norm.weight"] = 1 + rnd(D, std=0.1)
            W[p + "self_attn.k_norm.weight"] = 1 + rnd(D, std=0.1)
        if family == "mixtral":
            m = p + "block_sparse_moe."
            W[m + "gate.weight"] = rnd(E, C, std=1.0)
            for e in range(E):
                W[m + f"experts.{e}.w1.weight"] = rnd(F, C)
                W[m + f"experts.{e}.w3.weight"] = rnd(F, C)
                W[m + f"experts.{e}.w2.weight"] = rnd(C, F)
            continue
        m = p + "mlp."
        if family == "qwen3_moe":
            W[m + "gate.weight"] = rnd(E, C, std=1.0)
            m += "experts.{}."
        for e in range(E if family == "qwen3_moe" else 1):
            W[m.format(e) + "gate_proj.weight"] = rnd(F, C)
            W[m.format(e) + "up_proj.weight"] = rnd(F, C)
            W[m.format(e) + "down_proj.weight"] = rnd(C, F)
    if family == "phi3":  # its fused layout
        for l in range(L):
            p = f"model.layers.{l}."
            W[p + "self_attn.qkv_proj.weight"] = torch.cat(
                [W.pop(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            W[p + "mlp.gate_up_proj.weight"] = torch.cat(
                [W.pop(p + "mlp.gate_proj.weight"), W.pop(p + "mlp.up_proj.weight")])
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "model.safetensors"), W)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    if len(sys.argv) == 5 and sys.argv[1] in ("logits", "hidden"):
        d, tokens, out = sys.argv[2], [int(t) for t in sys.argv[3].split(",")], sys.argv[4]
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        logits = forward(cfg, read_weights(d), tokens, sys.argv[1] == "hidden")
        logits = logits.to(torch.float32).contiguous()
        with open(out, "wb") as f:
            f.write(logits.numpy().tobytes())
    elif len(sys.argv) == 5 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
