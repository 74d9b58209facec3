#!/usr/bin/env node
// llama.cpp oracle for toy's GGUF output, via node-llama-cpp 3.21.1's prebuilt
// linux-x64 CPU binary (never builds or downloads anything).
//
// Usage (run `npm ci` in this folder first):
//   node logprobs.mjs MODEL.gguf TOKENS_JSON
//       TOKENS_JSON is a JSON array of token ids, e.g. "[72,101,108]".
//       Prints {"n_vocab":V,"n_tokens":T,"logprobs":[[V floats] x T]}, where
//       logprobs[i][v] = log P(next token = v | tokens[0..i]): the raw softmax of
//       llama.cpp's logits at position i (no temperature / top-k / top-p / min-p).
//       A probability that underflowed to 0 in float32 is printed as null.
//   node logprobs.mjs MODEL.gguf --tokenize-all '["text", ...]'
//       The same for several texts at once (one model load): a JSON array of id arrays.
//   node logprobs.mjs MODEL.gguf --tokenize "text"
//       Prints the JSON array of token ids from llama.cpp's tokenizer (no BOS added,
//       special-token text is NOT parsed as special tokens).
//   node logprobs.mjs MODEL.gguf --generate "text" N
//       Tokenizes "text" as above (no BOS) and prints the JSON array of the N greedy
//       (argmax) continuation token ids. Does not stop at end-of-generation tokens.
//   node logprobs.mjs MODEL.gguf --generate-ids TOKENS_JSON N
//       Same, starting from explicit token ids.
//   node logprobs.mjs MODEL.gguf --embed TOKENS_JSON
//       llama.cpp's embedding of the tokens (node-llama-cpp's embedding context: pooled as
//       the file's {arch}.pooling_type says, the last token's hidden state without one; a BOS
//       or end token may be added, so it prints the tokens it evaluated):
//       {"tokens": [...], "embedding": [D floats]}.
//
// Environment: TOY_LLAMACPP_THREADS (default 1), TOY_LLAMACPP_LOG (llama.cpp log
// level, default "error"; logs go to stderr), TOY_LLAMACPP_KV_TYPE (KV cache type, F32
// (default) or F16, llama.cpp's own default), TOY_LLAMACPP_LORA (a LoRA adapter file applied
// to the context, as llama.cpp's --lora does) and TOY_LLAMACPP_LORA_SCALE (its scale,
// default 1). Context: flash attention off, context size
// max(32, tokens + 1) padded by node-llama-cpp to a multiple of 256 (llama.cpp warns, at
// log level "warn", when that exceeds the model's training context; harmless).
//
// How the raw softmax is obtained (node-llama-cpp 3.21.1, see
// dist/evaluator/LlamaContext/LlamaContext.d.ts and llama/addon/AddonSampler.cpp):
//   sequence.controlledEvaluate(input: ControlledEvaluateInputItem[], options?)
//     -> Promise<Array<undefined | {next: {token?, confidence?, probabilities?: Map<Token, number>}}>>
//   with every input item [token, {generateNext: {probabilities: true, options: {temperature: 0}}}].
//   temperature 0 makes the sampler chain a lone greedy sampler (topK/topP/minP samplers
//   are not added), so the candidate array is all n_vocab raw logits, and the addon
//   turns them into probabilities with a max-subtracted float32 softmax.
import process from "node:process";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

function usage(msg) {
    if (msg) process.stderr.write(`logprobs.mjs: ${msg}\n`);
    process.stderr.write(
        "usage: node logprobs.mjs MODEL.gguf TOKENS_JSON\n" +
        "       node logprobs.mjs MODEL.gguf --tokenize TEXT\n" +
        "       node logprobs.mjs MODEL.gguf --tokenize-all JSON_ARRAY_OF_TEXTS\n" +
        "       node logprobs.mjs MODEL.gguf --generate TEXT N\n" +
        "       node logprobs.mjs MODEL.gguf --generate-ids TOKENS_JSON N\n" +
        "       node logprobs.mjs MODEL.gguf --embed TOKENS_JSON\n");
    process.exit(2);
}

function fail(msg) {
    process.stderr.write(`logprobs.mjs: error: ${msg}\n`);
    process.exit(1);
}

function parseTokens(s) {
    let v;
    try {
        v = JSON.parse(s);
    } catch (e) {
        usage(`TOKENS_JSON is not valid JSON: ${e.message}`);
    }
    if (!Array.isArray(v) || v.length === 0 || !v.every((t) => Number.isInteger(t) && t >= 0))
        usage("TOKENS_JSON must be a non-empty JSON array of non-negative integers");
    return v;
}

function parseCount(s) {
    const n = Number(s);
    if (!Number.isInteger(n) || n < 0) usage(`N must be a non-negative integer, got ${JSON.stringify(s)}`);
    return n;
}

const args = process.argv.slice(2);
if (args.length < 2) usage();
const modelPath = args[0];
let mode, tokens = null, text = null, count = 0;
let texts = null;
if (args[1] === "--tokenize") {
    if (args.length !== 3) usage();
    mode = "tokenize"; text = args[2];
} else if (args[1] === "--tokenize-all") {
    if (args.length !== 3) usage();
    try {
        texts = JSON.parse(args[2]);
    } catch (e) {
        usage(`--tokenize-all needs a JSON array of strings: ${e.message}`);
    }
    if (!Array.isArray(texts) || !texts.every((t) => typeof t === "string")) usage("--tokenize-all needs a JSON array of strings");
    mode = "tokenize-all";
} else if (args[1] === "--embed") {
    if (args.length !== 3) usage();
    mode = "embed"; tokens = parseTokens(args[2]);
} else if (args[1] === "--generate" || args[1] === "--generate-ids") {
    if (args.length !== 4) usage();
    mode = "generate"; count = parseCount(args[3]);
    if (args[1] === "--generate") text = args[2];
    else tokens = parseTokens(args[2]);
} else {
    if (args.length !== 2) usage();
    mode = "logprobs"; tokens = parseTokens(args[1]);
}

const threads = Math.max(1, parseInt(process.env.TOY_LLAMACPP_THREADS ?? "1", 10) || 1);
const logLevel = process.env.TOY_LLAMACPP_LOG ?? "error";
const kvType = process.env.TOY_LLAMACPP_KV_TYPE ?? "F32";
if (kvType !== "F32" && kvType !== "F16") usage(`bad TOY_LLAMACPP_KV_TYPE ${kvType} (F32 or F16)`);
const loraPath = process.env.TOY_LLAMACPP_LORA ?? "";
const loraScale = Number(process.env.TOY_LLAMACPP_LORA_SCALE ?? "1");
if (!Number.isFinite(loraScale)) usage(`bad TOY_LLAMACPP_LORA_SCALE ${process.env.TOY_LLAMACPP_LORA_SCALE}`);
if (!Object.values(LlamaLogLevel).includes(logLevel)) usage(`bad TOY_LLAMACPP_LOG ${logLevel}`);

const llama = await getLlama({
    gpu: false,                // CPU backend only
    build: "never",            // never compile llama.cpp; throw NoBinaryFoundError instead
    skipDownload: true,        // never download llama.cpp sources
    usePrebuiltBinaries: true, // @node-llama-cpp/linux-x64
    progressLogs: false,
    maxThreads: threads,
    logLevel,
    logger: (level, message) => process.stderr.write(`[llama.cpp ${level}] ${message.endsWith("\n") ? message : message + "\n"}`),
});

const model = await llama.loadModel({modelPath, gpuLayers: 0, useMmap: false});
const vocabTokens = model.fileInfo.metadata?.tokenizer?.ggml?.tokens;
const nVocabFile = Array.isArray(vocabTokens) ? vocabTokens.length : null;
function checkIds(ids) {
    if (nVocabFile == null) return;
    const bad = ids.find((t) => t >= nVocabFile);
    if (bad != null) fail(`token id ${bad} is out of range (the vocabulary has ${nVocabFile} tokens)`);
}
if (tokens != null) checkIds(tokens);
const print = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

async function withSequence(nTokens, fn) {
    const context = await model.createContext({
        contextSize: Math.max(nTokens + 1, 32),
        batchSize: Math.max(nTokens + 1, 32),
        sequences: 1,
        threads,
        flashAttention: false,
        // llama.cpp's default KV cache is F16; keep K and V in F32 so toy's f32 attention is
        // compared like for like (TOY_LLAMACPP_KV_TYPE=F16 for llama.cpp's default).
        experimentalKvCacheKeyType: kvType,
        experimentalKvCacheValueType: kvType,
        ...(loraPath ? {lora: {adapters: [{filePath: loraPath, scale: loraScale}]}} : {}),
    });
    try {
        return await fn(context.getSequence());
    } finally {
        await context.dispose();
    }
}

try {
    if (mode === "tokenize") {
        print(Array.from(model.tokenize(text, false)));
    } else if (mode === "embed") {
        const context = await model.createEmbeddingContext({contextSize: Math.max(tokens.length + 8, 32), threads});
        try {
            const input = tokens.slice();
            context._prepareInput(input);  // the BOS / end token it adds, to report what it evaluated
            const embedding = await context.getEmbeddingFor(tokens.slice());
            print({tokens: input, embedding: Array.from(embedding.vector)});
        } finally {
            await context.dispose();
        }
    } else if (mode === "tokenize-all") {
        print(texts.map((t) => Array.from(model.tokenize(t, false))));
    } else if (mode === "generate") {
        const prompt = tokens ?? Array.from(model.tokenize(text, false));
        if (prompt.length === 0) throw new Error("empty prompt");
        const out = [];
        if (count > 0) {
            await withSequence(prompt.length + count, async (seq) => {
                const greedy = {generateNext: {token: true, options: {temperature: 0}}};
                let input = prompt.map((t, i) => (i === prompt.length - 1 ? [t, greedy] : t));
                while (out.length < count) {
                    const res = await seq.controlledEvaluate(input);
                    const next = res[input.length - 1]?.next?.token;
                    if (next == null) throw new Error(`no token generated at step ${out.length}`);
                    out.push(next);
                    input = [[next, greedy]];
                }
            });
        }
        print(out);
    } else {
        const rows = await withSequence(tokens.length, async (seq) => {
            const item = {generateNext: {probabilities: true, options: {temperature: 0}}};
            const res = await seq.controlledEvaluate(tokens.map((t) => [t, item]));
            return tokens.map((_, i) => {
                const probs = res[i]?.next?.probabilities;
                if (probs == null) throw new Error(`no probabilities at position ${i}`);
                return probs;
            });
        });
        const V = rows[0].size;
        if (nVocabFile != null && V !== nVocabFile) throw new Error(`${V} probabilities but ${nVocabFile} vocabulary tokens`);
        const logprobs = rows.map((probs, i) => {
            if (probs.size !== V) throw new Error(`position ${i}: ${probs.size} probabilities, expected ${V}`);
            const row = new Array(V).fill(null);
            for (const [tok, p] of probs) {
                if (tok < 0 || tok >= V) throw new Error(`position ${i}: token id ${tok} out of range`);
                row[tok] = p > 0 ? Math.log(p) : null;
            }
            return row;
        });
        print({n_vocab: V, n_tokens: tokens.length, logprobs});
    }
} finally {
    await model.dispose();
    await llama.dispose();
}
