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
console.log("openai client: models, completions, chat, streaming and errors ok");
