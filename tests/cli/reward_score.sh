#!/usr/bin/env bash
# A reward model end to end through the command line: `loom train` with train.mode = "reward"
# on preference pairs, `loom score` of JSONL lines (the chosen replies outscore the rejected
# ones; --min-reward keeps only the lines at or above it), and rejection sampling
# (`loom score --policy --n`): the best of n completions per prompt as SFT lines.
# reward_score.sh LOOM
set -uo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "reward_score.sh: $*"; exit 1; }
python3 - "$work" <<'PY'
import json, random, sys
w = sys.argv[1]
random.seed(3)
with open(w + "/pairs.jsonl", "w") as f, open(w + "/score.jsonl", "w") as g, open(w + "/prompts.jsonl", "w") as h:
    for i in range(160):
        word = "".join(random.choice("abcdef") for _ in range(4))
        f.write(json.dumps({"prompt": "rev " + word, "chosen": word[::-1], "rejected": "zzzz"}) + "\n")
    for word in ["abcd", "fedc", "bead"]:
        g.write(json.dumps({"prompt": "rev " + word, "completion": word[::-1]}) + "\n")
        g.write(json.dumps({"prompt": "rev " + word, "completion": "zzzz"}) + "\n")
        h.write(json.dumps({"prompt": "rev " + word}) + "\n")
with open(w + "/corpus.txt", "w") as c:
    for l in open(w + "/pairs.jsonl"):
        j = json.loads(l)
        c.write(j["prompt"] + " " + j["chosen"] + " " + j["rejected"] + "\n")
PY
# A small BPE vocabulary with ChatML's markers (the reward model's and the policy's).
"$loom" tokenizer train --input "$work/corpus.txt" --vocab-size 300 --special "<|endoftext|>" \
  --special "<|im_start|>" --special "<|im_end|>" --out "$work/tok" >/dev/null 2>&1 ||
  fail "tokenizer training failed"
common=(--set model.preset=tiny-llama --set model.n_layer=2 --set model.d_model=32
  --set model.n_head=4 --set model.n_kv_head=2 --set model.d_ff=64 --set model.max_seq=48
  --set model.vocab=320
  --set model.init_std=0.1 --set train.seq_len=48 --set train.micro_batch=4 --set train.quiet=true
  --set train.peak_gflops=1 --set data.tokenizer="loom:$work/tok" --set optim.lr=3e-3
  --set optim.warmup_steps=2)
"$loom" train "${common[@]}" --set train.mode=reward --set data.source=preference \
  --set data.path="$work/pairs.jsonl" --set train.steps=40 --set train.out_dir="$work/rm" \
  >"$work/rm.log" 2>&1 || { tail -20 "$work/rm.log"; fail "reward training failed"; }
"$loom" score --ckpt "$work/rm/checkpoints" --input "$work/score.jsonl" --output "$work/scored.jsonl" \
  >"$work/score.log" 2>&1 || { cat "$work/score.log"; fail "loom score failed"; }
python3 - "$work" <<'PY' || fail "scores"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/scored.jsonl")]
assert len(rows) == 6, rows
for k in range(3):
    good, bad = rows[2 * k], rows[2 * k + 1]
    assert good["completion"] != "zzzz" and good["reward"] > bad["reward"], (good, bad)
print("ok: chosen replies outscore 'zzzz':", [round(r["reward"], 3) for r in rows])
PY
[ $? -eq 0 ] || exit 1
mid=$(python3 -c "import json,sys; r=sorted(json.loads(l)['reward'] for l in open('$work/scored.jsonl')); print((r[2]+r[3])/2)")
"$loom" score --ckpt "$work/rm/checkpoints" --input "$work/score.jsonl" --output "$work/kept.jsonl" \
  --min-reward "$mid" >/dev/null 2>&1 || fail "--min-reward failed"
[ "$(wc -l < "$work/kept.jsonl")" -eq 3 ] || { cat "$work/kept.jsonl"; fail "--min-reward kept not 3 lines"; }
grep -q '"zzzz"' "$work/kept.jsonl" && fail "--min-reward kept a rejected reply"
echo "ok: --min-reward $mid kept the 3 chosen replies"
# A policy to sample from (a few SFT steps), then the best of 4 completions per prompt.
python3 -c "
import json
with open('$work/sft.jsonl','w') as f:
    for l in open('$work/pairs.jsonl'):
        j=json.loads(l); f.write(json.dumps({'prompt': j['prompt'], 'completion': j['chosen']})+'\n')"
"$loom" train "${common[@]}" --set train.mode=sft --set data.source=chat \
  --set data.path="$work/sft.jsonl" --set train.steps=4 --set train.out_dir="$work/policy" \
  >"$work/policy.log" 2>&1 || { tail -20 "$work/policy.log"; fail "policy training failed"; }
"$loom" score --ckpt "$work/rm/checkpoints" --policy "$work/policy/checkpoints" --n 4 --tokens 6 \
  --input "$work/prompts.jsonl" --output "$work/best.jsonl" >"$work/best.log" 2>&1 ||
  { cat "$work/best.log"; fail "rejection sampling failed"; }
python3 - "$work" <<'PY' || fail "best of n"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/best.jsonl")]
assert len(rows) == 3, rows
for r in rows:
    assert set(r) >= {"prompt", "completion", "reward", "rewards"}, r
    assert len(r["rewards"]) == 4 and r["reward"] == max(r["rewards"]), r
print("ok: best of 4 for 3 prompts, rewards", [round(r["reward"], 3) for r in rows])
PY
[ $? -eq 0 ] || exit 1
# Options of rejection sampling without --policy are refused by name.
"$loom" score --ckpt "$work/rm/checkpoints" --input "$work/score.jsonl" --output "$work/x.jsonl" \
  --n 3 2>"$work/err" && fail "--n without --policy accepted"
grep -qF -- "--n needs --policy" "$work/err" || { cat "$work/err"; fail "--n: unclear error"; }
echo "ok: --n without --policy refused"
