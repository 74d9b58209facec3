// A tool-call round trip through a running `toy serve` with the official openai SDK: offer a
// tool, receive the parsed tool call (whole, streamed, through the SDK's stream helper, and
// forced by tool_choice), send the tool's result back, get the final answer. Prints one JSON object of what it saw; exits non-zero on a broken expectation.
//   node tools_check.mjs BASE_URL QUESTION TOOLS_JSON TOOL_RESULT
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, question, toolsJson, toolResult] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0, timeout: 120000 });
const tools = JSON.parse(toolsJson);
const messages = [{ role: "user", content: question }];
const out = {};

const first = await client.chat.completions.create({ model: "m", messages, tools, max_tokens: 64, temperature: 0 });
const choice = first.choices[0];
out.finish_reason = choice.finish_reason;
out.content = choice.message.content;
out.tool_calls = choice.message.tool_calls ?? [];
assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(choice));
const call = choice.message.tool_calls[0];
assert.equal(call.type, "function");
out.arguments = JSON.parse(call.function.arguments);  // a JSON string, as OpenAI sends it

// The same request streamed: the call arrives as tool_calls deltas, assembled by index.
const stream = await client.chat.completions.create({ model: "m", messages, tools, max_tokens: 64, temperature: 0,
                                                      stream: true });
const streamed = [];
let streamFinish = null;
for await (const chunk of stream) {
  const c = chunk.choices[0];
  if (!c) continue;
  for (const d of c.delta?.tool_calls ?? []) {
    streamed[d.index] ??= { id: "", name: "", arguments: "" };
    if (d.id) streamed[d.index].id = d.id;
    if (d.function?.name) streamed[d.index].name += d.function.name;
    if (d.function?.arguments) streamed[d.index].arguments += d.function.arguments;
  }
  if (c.finish_reason) streamFinish = c.finish_reason;
}
out.streamed = streamed;
out.stream_finish = streamFinish;

// The SDK's own stream helper: it assembles the calls from the deltas and reports each piece of
// the arguments as an event (more than one piece: the arguments are streamed as written).
let pieces = 0;
const helper = client.chat.completions.stream({ model: "m", messages, tools, max_tokens: 64, temperature: 0 });
helper.on("tool_calls.function.arguments.delta", () => ++pieces);
const assembled = await helper.finalChatCompletion();
out.helper_pieces = pieces;
out.helper_call = assembled.choices[0].message.tool_calls?.[0] ?? null;

// tool_choice naming the function: the reply is that call (constrained to the template's format).
const forced = await client.chat.completions.create({ model: "m", messages, tools, max_tokens: 64, temperature: 0,
  tool_choice: { type: "function", function: { name: tools[0].function.name } } });
out.forced_finish = forced.choices[0].finish_reason;
out.forced = forced.choices[0].message.tool_calls ?? [];

// The tool's answer goes back; the model answers in words.
messages.push(choice.message);
messages.push({ role: "tool", tool_call_id: call.id, content: toolResult });
const second = await client.chat.completions.create({ model: "m", messages, tools, max_tokens: 64, temperature: 0 });
out.final = second.choices[0].message.content;
out.final_finish = second.choices[0].finish_reason;
console.log(JSON.stringify(out));
