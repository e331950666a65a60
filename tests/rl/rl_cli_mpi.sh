#!/usr/bin/env bash
# `loom launch -n N -- rl --rollout-ranks K` end to end, from an SFT'd tiny chat model: 1 learner
# + 1 rollout rank with max staleness 0 and fp32 weight sync is the one-process synchronous run
# bit for bit, uninterrupted and stopped then resumed; 2 data-parallel learners + 1 rollout rank
# take the same steps to 1e-5, and with max staleness 1 their checkpoint carries the groups
# generated ahead, which a resume trains on; 1 learner + 2 rollout ranks (bf16 sync,
# max staleness 1) runs to the end; 2 tensor-parallel learners (--learner-tp 2) take the same
# steps to 1e-5 and resume bit for bit (a bf16 policy's too), and with --learner-sp take the same
# steps too; at ZeRO-1 and ZeRO-3 the 2 learners are the ZeRO-0 run bit for bit, resumed too;
# partial rollouts span weight versions; layouts the job cannot hold end with a clear error and a
# non-zero exit.
loom=$1
src=$2
source "$src/tests/rl/rl_cli_setup.sh"
launch=("$loom" launch --threads 1)

# run NAME N ARGS...: `loom rl` with the shared settings into $work/NAME, over `loom launch -n N`
# (N = 0: one process), its output appended to $work/NAME.log. A failed run prints its command,
# exit code and the log's tail, so that a failure names itself.
run() {
  local name=$1 n=$2 rc=0
  shift 2
  local cmd=("${launch[@]}" -n "$n" -- "${rl[@]}" --out "$work/$name" "$@")
  [ "$n" -gt 0 ] || cmd=("$loom" "${rl[@]}" --out "$work/$name" "$@")
  "${cmd[@]}" >>"$work/$name.log" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAILED (exit $rc): ${cmd[*]}"
    tail -n 40 "$work/$name.log"
    exit 1
  fi
}

# near A B WHAT: runs A and B have the same number of metrics rows, and each step's loss,
# gradient norm and reward agree to 1e-5 (relative).
near() {
  [ "$(wc -l < "$work/$2/metrics.jsonl")" -eq "$(wc -l < "$work/$1/metrics.jsonl")" ] ||
    { echo "$3: $2 has another number of metrics rows than $1"; exit 1; }
  for k in loss grad_norm reward_mean; do
    paste <(column "$work/$1/metrics.jsonl" $k) <(column "$work/$2/metrics.jsonl" $k) |
      awk -v k=$k -v what="$3" '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
                     if (d > 1e-5 * a + 1e-9) { print what ": step " NR - 1 " " k " " $2 " vs " $1; bad = 1 } }
                   END { exit bad }'
  done
}

run sync 0 --steps 4
trained=$(column "$work/sync/metrics.jsonl" train_tokens | awk '$1 > 0' | wc -l)
[ "$trained" -gt 0 ] || { echo "no step had a gradient: the comparisons below prove nothing"; exit 1; }
exact=(--max-staleness 0 --weight-sync f32)

run mpi2 2 --steps 4 --rollout-ranks 1 "${exact[@]}"
same_run "$work/sync" "$work/mpi2" 4
echo "ok: 1 learner + 1 rollout rank (max staleness 0, f32) = synchronous"

run mpi2r 2 --steps 2 --rollout-ranks 1 "${exact[@]}"
run mpi2r 2 --steps 4 --rollout-ranks 1 "${exact[@]}" --resume
same_run "$work/sync" "$work/mpi2r" 4
echo "ok: over MPI, --resume = uninterrupted"

# 2 data-parallel learners (ranks 0 and 2) + 1 rollout rank: the synchronous run's steps up to
# the order of the gradient sums.
run dp2 3 --steps 4 --rollout-ranks 1 "${exact[@]}"
near sync dp2 "2 learners"
echo "ok: 2 learners + 1 rollout rank = 1 learner (to 1e-5)"
# Both learners resume from learner 0's checkpoint: the same run, bit for bit.
run dp2r 3 --steps 2 --rollout-ranks 1 "${exact[@]}"
run dp2r 3 --steps 4 --rollout-ranks 1 "${exact[@]}" --resume
same_run "$work/dp2" "$work/dp2r" 4
echo "ok: 2 learners, --resume = uninterrupted"

# The same 2 learners at ZeRO-1 and ZeRO-3 (optimizer state, then parameters too, sharded over
# them; the whole weights gathered for the weight sync): the ZeRO-0 run bit for bit, its final
# checkpoint's optimizer state (all-gathered from the shards) included; stopped and resumed (each
# learner's shard cut from that whole state), the same.
optim_of() { echo "$(dirname "$(final "$1" "$2")")/optim.safetensors"; }
for z in 1 3; do
  run dpz$z 3 --steps 4 --rollout-ranks 1 "${exact[@]}" --set parallel.zero=$z
  same_run "$work/dp2" "$work/dpz$z" 4
  cmp "$(optim_of "$work/dp2" 4)" "$(optim_of "$work/dpz$z" 4)" ||
    { echo "ZeRO-$z: the gathered optimizer state differs from ZeRO-0's"; exit 1; }
  run dpz${z}r 3 --steps 2 --rollout-ranks 1 "${exact[@]}" --set parallel.zero=$z
  run dpz${z}r 3 --steps 4 --rollout-ranks 1 "${exact[@]}" --set parallel.zero=$z --resume
  same_run "$work/dp2" "$work/dpz${z}r" 4
  echo "ok: 2 learners at ZeRO-$z = ZeRO-0, uninterrupted and resumed"
done

# 2 tensor-parallel learners (one TP group: ranks 0 and 2) + 1 rollout rank: the synchronous
# run's steps up to the order of TP's split sums; stopped and resumed (the checkpoint holds the
# whole weights and optimizer state pieced together from the shards, cut again at the resume)
# it is the uninterrupted TP run bit for bit.
run tp2 3 --steps 4 --rollout-ranks 1 --learner-tp 2 "${exact[@]}"
near sync tp2 "TP 2"
echo "ok: 2 TP learners + 1 rollout rank = 1 learner (to 1e-5)"
run tp2r 3 --steps 2 --rollout-ranks 1 --learner-tp 2 "${exact[@]}"
run tp2r 3 --steps 4 --rollout-ranks 1 --learner-tp 2 "${exact[@]}" --resume
same_run "$work/tp2" "$work/tp2r" 4
echo "ok: 2 TP learners, --resume = uninterrupted"
# A bf16 policy in the TP learners (and the rollout rank): stopped after 2 steps and resumed (the
# checkpoint holds the master pieced together from the shards), the uninterrupted run bit for bit.
bf=(--rollout-ranks 1 --learner-tp 2 "${exact[@]}" --set precision.policy=bf16)
run tp2bf 3 --steps 4 "${bf[@]}"
run tp2bfr 3 --steps 2 "${bf[@]}"
run tp2bfr 3 --steps 4 "${bf[@]}" --resume
same_run "$work/tp2bf" "$work/tp2bfr" 4
echo "ok: 2 TP learners, bf16 policy, --resume = uninterrupted"
# The same TP group with sequence parallelism (--learner-sp; passes padded to an even count).
run tp2sp 3 --steps 4 --rollout-ranks 1 --learner-tp 2 --learner-sp "${exact[@]}"
near sync tp2sp "TP 2 + SP"
echo "ok: 2 TP learners with SP + 1 rollout rank = 1 learner (to 1e-5)"

# Max staleness 1: the checkpoint after step 2 carries the groups of step 2 that the rollout
# rank had generated ahead (by version 1 or 2, depending on timing); the resumed run trains its
# step 2 on exactly them, from the same weights: the same reward and loss bit for bit. (Later
# steps depend on timing here; MpiGrpo.ResumeTrainsOnTheCheckpointsBufferedGroups fixes the lag
# and compares every step and the final weights.)
run dp2s 3 --steps 4 --rollout-ranks 1 --max-staleness 1 --weight-sync f32 --save-every 2
held=$(column "$work/dp2s/checkpoints/step_00000002/state.json" rl_replay_buffer_groups)
[ "${held:-0}" -gt 0 ] || { echo "the MPI checkpoint holds no buffered groups ($held)"; exit 1; }
cp "$work/dp2s/metrics.jsonl" "$work/dp2s_full.jsonl"
rm -rf "$work/dp2s/checkpoints/step_00000004"
echo step_00000002 > "$work/dp2s/checkpoints/latest"
run dp2s 3 --steps 4 --rollout-ranks 1 --max-staleness 1 --weight-sync f32 --resume
grep -q "the replay buffer holds $held groups from the checkpoint" "$work/dp2s.log" ||
  { tail -n 40 "$work/dp2s.log"; exit 1; }
[ "$(wc -l < "$work/dp2s/metrics.jsonl")" -eq 4 ] || { echo "dp2s: not 4 metrics rows"; exit 1; }
for k in '"reward_mean": [^,}]*' '"loss": [^,}]*' '"staleness": \[[^]]*\]'; do
  a=$(sed -n 3p "$work/dp2s_full.jsonl" | grep -o "$k")
  b=$(sed -n 3p "$work/dp2s/metrics.jsonl" | grep -o "$k")
  [ -n "$a" ] && [ "$a" = "$b" ] || { echo "resumed step 2: $k $b, uninterrupted $a"; exit 1; }
done
echo "ok: max staleness 1 over MPI, --resume trains on the checkpoint's $held buffered groups"

run mpi3 3 --steps 3 --rollout-ranks 2
[ "$(wc -l < "$work/mpi3/metrics.jsonl")" -eq 3 ] || { echo "mpi3: not 3 metrics rows"; exit 1; }
[ -f "$(final "$work/mpi3" 3)" ] || { echo "mpi3: no final checkpoint"; exit 1; }
echo "ok: 1 learner + 2 rollout ranks"

# Partial rollouts over ranks: 12-token completions in slices of 6 span two weight versions.
run mpi_partial 2 --steps 4 --rollout-ranks 1 --max-staleness 1 --partial-tokens 6
spans=$(column "$work/mpi_partial/metrics.jsonl" spanning_rollouts | awk '{ n += $1 } END { print n + 0 }')
[ "$spans" -gt 0 ] || { echo "over MPI: no trained completion spans two weight versions"; exit 1; }
echo "ok: --partial-tokens over MPI ($spans completions trained across two versions)"
# Its checkpoint keeps the groups the rollout rank cut and had not finished; the resumed run
# hands them back and is the uninterrupted run bit for bit (fp32 sync; max staleness 1 with 2
# slices: every batch from the weights of its step).
partial=(--rollout-ranks 1 --max-staleness 1 --partial-tokens 6 --weight-sync f32)
run mpi_pf 2 --steps 4 "${partial[@]}"
run mpi_pr 2 --steps 2 "${partial[@]}"
cut=$(column "$work/mpi_pr/checkpoints/step_00000002/state.json" rl_partial_groups_count)
[ "${cut:-0}" -gt 0 ] || { echo "the MPI partial-rollout checkpoint holds no unfinished groups"; exit 1; }
run mpi_pr 2 --steps 4 "${partial[@]}" --resume
grep -q "partial rollouts: $cut unfinished groups from the checkpoint continue" "$work/mpi_pr.log" ||
  { tail -n 40 "$work/mpi_pr.log"; exit 1; }
same_run "$work/mpi_pf" "$work/mpi_pr" 4
echo "ok: --partial-tokens over MPI, --resume continues the $cut cut groups (= uninterrupted)"

expect_fail "--rollout-ranks 3 must lie in \[1, 2\] for 3 ranks" \
  "${launch[@]}" -n 3 -- "${rl[@]}" --out "$work/bad" --steps 2 --rollout-ranks 3
expect_fail "runs on 2 ranks only with --rollout-ranks" \
  "${launch[@]}" -n 2 -- "${rl[@]}" --out "$work/bad" --steps 2
expect_fail "--learner-tp 2 must divide the 1 learner rank" \
  "${launch[@]}" -n 3 -- "${rl[@]}" --out "$work/bad" --steps 2 --rollout-ranks 2 --learner-tp 2
expect_fail "--learner-tp needs --rollout-ranks" "$loom" "${rl[@]}" --out "$work/bad" --learner-tp 2
expect_fail "--learner-sp needs --learner-tp > 1" \
  "${launch[@]}" -n 2 -- "${rl[@]}" --out "$work/bad" --steps 2 --rollout-ranks 1 --learner-sp
# Expert parallelism splits a MoE policy's experts; this policy is dense.
expect_fail "--learner-ep 2 / --learner-etp 1 split the experts of a mixture-of-experts policy" \
  "${launch[@]}" -n 3 -- "${rl[@]}" --out "$work/bad" --steps 2 --rollout-ranks 1 --learner-ep 2
expect_fail "--learner-ep and --learner-etp need --rollout-ranks" \
  "$loom" "${rl[@]}" --out "$work/bad" --learner-ep 2
expect_fail "parallel.zero = 1 \\(--set\\) with --learner-tp 2, --learner-ep 1, --learner-etp 1" \
  "${launch[@]}" -n 3 -- "${rl[@]}" --out "$work/bad" --steps 2 --rollout-ranks 1 --learner-tp 2 \
  --set parallel.zero=1
[ ! -e "$work/bad/metrics.jsonl" ] || { echo "a refused layout wrote metrics"; exit 1; }
echo "PASS"
