// transformers.js's (@lenml/tokenizers) encode throughput on the same documents as
// bench_hf_tokenizer, one line per model: MODEL MB_PER_S TOKENS (best of REPS passes).
// Usage: node hf_tokenizer_bench.mjs DOCS.json REPS MODEL...   (run in the folder holding
// node_modules; a MODEL is a package's name or file:PATH, a tokenizer.json printed as its name)
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const [docsPath, repsArg, ...models] = process.argv.slice(2);
const require = createRequire(process.cwd() + "/");
const docs = JSON.parse(readFileSync(docsPath, "utf8"));
const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, "utf8"), 0);
for (const model of models) {
  const tok = model.startsWith("file:")
    ? require("@lenml/tokenizers").TokenizerLoader.fromPreTrained({
        tokenizerJSON: JSON.parse(readFileSync(model.slice(5), "utf8")),
        tokenizerConfig: { tokenizer_class: "PreTrainedTokenizer" },
      })
    : require(`@lenml/tokenizer-${model}`).fromPreTrained();
  const label = model.startsWith("file:") ? model.slice(model.lastIndexOf("/") + 1) : model;
  let best = Infinity, tokens = 0;
  for (let r = 0; r < Number(repsArg); ++r) {
    tokens = 0;
    const t0 = process.hrtime.bigint();
    for (const d of docs) tokens += tok.encode(d, { add_special_tokens: false }).length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(`${label} ${(bytes / 1e6 / best).toFixed(2)} ${tokens}`);
}
