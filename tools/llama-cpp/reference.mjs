#!/usr/bin/env node
// Record llama.cpp's greedy outputs for a GGUF, in the format of tests/data/reference/greedy.json.
//
//   node tools/llama-cpp/reference.mjs MODEL.gguf PROMPTS.json OUT.json
//        [--threads 2] [--steps 32] [--ctx 2048] [--batch 512] [--flash-attention auto|on|off]
//        [--compare REFERENCE.json]
//
// llama.cpp is node-llama-cpp's prebuilt CPU build (see common.mjs / README.md). Per prompt:
//  - `chat` prompts are rendered with the GGUF's own tokenizer.chat_template through
//    @huggingface/jinja (the Jinja engine node-llama-cpp itself uses for GGUF templates), with
//    messages, add_generation_prompt = true, bos_token / eos_token from the vocabulary; `raw`
//    prompts are used as-is.
//  - tokenized by llama.cpp (common_tokenize, parse_special = true, add_special = false), with
//    the BOS token first where the vocabulary adds one (llama.cpp's add_special = true, as
//    llama-cli and llama-server tokenize a prompt; bos_added says which).
//  - evaluated with llama_decode, then STEPS greedy tokens: each step takes llama.cpp's greedy
//    sampler's token (argmax of the raw logits) and records the top-5 raw logits; it does not
//    stop at end-of-generation tokens (first_eog_index says where the first one came).
//  - top-5 logits and log-probabilities (logit - log-sum-exp of all logits, in float64) at the
//    last prompt position, and per step the margin between the two highest
//    logits.
// `bench_prompt` in PROMPTS.json (text_repeat_of, n_tokens) becomes the benchmark prompt: the
// source text repeated (joined by a space), tokenized, truncated to n_tokens ids, detokenized; the
// text is checked to retokenize to exactly those ids.
// --compare prints, per prompt, whether prompt ids / greedy ids match another greedy.json and
// the largest top-5 logit difference.
import fs from "node:fs";
import path from "node:path";
import { loadLlama, parseArgs, renderChat, versionInfo } from "./common.mjs";

const USAGE = "usage: node reference.mjs MODEL.gguf PROMPTS.json OUT.json [--threads N] [--steps N] " +
    "[--ctx N] [--batch N] [--flash-attention auto|on|off] [--compare REF.json]";

const { opts, pos } = parseArgs(process.argv.slice(2), {
    threads: 2, steps: 32, ctx: 2048, batch: 512, "flash-attention": "off", compare: "", "log-level": "warn",
});
if (pos.length !== 3) {
    console.error(USAGE);
    process.exit(2);
}
const [modelPath, promptsPath, outPath] = pos;
const promptsDoc = JSON.parse(fs.readFileSync(promptsPath, "utf8"));

const llama = await loadLlama({ logLevel: opts["log-level"] });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const meta = model.fileInfo.metadata;
const fa = { auto: "auto", on: true, off: false }[opts["flash-attention"]];
if (fa === undefined) throw new Error("--flash-attention must be auto, on or off");
const context = await model.createContext({
    contextSize: opts.ctx, batchSize: opts.batch, threads: opts.threads, sequences: 1, flashAttention: fa,
});
const seq = context.getSequence();

const nVocab = model.tokens.vocabSize ?? meta.tokenizer.ggml.tokens.length;
const eogIds = [];
for (let t = 0; t < nVocab; t++) if (model.isEogToken(t)) eogIds.push(t);
const bosId = meta.tokenizer.ggml.bos_token_id;
const eosId = meta.tokenizer.ggml.eos_token_id;
const addBosMeta = meta.tokenizer.ggml.add_bos_token;
const addBos = model.tokens.shouldPrependBosToken;
if (model.tokens.shouldAppendEosToken) {
    throw new Error("this model adds an EOS token; the reference format assumes it adds none");
}

const tokenize = (text) => Array.from(model.tokenize(text, true));
const piece = (id) => model.detokenize([id], true);
const detok = (ids) => model.detokenize(ids, true);

const nextOpts = {
    generateNext: {
        token: true, // llama.cpp's greedy sampler (temperature 0, nothing else in the chain)
        logits: { filter: { tokens: [], includeTop: 5 } },
        totalLogitWeight: true,
    },
};

const fullOpts = { generateNext: { token: true, logits: true } };

async function step(tokens, full = false) {
    // evaluate `tokens` after what the sequence already holds; the last one gets the logits.
    // full: all logits (sorted, highest first), to take the log-sum-exp in float64; otherwise
    // the top 5 and llama.cpp-side sum of exp(logit - max) in float32.
    const input = tokens.map((t, i) => (i === tokens.length - 1 ? [t, full ? fullOpts : nextOpts] : t));
    const out = await seq.controlledEvaluate(input);
    const next = out[tokens.length - 1].next;
    const entries = [...next.logits.entries()];
    const top = entries.slice(0, 5);
    let lse;
    if (full) {
        if (entries.length !== nVocab) throw new Error(`got ${entries.length} logits, vocab is ${nVocab}`);
        const max = top[0][1];
        let s = 0;
        for (const [, l] of entries) s += Math.exp(l - max);
        lse = max + Math.log(s);
    } else {
        lse = top[0][1] + Math.log(next.totalLogitWeight);
    }
    if (next.token !== top[0][0] && top[0][1] !== top[1][1]) {
        throw new Error(`greedy token ${next.token} is not the top logit ${top[0][0]}`);
    }
    return { token: next.token, top, lse };
}

async function runPrompt(ids) {
    await seq.clearHistory();
    const r0 = await step(ids, true);
    const greedy = [r0.token];
    const margins = [r0.top[0][1] - r0.top[1][1]];
    for (let i = 1; i < opts.steps; i++) {
        const r = await step([greedy[i - 1]]);
        greedy.push(r.token);
        margins.push(r.top[0][1] - r.top[1][1]);
    }
    return { r0, greedy, margins };
}

const round5 = (x) => Math.round(x * 1e5) / 1e5;
const results = [];
for (const p of promptsDoc.prompts) {
    const text = p.kind === "chat" ? renderChat(model, p.messages) : p.text;
    if (p.kind !== "chat" && p.kind !== "raw") throw new Error(`prompt ${p.id}: unknown kind ${p.kind}`);
    const ids = (addBos ? [bosId] : []).concat(tokenize(text));
    const t0 = performance.now();
    const { r0, greedy, margins } = await runPrompt(ids);
    const eog = greedy.findIndex((t) => eogIds.includes(t));
    results.push({
        id: p.id,
        kind: p.kind,
        prompt_text: text,
        prompt_ids: ids,
        n_prompt: ids.length,
        bos_added: addBos,
        add_special_false_identical: !addBos,
        greedy_ids: greedy,
        greedy_pieces: greedy.map(piece),
        greedy_text: detok(greedy),
        first_eog_index: eog < 0 ? null : eog,
        greedy_text_until_eog: detok(eog < 0 ? greedy : greedy.slice(0, eog)),
        top5_last_prompt_pos: r0.top.map(([t, l]) => [t, l]),
        top5_logprobs_last_prompt_pos: r0.top.map(([t, l]) => [t, l - r0.lse]),
        step_top1_top2_logit_margin: margins.map(round5),
    });
    console.error(`${p.id}: ${ids.length} prompt tokens, ${JSON.stringify(detok(greedy).slice(0, 60))}..., ` +
        `eog at ${eog < 0 ? "-" : eog} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
}

let benchPrompt;
if (promptsDoc.bench_prompt) {
    const b = promptsDoc.bench_prompt;
    const src = promptsDoc.prompts.find((p) => p.id === b.text_repeat_of);
    if (!src) throw new Error(`bench_prompt.text_repeat_of: no prompt ${b.text_repeat_of}`);
    let long = src.text;
    while (tokenize(long).length < b.n_tokens + 8) long += " " + src.text;
    const ids = tokenize(long).slice(0, b.n_tokens);
    const text = detok(ids);
    const again = tokenize(text);
    const same = again.length === ids.length && again.every((t, i) => t === ids[i]);
    if (!same) throw new Error("bench prompt text does not retokenize to its ids");
    benchPrompt = {
        text, ids, n: ids.length,
        note: "text retokenizes to exactly these ids with llama.cpp (parse_special, no BOS)",
    };
}

const doc = {
    model: path.basename(modelPath),
    engine: "llama.cpp CPU via node-llama-cpp (prebuilt binaries)",
    version: versionInfo(llama),
    settings: {
        n_ctx: context.contextSize,
        n_batch: opts.batch,
        n_threads: opts.threads,
        flash_attention: opts["flash-attention"],
        kv_cache: "f16",
        sampling: `argmax over raw logits (llama.cpp greedy sampler), ${opts.steps} steps, NOT stopped at ` +
            "end-of-generation tokens (see first_eog_index)",
    },
    tokenizer: {
        add_bos_token_metadata: String(addBosMeta),
        bos_id: bosId,
        eos_id: eosId,
        eog_ids: eogIds,
        chat_template_renderer: "@huggingface/jinja (node-llama-cpp's dependency), add_generation_prompt=true",
        how: "common_tokenize(text, add_special=false, parse_special=true) via node-llama-cpp, after the BOS " +
            "token where the vocabulary adds one (bos_added; add_special_false_identical is then false); no " +
            "model here adds EOS.",
    },
    prompts: results,
    ...(benchPrompt ? { bench_prompt: benchPrompt } : {}),
};
fs.mkdirSync(path.dirname(path.resolve(outPath)), { recursive: true });
fs.writeFileSync(outPath, JSON.stringify(doc, null, 1) + "\n");
console.error(`wrote ${outPath}`);

if (opts.compare) {
    const ref = JSON.parse(fs.readFileSync(opts.compare, "utf8"));
    const byId = new Map(ref.prompts.map((p) => [p.id, p]));
    let allSame = true;
    for (const p of results) {
        const r = byId.get(p.id);
        if (!r) {
            console.log(`${p.id}: not in ${opts.compare}`);
            continue;
        }
        const eq = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
        const textSame = r.prompt_text === p.prompt_text;
        const idsSame = eq(r.prompt_ids, p.prompt_ids);
        const firstDiff = p.greedy_ids.findIndex((t, i) => t !== r.greedy_ids[i]);
        const topIdsSame = eq(r.top5_last_prompt_pos.map((x) => x[0]), p.top5_last_prompt_pos.map((x) => x[0]));
        const maxLogitDiff = Math.max(...p.top5_last_prompt_pos.map(([t, l]) => {
            const m = r.top5_last_prompt_pos.find((x) => x[0] === t);
            return m ? Math.abs(m[1] - l) : NaN;
        }));
        const maxMarginDiff = Math.max(...p.step_top1_top2_logit_margin.map((m, i) =>
            Math.abs(m - r.step_top1_top2_logit_margin[i])));
        const same = textSame && idsSame && firstDiff < 0;
        allSame &&= same;
        console.log(`${p.id}: prompt_text ${textSame ? "same" : "DIFFERENT"}, prompt_ids ${idsSame ? "same" : "DIFFERENT"}, ` +
            `greedy ${firstDiff < 0 ? `all ${p.greedy_ids.length} same` : `first differs at step ${firstDiff} ` +
                `(margin there ${r.step_top1_top2_logit_margin[firstDiff]})`}, top5 ids ${topIdsSame ? "same" : "differ"}, ` +
            `max |top5 logit diff| ${Number.isNaN(maxLogitDiff) ? "n/a (top-5 sets differ)" : maxLogitDiff.toExponential(2)}, ` +
            `max |margin diff| ${maxMarginDiff.toExponential(2)}`);
    }
    if (ref.bench_prompt && benchPrompt) {
        const same = ref.bench_prompt.ids.length === benchPrompt.ids.length &&
            ref.bench_prompt.ids.every((t, i) => t === benchPrompt.ids[i]);
        console.log(`bench_prompt ids ${same ? "same" : "DIFFERENT"}, text ${ref.bench_prompt.text === benchPrompt.text ? "same" : "DIFFERENT"}`);
    }
    console.log(allSame ? "ALL PROMPTS REPRODUCED" : "SOME PROMPTS DIFFER");
}

await context.dispose();
await model.dispose();
await llama.dispose();
