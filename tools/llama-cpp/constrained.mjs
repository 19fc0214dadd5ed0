#!/usr/bin/env node
// llama.cpp's constrained decode, the peer of `kestrel bench constrained`: the same chat prompt
// (the schema suite's `ask` under "Answer in JSON.", rendered with the GGUF's own template) runs
// greedy under the schema through node-llama-cpp's `createGrammarForJsonSchema` (a GBNF grammar
// that llama.cpp's sampler applies) until an end-of-generation token, and without a grammar for
// as many tokens; alternating, --repeats rounds.
//
//   node tools/llama-cpp/constrained.mjs --model M.gguf [--schema nested_address] [--threads 2]
//        [--repeats 3] [--max-tokens 256] [--json OUT.json]
//
// node-llama-cpp's grammar lets whitespace follow the JSON, so a small model may go on to
// --max-tokens after a complete answer: the answer is then the JSON and that whitespace.
// Decode tok/s counts the tokens after the first over the time from the first to the last
// (as Kestrel's timings do). The schema comes from tests/data/constrained/schemas.json.
import fs from "node:fs";
import path from "node:path";
import { HERE, loadLlama, median, parseArgs, renderChat, versionInfo, writeReport } from "./common.mjs";

const { opts } = parseArgs(process.argv.slice(2), { model: "", schema: "nested_address", threads: 2, repeats: 3, "max-tokens": 256, json: "", "log-level": "warn" });
if (!opts.model) {
    console.error("usage: node constrained.mjs --model M.gguf [--schema ID] [--threads N] [--repeats N] [--max-tokens N] [--json OUT.json]");
    process.exit(2);
}
const suitePath = path.join(HERE, "../../tests/data/constrained/schemas.json");
const entry = JSON.parse(fs.readFileSync(suitePath, "utf8")).schemas.find((c) => c.id === opts.schema);
if (!entry) throw new Error(`no schema ${opts.schema} in ${suitePath}`);

const { LlamaGrammarEvaluationState } = await import("node-llama-cpp");
const llama = await loadLlama({ logLevel: opts["log-level"] });
const model = await llama.loadModel({ modelPath: opts.model, gpuLayers: 0 });
const context = await model.createContext({ contextSize: 2048, batchSize: 512, threads: opts.threads, sequences: 1, flashAttention: false });
const seq = context.getSequence();
const text = renderChat(model, [{ role: "system", content: "Answer in JSON." }, { role: "user", content: entry.ask }]);
const prompt = Array.from(model.tokenize(text, true));
const grammar = await llama.createGrammarForJsonSchema(entry.schema);

/** One greedy run: `maxTokens` tokens at most, stopping at an end-of-generation token unless
 * `ignoreEog`; returns its tokens and decode rate. */
async function run({ withGrammar, maxTokens, ignoreEog }) {
    await seq.clearHistory();
    const grammarEvaluationState = withGrammar ? new LlamaGrammarEvaluationState({ model, grammar }) : undefined;
    const gen = seq.evaluate(prompt, { temperature: 0, yieldEogToken: true, grammarEvaluationState });
    const tokens = [];
    let first = 0;
    for (;;) {
        const r = await gen.next();
        if (r.done) break;
        const token = r.value.token ?? r.value;
        if (tokens.length === 0) first = performance.now();
        if (model.isEogToken(token) && !ignoreEog) break;
        tokens.push(token);
        if (tokens.length >= maxTokens) break;
    }
    const ms = performance.now() - first;
    await gen.return();
    return { tokens, tokPerS: ((tokens.length - 1) / ms) * 1000 };
}

const first = await run({ withGrammar: true, maxTokens: opts["max-tokens"], ignoreEog: false });
const answer = model.detokenize(first.tokens, false);
JSON.parse(answer); // the grammar's output must be JSON
await run({ withGrammar: false, maxTokens: first.tokens.length, ignoreEog: true });
const held = [], free = [];
for (let i = 0; i < opts.repeats; i++) {
    held.push((await run({ withGrammar: true, maxTokens: opts["max-tokens"], ignoreEog: false })).tokPerS);
    free.push((await run({ withGrammar: false, maxTokens: first.tokens.length, ignoreEog: true })).tokPerS);
}
const report = {
    engine: "llama.cpp",
    version: versionInfo(llama),
    schema: opts.schema,
    threads: opts.threads,
    tokens: first.tokens.length,
    answer,
    constrained_tok_s: { median: median(held), all: held },
    free_tok_s: { median: median(free), all: free },
    ratio: median(held) / median(free),
};
if (opts.json) writeReport(report, opts.json);
console.log(`llama.cpp, ${opts.threads} threads, schema ${opts.schema}: ${report.tokens} tokens; constrained ${report.constrained_tok_s.median.toFixed(1)} tok/s, free ${report.free_tok_s.median.toFixed(1)} tok/s (${report.ratio.toFixed(2)}x)`);
await context.dispose();
await model.dispose();
