// The official `openai` npm client against `loom serve` (completions, chat, streaming, errors).
// Usage: node openai_client.mjs BASE_URL
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", timeout: 60000, maxRetries: 0 });

const models = await client.models.list();
assert.equal(models.data[0].id, "loom");

const c = await client.completions.create({ model: "loom", prompt: "reverse abc", max_tokens: 8, temperature: 0 });
assert.equal(c.object, "text_completion");
assert.equal(typeof c.choices[0].text, "string");
assert.ok(["stop", "length"].includes(c.choices[0].finish_reason));
assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);

const chat = await client.chat.completions.create({
  model: "loom", messages: [{ role: "user", content: "reverse abc" }], max_tokens: 8, temperature: 0,
  logprobs: true, top_logprobs: 2,
});
assert.equal(chat.choices[0].message.role, "assistant");
assert.ok(Array.isArray(chat.choices[0].logprobs.content));

// Streaming: the deltas add up to the non-streamed answer (greedy), then the usage chunk.
const stream = await client.chat.completions.create({
  model: "loom", messages: [{ role: "user", content: "reverse abc" }], max_tokens: 8, temperature: 0,
  stream: true, stream_options: { include_usage: true },
});
let text = "", usage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    text += ch.delta.content ?? "";
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
assert.equal(text, chat.choices[0].message.content);
assert.ok(finish);
assert.ok(usage && usage.completion_tokens > 0);

// Errors arrive as the client's typed errors with the right status.
await assert.rejects(client.completions.create({ model: "gpt-9", prompt: "x" }),
                     (e) => e.status === 404);
await assert.rejects(client.completions.create({ model: "loom", prompt: "x", temperature: 9 }),
                     (e) => e.status === 400 && /temperature/.test(e.message));
// Embeddings: floats as asked, the client's default (base64, which it decodes), and base64 as
// asked (little-endian float32): the same vectors, of unit norm.
const inputs = ["reverse abc", "abc"];
const ef = await client.embeddings.create({ model: "loom", input: inputs, encoding_format: "float" });
assert.equal(ef.object, "list");
assert.equal(ef.data.length, 2);
assert.equal(ef.data[1].index, 1);
const dim = ef.data[0].embedding.length;
assert.ok(dim > 0);
for (const d of ef.data) {
  const norm = Math.sqrt(d.embedding.reduce((s, x) => s + x * x, 0));
  assert.ok(Math.abs(norm - 1) < 1e-5, `norm ${norm}`);
}
assert.ok(ef.usage.prompt_tokens > 0);
assert.equal(ef.usage.total_tokens, ef.usage.prompt_tokens);
// JSON carries each float32 in its shortest form: read back as float32, the same values.
const f32 = (v) => v.map((x) => Math.fround(x));
const edefault = await client.embeddings.create({ model: "loom", input: inputs });
assert.deepEqual(edefault.data.map((d) => f32(d.embedding)), ef.data.map((d) => f32(d.embedding)));
const eb = await client.embeddings.create({ model: "loom", input: inputs, encoding_format: "base64" });
assert.equal(typeof eb.data[0].embedding, "string");
const buf = Buffer.from(eb.data[0].embedding, "base64");
assert.equal(buf.length, 4 * dim);
const decoded = Array.from({ length: dim }, (_, i) => buf.readFloatLE(4 * i));
assert.deepEqual(decoded, f32(ef.data[0].embedding));
const eids = await client.embeddings.create({ model: "loom", input: [[1, 2, 3]], encoding_format: "float" });
assert.equal(eids.usage.prompt_tokens, 3);
assert.equal(eids.data[0].embedding.length, dim);
await assert.rejects(client.embeddings.create({ model: "loom", input: "" }),
                     (e) => e.status === 400 && e.param === "input");
await assert.rejects(client.embeddings.create({ model: "loom", input: "abc", dimensions: dim + 1 }),
                     (e) => e.status === 400 && e.param === "dimensions");
await assert.rejects(client.embeddings.create({ model: "gpt-9", input: "abc" }), (e) => e.status === 404);

// --served-model-name loom alias: both names are served, responses report the first.
const viaAlias = await client.completions.create({ model: "alias", prompt: "reverse abc", max_tokens: 2 });
assert.equal(viaAlias.model, "loom");
assert.deepEqual((await client.models.list()).data.map((m) => m.id), ["loom", "alias"]);
console.log("openai client: models, completions, chat, streaming, embeddings and errors ok");
