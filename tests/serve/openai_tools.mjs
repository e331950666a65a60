// The official `openai` npm client drives structured outputs and a tool-call round trip against
// `loom serve`: a forced call (named, then required and streamed), its result sent back as a
// tool message, a json_schema response format, and a tool schema Loom refuses (400).
// Usage: node openai_tools.mjs BASE_URL
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", timeout: 120000, maxRetries: 0 });

const tools = [
  { type: "function", function: { name: "get_weather", description: "The weather of a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 },
      unit: { enum: ["celsius", "fahrenheit"] } }, required: ["city", "unit"], additionalProperties: false } } },
  { type: "function", function: { name: "get_time", parameters: { type: "object",
    properties: { zone: { type: "string", enum: ["UTC", "CET"] } }, required: ["zone"] } } },
];
const checkWeather = (args) => {
  assert.equal(typeof args.city, "string");
  assert.ok([...args.city].length <= 8);
  assert.ok(["celsius", "fahrenheit"].includes(args.unit));
  assert.deepEqual(Object.keys(args).sort(), ["city", "unit"]);
};
const messages = [{ role: "user", content: "reverse abc" }];

// A named call, not streamed.
const r1 = await client.chat.completions.create({
  model: "loom", messages, tools, tool_choice: { type: "function", function: { name: "get_weather" } },
  max_tokens: 200, temperature: 1, seed: 1,
});
const m1 = r1.choices[0].message;
assert.equal(r1.choices[0].finish_reason, "tool_calls");
assert.equal(m1.tool_calls.length, 1);
const call = m1.tool_calls[0];
assert.equal(call.type, "function");
assert.equal(call.function.name, "get_weather");
assert.ok(call.id.startsWith("call_"));
checkWeather(JSON.parse(call.function.arguments));

// The round trip: the assistant's call and the tool's result go back in the history.
const r2 = await client.chat.completions.create({
  model: "loom", tools, tool_choice: "auto", max_tokens: 8, temperature: 0,
  messages: [...messages, m1, { role: "tool", tool_call_id: call.id, content: JSON.stringify({ temp: 3 }) }],
});
assert.ok(["stop", "length", "tool_calls"].includes(r2.choices[0].finish_reason));
assert.ok(r2.choices[0].message.content !== undefined);

// A required call, streamed: the deltas carry the call.
const stream = await client.chat.completions.create({
  model: "loom", messages, tools, tool_choice: "required", parallel_tool_calls: false,
  max_tokens: 200, temperature: 1.2, seed: 7, stream: true,
});
const calls = [];
let finish = null, content = "";
for await (const chunk of stream) {
  for (const ch of chunk.choices) {
    content += ch.delta.content ?? "";
    for (const tc of ch.delta.tool_calls ?? []) {
      calls[tc.index] ??= { id: "", name: "", arguments: "" };
      if (tc.id) calls[tc.index].id = tc.id;
      calls[tc.index].name += tc.function?.name ?? "";
      calls[tc.index].arguments += tc.function?.arguments ?? "";
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
assert.equal(finish, "tool_calls");
assert.equal(content, "");
assert.equal(calls.length, 1);
const args = JSON.parse(calls[0].arguments);
if (calls[0].name === "get_weather") checkWeather(args);
else assert.ok(calls[0].name === "get_time" && ["UTC", "CET"].includes(args.zone));

// response_format json_schema through the client.
const r3 = await client.chat.completions.create({
  model: "loom", messages, max_tokens: 200, temperature: 1, seed: 3,
  response_format: { type: "json_schema", json_schema: { name: "answer", strict: true, schema: {
    type: "object", properties: { word: { type: "string", maxLength: 6 }, n: { type: "integer", minimum: 0, maximum: 9 } },
    required: ["word", "n"], additionalProperties: false } } },
});
assert.equal(r3.choices[0].finish_reason, "stop");
const doc = JSON.parse(r3.choices[0].message.content);
assert.ok(typeof doc.word === "string" && Number.isInteger(doc.n) && doc.n >= 0 && doc.n <= 9);

// A tool whose parameters are not a schema Loom can hold: 400 naming the keyword.
await assert.rejects(client.chat.completions.create({
  model: "loom", messages, tool_choice: "required",
  tools: [{ type: "function", function: { name: "f", parameters: { type: "array", uniqueItems: true } } }],
}), (e) => e.status === 400 && /uniqueItems/.test(e.message));
console.log("openai client: named and required tool calls, streamed deltas, tool round trip, json_schema ok");
