// transformers.js's (@lenml/tokenizers) encode throughput on the same documents as
// bench_hf_tokenizer, one line per model: MODEL MB_PER_S TOKENS (best of REPS passes).
// Usage: node hf_tokenizer_bench.mjs DOCS.json REPS MODEL...   (run in the folder holding
// node_modules)
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const [docsPath, repsArg, ...models] = process.argv.slice(2);
const require = createRequire(process.cwd() + "/");
const docs = JSON.parse(readFileSync(docsPath, "utf8"));
const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, "utf8"), 0);
for (const model of models) {
  const tok = require(`@lenml/tokenizer-${model}`).fromPreTrained();
  let best = Infinity, tokens = 0;
  for (let r = 0; r < Number(repsArg); ++r) {
    tokens = 0;
    const t0 = process.hrtime.bigint();
    for (const d of docs) tokens += tok.encode(d, { add_special_tokens: false }).length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(`${model} ${(bytes / 1e6 / best).toFixed(2)} ${tokens}`);
}
