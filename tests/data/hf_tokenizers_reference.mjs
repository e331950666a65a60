// Writes what Hugging Face's tokenizers library itself (npm's `tokenizers`, its Node binding of
// the Rust crate) gives for every text of a corpus with each tokenizer.json file, in the lines
// hf_tokenizer_parity reads: the ids without and with the post-processor's special tokens, and
// the decoding of the latter (special tokens kept).
// Usage: node hf_tokenizers_reference.mjs CORPUS.json OUT.jsonl TOKENIZER.json...   (run in the
// folder holding node_modules)
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const [corpusPath, outPath, ...files] = process.argv.slice(2);
const require = createRequire(process.cwd() + "/");
const { Tokenizer } = require("tokenizers");
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const lines = [];
for (const file of files) {
  const tok = Tokenizer.fromFile(file);
  for (const [i, text] of corpus.entries()) {
    const plain = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
    const special = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
    const decoded = await tok.decode(special, false);
    lines.push(JSON.stringify({ model: `file:${file}`, i, plain, special, decoded }));
  }
}
writeFileSync(outPath, lines.join("\n") + "\n");
