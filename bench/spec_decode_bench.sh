#!/usr/bin/env bash
# Speculative decoding with prompt lookup (`--speculative ngram`) against plain decoding, on a
# workload whose output repeats its prompt: a byte-level GPT-2-style model (6 layers, d_model
# 384, context 1024) is trained here for about a minute on a 600-byte document of generated
# sentences, repeated, then given 4 prompts that each hold the whole document (from a different
# sentence on) and go on with it (what a model quoting or summarising a document it was given
# does: long spans of its output are in its prompt; here nearly all of it is, the favourable
# end of that workload). Both runs decode the same prompts greedily (their outputs are checked
# equal), one stream at a time (--max-num-seqs 1, one thread); prints tokens/s of each, the ratio, the acceptance rate and the load average.
# With DRAFT_STEPS > 0, a draft model (2 layers, d_model 128, the same bytes) is trained on the
# same document for that many steps and `--speculative draft` runs beside them (its ratio to
# plain decoding printed too).
# spec_decode_bench.sh LOOM [STEPS=600] [K=5] [DRAFT_STEPS=0]
set -euo pipefail
loom=$1
steps=${2:-600}
k=${3:-5}
draft_steps=${4:-0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work" <<'PY'
import json, random, sys
work = sys.argv[1]
random.seed(1)
words = ("the river town market bridge winter harvest council lantern merchant road north "
         "quiet mill stone children festival bell tower ledger rain field orchard").split()
sents = [" ".join(random.choice(words) for _ in range(random.randint(8, 16))).capitalize() + "."
         for _ in range(7)]
doc = " ".join(sents) + " "
open(f"{work}/doc.txt", "w").write(doc * 600)
with open(f"{work}/prompts.jsonl", "w") as f:
    for s in (0, 2, 4, 6):  # the document from its sentence s on, then its start again
        text = " ".join(sents[s:] + sents[:s]) + " "
        f.write(json.dumps({"prompt": text + text[:60]}) + "\n")
PY
echo "training the model ($steps steps)..."
timeout 900 "$loom" train --set model.family=gpt2 --set model.n_layer=6 --set model.d_model=384 \
  --set model.n_head=6 --set model.max_seq=1024 --set train.seq_len=1024 --set train.steps="$steps" \
  --set train.micro_batch=2 --set train.peak_gflops=1 --set optim.lr=3e-3 \
  --set optim.warmup_steps=20 --set train.quiet=true --set data.paths="$work/doc.txt" \
  --set train.out_dir="$work/run" > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
if [ "$draft_steps" -gt 0 ]; then
  echo "training the draft model ($draft_steps steps)..."
  timeout 900 "$loom" train --set model.family=gpt2 --set model.n_layer=2 --set model.d_model=128 \
    --set model.n_head=2 --set model.max_seq=1024 --set train.seq_len=1024 \
    --set train.steps="$draft_steps" --set train.micro_batch=2 --set train.peak_gflops=1 \
    --set optim.lr=3e-3 --set optim.warmup_steps=20 --set train.quiet=true \
    --set data.paths="$work/doc.txt" --set train.out_dir="$work/draft" > "$work/draft_train.log" 2>&1 ||
    { cat "$work/draft_train.log"; exit 1; }
fi
run() {
  OMP_NUM_THREADS=1 \
  timeout 900 "$loom" generate --ckpt "$work/run/checkpoints" --input "$work/prompts.jsonl" \
    --tokens 200 --temperature 0 --ignore-eos --max-num-seqs 1 --output "$work/$1.jsonl" "${@:2}" \
    < /dev/null 2>&1 | tee "$work/$1.log" | grep -E "tokens in|acceptance" || true
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run plain
run spec --speculative ngram --num-speculative-tokens "$k"
if [ "$draft_steps" -gt 0 ]; then
  run draft --speculative draft --speculative-model "$work/draft/checkpoints" \
    --num-speculative-tokens "$k"
  cmp -s "$work/plain.jsonl" "$work/draft.jsonl" || { echo "draft outputs differ"; exit 1; }
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
cmp -s "$work/plain.jsonl" "$work/spec.jsonl" || { echo "outputs differ"; exit 1; }
/usr/bin/python3 - "$work" "$k" "$load_before" "$load_after" "$draft_steps" <<'PY'
import re, sys
work, k, lb, la, draft_steps = sys.argv[1:]
def rate(name):
    log = open(f"{work}/{name}.log").read()
    m = re.search(r"\((\d+) tokens in ([0-9.e-]+) s\)", log)
    if not m:
        sys.exit(f"{name}: no timing in the output of loom generate:\n{log}")
    return int(m.group(1)) / float(m.group(2))
def acc(name):
    m = re.search(r"acceptance ([0-9.]+)", open(f"{work}/{name}.log").read())
    return float(m.group(1)) if m else float("nan")
p, s = rate("plain"), rate("spec")
print(f"plain decoding:           {p:8.1f} tok/s")
print(f"ngram speculation (k={k}): {s:8.1f} tok/s, acceptance rate {acc('spec'):.3f}")
print(f"ratio (ngram / plain):    {s / p:8.2f}x   (outputs equal)")
if int(draft_steps) > 0:
    d = rate("draft")
    print(f"draft model (k={k}):       {d:8.1f} tok/s, acceptance rate {acc('draft'):.3f}")
    print(f"ratio (draft / plain):    {d / p:8.2f}x   (outputs equal)")
print(f"load average before {lb}, after {la}")
PY
