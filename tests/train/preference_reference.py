#!/usr/bin/env python3
"""Preference losses recomputed in float64 torch from their published definitions (the forms
TRL's DPOTrainer, CPOTrainer, ORPOTrainer and KTOTrainer compute), for dpo_test.cpp.

Usage: preference_reference.py IN.json OUT.json
IN: one case or a list of cases (OUT then a list), each
    {"loss": "reward", "scores": [...]} (a reward model's pairs), or
    {"loss", "beta", "simpo_gamma", "cpo_alpha", "desirable_weight", "undesirable_weight",
     "pi": [[log p of each reply token] per row], "ref": [...] or null, "labels": [bool] (kto)}
Rows 2k and 2k+1 are pair k (chosen, rejected), or for kto example k and its mismatched row.
OUT: {"loss": the micro-batch's loss (means as TRL takes them), "grad": d loss / d token log-prob
      per row and token, "rewards_chosen", "rewards_rejected": means}
"""
import json
import sys

import torch
import torch.nn.functional as F


def log1mexp(x):
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)),
                       torch.log(-torch.expm1(x)))


def main():
    cfg = json.load(open(sys.argv[1]))
    if isinstance(cfg, list):  # several cases in one run (one torch start-up)
        json.dump([compute(c) for c in cfg], open(sys.argv[2], "w"))
    else:
        json.dump(compute(cfg), open(sys.argv[2], "w"))


def compute(cfg):
    if cfg["loss"] == "reward":
        # A reward model's Bradley-Terry loss (TRL's RewardTrainer): scores of rows 2k (chosen)
        # and 2k+1 (rejected), -log sigmoid(r_c - r_r) averaged over pairs.
        r = torch.tensor(cfg["scores"], dtype=torch.float64, requires_grad=True)
        loss = -F.logsigmoid(r[0::2] - r[1::2]).mean()
        loss.backward()
        return {"loss": loss.item(), "grad": r.grad.tolist(),
                "accuracy": (r[0::2] > r[1::2]).double().mean().item()}
    kind, beta = cfg["loss"], cfg["beta"]
    tok = [torch.tensor(r, dtype=torch.float64, requires_grad=True) for r in cfg["pi"]]
    ref_rows = cfg.get("ref")
    sums = torch.stack([t.sum() for t in tok])
    lens = torch.tensor([max(1, len(r)) for r in cfg["pi"]], dtype=torch.float64)
    ref = (torch.tensor([sum(r) for r in ref_rows], dtype=torch.float64)
           if ref_rows is not None else torch.zeros_like(sums))
    pc, pr, rc, rr = sums[0::2], sums[1::2], ref[0::2], ref[1::2]
    nc, nr = lens[0::2], lens[1::2]
    # The chosen replies' NLL: cross-entropy averaged over every chosen reply token of the batch.
    nll = -pc.sum() / sum(len(r) for r in cfg["pi"][0::2])
    if kind == "sigmoid":
        loss = -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()
        rw_c, rw_r = beta * (pc - rc), beta * (pr - rr)
    elif kind == "hinge":
        loss = torch.relu(1 - beta * ((pc - rc) - (pr - rr))).mean()
        rw_c, rw_r = beta * (pc - rc), beta * (pr - rr)
    elif kind == "ipo":
        delta = (pc - rc) / nc - (pr - rr) / nr
        loss = ((delta - 1 / (2 * beta)) ** 2).mean()
        rw_c, rw_r = beta * (pc - rc), beta * (pr - rr)
    elif kind == "simpo":
        logits = pc / nc - pr / nr - cfg["simpo_gamma"] / beta
        loss = -F.logsigmoid(beta * logits).mean() + cfg["cpo_alpha"] * nll
        rw_c, rw_r = beta * pc / nc, beta * pr / nr
    elif kind == "orpo":
        ac, ar = pc / nc, pr / nr
        log_odds = (ac - ar) - (log1mexp(ac) - log1mexp(ar))
        loss = nll - (beta * F.logsigmoid(log_odds)).mean()
        rw_c, rw_r = beta * ac, beta * ar
    elif kind == "kto":
        labels = torch.tensor(cfg["labels"], dtype=torch.bool)
        logratio = pc - rc  # the examples (rows 2k)
        kl = (pr - rr).mean().detach().clamp(min=0)  # the mismatched rows, no gradient
        chosen = 1 - torch.sigmoid(beta * (logratio[labels] - kl))
        rejected = 1 - torch.sigmoid(beta * (kl - logratio[~labels]))
        losses = torch.cat((cfg["desirable_weight"] * chosen, cfg["undesirable_weight"] * rejected))
        loss = losses.mean()
        rw_c, rw_r = beta * logratio[labels], beta * logratio[~labels]
    else:
        raise SystemExit("unknown loss " + kind)
    loss.backward()
    out = {
        "loss": loss.item(),
        "grad": [(t.grad if t.grad is not None else torch.zeros_like(t)).tolist() for t in tok],
        "rewards_chosen": rw_c.mean().item() if rw_c.numel() else 0.0,
        "rewards_rejected": rw_r.mean().item() if rw_r.numel() else 0.0,
    }
    return out


if __name__ == "__main__":
    main()
