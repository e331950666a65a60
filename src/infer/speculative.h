// Speculative decoding: a cheap proposer guesses the next few tokens of a decoding sequence, the
// target model scores them all in one pass (a chunk of 1 + k tokens through the paged KV cache,
// logits of every row), and each guess is kept or replaced by rejection sampling, so the output
// follows the target's distribution exactly. Proposers:
//   ngram  prompt lookup: the tokens that followed the latest earlier occurrence of the
//          sequence's last n tokens (n from prompt_lookup_max down to prompt_lookup_min).
//   draft  a smaller model with the same vocabulary (draft_model.h), its greedy choices.
// A proposal of single tokens is a draft distribution q that is one-hot: a guess d is kept with
// probability min(1, p(d) / q(d)) = p(d), and on rejection the token comes from p without d,
// renormalised (the residual max(0, p - q)). Drawing t from p with the request's own random
// stream and keeping d exactly when t == d is that rule, and makes the tokens the same as
// plain decoding's for any seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::infer {

enum class SpeculativeMethod { None, Ngram, Draft };

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::None;
  int num_speculative_tokens = 4;  // k: guesses per sequence per step
  int prompt_lookup_max = 4, prompt_lookup_min = 1;
};

// "ngram" -> Ngram, "draft" -> Draft, "none" / "" -> None; anything else throws naming the
// valid values.
SpeculativeMethod speculative_method_from_name(const std::string& name);
const char* speculative_method_name(SpeculativeMethod m);
// Throws loom::Error naming the field for an impossible configuration.
void validate(const SpeculativeConfig& c);

// Prompt lookup over `tokens` (prompt and output so far): up to k tokens that followed the
// latest earlier occurrence of the last n tokens, for the largest n in [min_n, max_n] that
// occurs; empty when none does.
std::vector<int32_t> ngram_propose(const std::vector<int32_t>& tokens, int min_n, int max_n, int k);

// Rejection sampling of one guess `d` drawn from the draft distribution q against the target's
// p (both over the same vocabulary, each summing to 1): keeps d with probability
// min(1, p[d] / q[d]) (u_accept uniform in [0, 1)), else returns a token drawn from the residual
// max(0, p - q) normalised (u_residual uniform in [0, 1)). `accepted` says which happened.
int32_t speculative_verify(const std::vector<double>& p, const std::vector<double>& q, int32_t d,
                           double u_accept, double u_residual, bool& accepted);

}  // namespace loom::infer
