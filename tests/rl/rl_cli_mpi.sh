#!/usr/bin/env bash
# `loom launch -n N -- rl --rollout-ranks K` end to end, from an SFT'd tiny chat model: 1 learner
# + 1 rollout rank with max staleness 0 and fp32 weight sync is the one-process synchronous run
# bit for bit, uninterrupted and stopped then resumed; 1 learner + 2 rollout ranks (bf16 sync,
# max staleness 1) runs to the end; layouts the job cannot hold end with a clear error and a
# non-zero exit.
loom=$1
src=$2
source "$src/tests/rl/rl_cli_setup.sh"
launch=("$loom" launch --threads 1)

"$loom" "${rl[@]}" --out "$work/sync" --steps 4 >/dev/null 2>&1
trained=$(column "$work/sync/metrics.jsonl" train_tokens | awk '$1 > 0' | wc -l)
[ "$trained" -gt 0 ] || { echo "no step had a gradient: the comparisons below prove nothing"; exit 1; }

"${launch[@]}" -n 2 -- "${rl[@]}" --out "$work/mpi2" --steps 4 --rollout-ranks 1 \
  --max-staleness 0 --weight-sync f32 >/dev/null 2>&1
same_run "$work/sync" "$work/mpi2" 4
echo "ok: 1 learner + 1 rollout rank (max staleness 0, f32) = synchronous"

"${launch[@]}" -n 2 -- "${rl[@]}" --out "$work/mpi2r" --steps 2 --rollout-ranks 1 \
  --max-staleness 0 --weight-sync f32 >/dev/null 2>&1
"${launch[@]}" -n 2 -- "${rl[@]}" --out "$work/mpi2r" --steps 4 --rollout-ranks 1 \
  --max-staleness 0 --weight-sync f32 --resume >/dev/null 2>&1
same_run "$work/sync" "$work/mpi2r" 4
echo "ok: over MPI, --resume = uninterrupted"

"${launch[@]}" -n 3 -- "${rl[@]}" --out "$work/mpi3" --steps 3 --rollout-ranks 2 >/dev/null 2>&1
[ "$(wc -l < "$work/mpi3/metrics.jsonl")" -eq 3 ] || { echo "mpi3: not 3 metrics rows"; exit 1; }
[ -f "$(final "$work/mpi3" 3)" ] || { echo "mpi3: no final checkpoint"; exit 1; }
echo "ok: 1 learner + 2 rollout ranks"

expect_fail "--rollout-ranks 3 must lie in \[1, 2\] for 3 ranks" \
  "${launch[@]}" -n 3 -- "${rl[@]}" --out "$work/bad" --steps 2 --rollout-ranks 3
expect_fail "runs on 2 ranks only with --rollout-ranks" \
  "${launch[@]}" -n 2 -- "${rl[@]}" --out "$work/bad" --steps 2
[ ! -e "$work/bad/metrics.jsonl" ] || { echo "a refused layout wrote metrics"; exit 1; }
echo "PASS"
