// Talks to a running `toy serve` with the official openai SDK (a real client, not toy's code)
// and prints one JSON object of what it saw; exits non-zero on the first broken expectation.
//   node openai_check.mjs BASE_URL API_KEY PROMPT
// BASE_URL is http://127.0.0.1:PORT/v1; PROMPT the completion prompt whose greedy text the
// caller compares with `toy generate --temp 0`.
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, apiKey, prompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const out = {};

// Completions: greedy, 16 tokens, usage counted.
const c = await client.completions.create({ model: "anything", prompt, max_tokens: 16, temperature: 0 });
assert.equal(c.object, "text_completion");
assert.equal(c.choices.length, 1);
assert.equal(c.usage.completion_tokens + c.usage.prompt_tokens, c.usage.total_tokens);
out.completion = c.choices[0].text;
out.completion_finish = c.choices[0].finish_reason;
out.completion_usage = c.usage;

// Streamed completion: the same text in pieces, then usage.
let streamed = "", usage = null, finish = null;
const s = await client.completions.create({
  model: "anything", prompt, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of s) {
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    streamed += ch.text;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
assert.equal(streamed, out.completion, "streamed and whole completions agree");
assert.equal(finish, out.completion_finish);
assert.deepEqual(usage.completion_tokens, c.usage.completion_tokens);

// Chat, whole and streamed.
const messages = [{ role: "system", content: "You are terse." }, { role: "user", content: "Say hi." }];
const chat = await client.chat.completions.create({ model: "x", messages, max_tokens: 12, temperature: 0, seed: 3 });
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices[0].message.role, "assistant");
out.chat = chat.choices[0].message.content;
out.chat_usage = chat.usage;
let chatStreamed = "", sawRole = false;
const cs = await client.chat.completions.create({ model: "x", messages, max_tokens: 12, temperature: 0, seed: 3, stream: true });
for await (const chunk of cs) {
  const d = chunk.choices[0]?.delta ?? {};
  if (d.role === "assistant") sawRole = true;
  chatStreamed += d.content ?? "";
}
assert.ok(sawRole, "the first chunk names the role");
assert.equal(chatStreamed, out.chat, "streamed and whole chat replies agree");

// Log-probabilities, as the SDK asks for them: greedy picks the most likely token.
const lp = await client.chat.completions.create({ model: "x", messages, max_tokens: 4, temperature: 0, logprobs: true,
                                                  top_logprobs: 2 });
const entries = lp.choices[0].logprobs.content;
assert.equal(entries.length, lp.usage.completion_tokens);
for (const e of entries) {
  assert.ok(e.logprob <= 0);
  assert.equal(e.top_logprobs.length, 2);
  assert.equal(e.top_logprobs[0].logprob, e.logprob);
}
out.logprobs = entries.map((e) => e.logprob);

// Embeddings: the SDK asks for base64 by default and decodes it; float gives the same numbers.
const emb = await client.embeddings.create({ model: "x", input: ["The cat", "sat on"] });
assert.equal(emb.data.length, 2);
const embFloat = await client.embeddings.create({ model: "x", input: "The cat", encoding_format: "float" });
assert.deepEqual(Array.from(emb.data[0].embedding), embFloat.data[0].embedding.map(Math.fround));
out.embedding = Array.from(emb.data[0].embedding);
out.embedding_tokens = emb.usage.prompt_tokens;

// Structured output through the SDK's parse(): a JSON schema, sampled at temperature 1 from a
// model that knows nothing of it; the reply parses (the SDK does it) and validates.
const schema = {
  type: "object", additionalProperties: false, required: ["name", "age", "tags"],
  properties: { name: { type: "string", maxLength: 8 }, age: { type: "integer", minimum: 0, maximum: 120 },
                tags: { type: "array", items: { enum: ["a", "b"] }, maxItems: 3 } },
};
const parsed = await client.chat.completions.parse({
  model: "x", messages, max_tokens: 450, temperature: 1, seed: 5,  // (the schema bounds a reply below that)
  response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
});
assert.equal(parsed.choices[0].finish_reason, "stop");
const person = parsed.choices[0].message.parsed;
assert.deepEqual(Object.keys(person).sort(), ["age", "name", "tags"]);
assert.ok(typeof person.name === "string" && [...person.name].length <= 8, JSON.stringify(person));
assert.ok(Number.isInteger(person.age) && person.age >= 0 && person.age <= 120, JSON.stringify(person));
assert.ok(Array.isArray(person.tags) && person.tags.length <= 3 && person.tags.every((t) => t === "a" || t === "b"));
out.structured = person;
const anyObject = await client.chat.completions.create({ model: "x", messages, max_tokens: 450, temperature: 1, seed: 9,
                                                         response_format: { type: "json_object" } });
if (anyObject.choices[0].finish_reason === "stop") {
  const v = JSON.parse(anyObject.choices[0].message.content);
  assert.ok(v !== null && typeof v === "object" && !Array.isArray(v));
  out.json_object = true;
}

// Stop strings: the text ends before the first occurrence, finish_reason stop.
if (out.completion.length > 6) {
  const stop = out.completion.slice(3, 5);
  const st = await client.completions.create({ model: "a", prompt, max_tokens: 16, temperature: 0, stop: [stop] });
  assert.equal(st.choices[0].text, out.completion.slice(0, out.completion.indexOf(stop)));
  assert.equal(st.choices[0].finish_reason, "stop");
  out.stop_checked = true;
}

// Errors come back as the SDK's typed errors.
const wrong = new OpenAI({ baseURL, apiKey: apiKey + "-wrong", maxRetries: 0 });
await assert.rejects(wrong.completions.create({ model: "a", prompt, max_tokens: 2 }), (e) => e.status === 401 &&
  e instanceof OpenAI.AuthenticationError);
await assert.rejects(client.completions.create({ model: "a", prompt, max_tokens: 2, n: 2 }), (e) => e.status === 400 &&
  e instanceof OpenAI.BadRequestError && /n = 1/.test(e.message));
// A malformed body (not JSON) through the SDK's raw POST.
await assert.rejects(client.post("/completions", { body: "{\"prompt\": ", headers: { "Content-Type": "application/json" } }),
  (e) => e.status === 400);
const models = await client.models.list();
out.models = models.data.map((m) => m.id);
console.log(JSON.stringify(out));
