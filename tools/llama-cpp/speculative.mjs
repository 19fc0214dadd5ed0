#!/usr/bin/env node
// Native peer of `kestrel bench model --lookup | --draft-model FILE`: llama.cpp (node-llama-cpp's
// prebuilt CPU build) decoding plainly and with node-llama-cpp's token predictors, on the chat
// prompts of Kestrel's speculative workloads.
//
//   node tools/llama-cpp/speculative.mjs --model M.gguf [--draft-model D.gguf] [--threads 2]
//        [--prompts bench/data/speculative-prompts.json] [--max-tokens 128] [--repeats 1]
//        [--warmup 1] [--json OUT.json] [--lookup-min-pattern 1] [--lookup-max-tokens 3]
//        [--draft-min-tokens 0] [--draft-max-tokens 16] [--draft-min-confidence 0.6]
//        [--draft-threads N]
//
// --lookup-*: InputLookupTokenPredictor's patternLength.min and predictionLength.max (Kestrel's
// lookup matches 2- to 4-token patterns). --draft-*: DraftSequenceTokenPredictor's minTokens,
// maxTokens, minConfidence; --draft-threads (default: --threads) sizes the draft model's own
// context's thread pool. --warmup: untimed rounds of 8 tokens in each mode on the first prompt.
//
// Modes, per prompt and repeat, one after the other in an order that rotates with prompt index +
// repeat (with two modes that is Kestrel's alternation: plain first, then speculative first):
//  - plain: no predictor;
//  - lookup: InputLookupTokenPredictor (prompt lookup), always;
//  - draft: DraftSequenceTokenPredictor on a sequence of the draft model (with --draft-model).
// The predictor options default to node-llama-cpp's own defaults, what its users get. These are
// node-llama-cpp's predictors, not llama.cpp's own (common/speculative.cpp): the lookup matches
// patterns from 1 token long in the prompt only (not the generated text); the draft model drafts
// in the background while the target decodes (both contexts' threads at once), and in 3.22.1 its
// context can lose a token the target kept (draft_context_difference), which costs acceptance:
// with the same file as draft and target, 33-75% of its predictions stood in the smoke tests.
//
// Each prompt of --prompts ({"workloads": {name: [chat prompt strings]}}, workloads in name order
// as Kestrel's BTreeMap) is one user message, rendered with the target GGUF's own chat template
// through @huggingface/jinja (common.mjs renderChat), as Kestrel's Prompt::Chat renders it; not
// with node-llama-cpp's chat wrapper, whose QwenChatWrapper (the one it picks for Qwen2.5) leaves
// out the template's default system message. Tokenized with special tokens parsed, BOS first
// where the vocabulary adds one and the text does not start with it (Kestrel's encode). Each run
// gets a new target sequence (empty KV cache), the draft model's sequence is cleared; greedy
// decoding (temperature 0) stops at an end-of-generation token (not counted) or after
// --max-tokens tokens.
//
// Times are wall clock (performance.now()) around the async iterator of `sequence.evaluate()`:
// TTFT = prompt evaluation (the draft model's too) + the first token; decode tok/s = (tokens - 1)
// / time from the first token to the last, as Kestrel's decode_tok_s. A token the target already
// verified comes out of the iterator without a llama_decode, so per-token times mean nothing here.
//
// Prediction counters: node-llama-cpp's `sequence.tokenPredictions` {validated, refuted, used,
// unused}; every predicted token goes into the target's next llama_decode with the token before
// it; from the first on, each is validated while it equals the target's greedy token at its
// place, and the first that does not is refuted together with all the ones after it. The counters
// are read after each step of the iterator (one step makes at most one target llama_decode), so:
//  - verifying_steps: target decodes whose counters moved (they carried predictions),
//  - falls: of them, those that refuted some,
//  - target_steps: iterator steps whose `used` did not grow (they ran a target decode), the
//    prompt's included.
// acceptance = validated / (validated + refuted) (node-llama-cpp's counting, every token sent to
// verification); acceptance_judged = validated / (validated + falls) (Kestrel's counting: only the
// drafted tokens up to the first wrong one are judged); tokens_per_verifying_step = (validated +
// verifying_steps) / verifying_steps (Kestrel's tokens_per_step: the kept predictions plus the
// target's own token per verifying step). validated includes predictions verified beyond the
// --max-tokens cut (unused). same_as_plain can be false without a bug: the target verifies
// predictions in one llama_decode of several rows, whose products round unlike a one-row step's,
// so a near-tie can go the other way (the 0.5B model on a short edit prompt: two logits 0.009
// apart at the 9th token).
//
// JSON written to --json (and printed to stdout when --json is absent), schema
// "kestrel-native-peer-speculative/1"; times in milliseconds, rates in tokens/s; a spread is
// { median, min, max, n } as Kestrel's:
// {
//   "schema": "kestrel-native-peer-speculative/1", "engine": "llama.cpp",
//   "version": { ... as bench.mjs },
//   "model": { "path", "file", "size_bytes" }, "draft_model": { ... } | null,
//   "host": { "cpu", "logical_cpus", "loadavg_start", "loadavg_end" },
//   "settings": { "threads", "draft_threads", "threads_note", "n_ctx", "n_batch",
//                 "flash_attention", "kv_cache", "gpu", "max_tokens", "repeats", "warmup",
//                 "modes", "sampling", "prompt_rule", "lookup": { predictor options },
//                 "draft": { predictor options } | null },
//   "workloads": [ {
//       "workload", "prompts",
//       "modes": { "plain": { "decode_tok_s": spread, "ttft_ms": spread, "tokens": sum },
//                  "lookup" | "draft": { ...as plain, "ratio_to_plain": spread (per pair of the
//                      same prompt and repeat), "same_tokens": bool (every run), "counters": sums,
//                      "acceptance", "acceptance_judged", "tokens_per_verifying_step",
//                      draft only: "draft_context_misaligned_runs" } } } ],
//   "runs": [ { "workload", "prompt", "repeat", "mode", "position" (0: ran first of its group),
//               "prompt_tokens", "tokens", "ttft_ms", "decode_ms", "decode_tok_s",
//               "same_as_plain", "first_difference" (index, null when the same; plain: null),
//               "counters": { validated, refuted, used, unused, verifying_steps, falls,
//                             target_steps } (plain: null),
//               "acceptance", "acceptance_judged", "tokens_per_verifying_step" (not for plain),
//               "draft_context_difference" (draft only: index of the generated tokens where the
//               draft model's context first parts from the target's, null where it does not),
//               "ids": [the generated token ids] } ],
//   "peak_rss_bytes"
// }
// A rate is null where it cannot be measured (fewer than 2 tokens; no predictions).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { HERE, hostInfo, loadLlama, median, modelInfo, parseArgs, r3, renderChat, sum, versionInfo, writeReport } from "./common.mjs";

// After common.mjs, which sets node-llama-cpp's environment before it loads.
const { DraftSequenceTokenPredictor, InputLookupTokenPredictor } = await import("node-llama-cpp");

const { opts, pos } = parseArgs(process.argv.slice(2), {
    model: "", "draft-model": "", threads: 2, "draft-threads": 0, "max-tokens": 128, repeats: 1, warmup: 1, json: "",
    prompts: path.join(HERE, "..", "..", "bench", "data", "speculative-prompts.json"), "log-level": "warn",
    "lookup-min-pattern": 1, "lookup-max-tokens": 3, "draft-min-tokens": 0, "draft-max-tokens": 16, "draft-min-confidence": 0.6,
});
if (!opts.model || pos.length) {
    console.error("usage: node speculative.mjs --model M.gguf [--draft-model D.gguf] [--threads N] " +
        "[--prompts FILE] [--max-tokens 128] [--repeats R] [--json OUT.json]");
    process.exit(2);
}
const maxTokens = opts["max-tokens"];
if (!(maxTokens >= 1) || !(opts.repeats >= 1) || !(opts.warmup >= 0)) throw new Error("bad --max-tokens, --repeats or --warmup");
const N_CTX = 2048, N_BATCH = 512;

const workloads = JSON.parse(fs.readFileSync(opts.prompts, "utf8")).workloads;
// Every workload a non-empty list of prompt strings: the runs and the summary index them.
const lists = Object.values(workloads ?? {});
if (!lists.length || !lists.every((l) => Array.isArray(l) && l.length && l.every((t) => typeof t === "string"))) {
    throw new Error(`${opts.prompts}: expected {"workloads": {"name": ["prompt", ...], ...}}`);
}
const names = Object.keys(workloads).sort();

// The pattern maximum (0: no limit) and the prediction minimum are node-llama-cpp's defaults.
const lookupOptions = {
    patternLength: { min: opts["lookup-min-pattern"], max: 0 }, predictionLength: { min: 1, max: opts["lookup-max-tokens"] },
};
const draftOptions = {
    minTokens: opts["draft-min-tokens"], maxTokens: opts["draft-max-tokens"], minConfidence: opts["draft-min-confidence"],
};

const loadavgStart = os.loadavg();
const llama = await loadLlama({ logLevel: opts["log-level"] });
const contextOptions = { contextSize: N_CTX, batchSize: N_BATCH, sequences: 1, flashAttention: false };
const model = await llama.loadModel({ modelPath: opts.model, gpuLayers: 0 });
const context = await model.createContext({ ...contextOptions, threads: opts.threads });
// The draft model gets its own context, by default with the same thread count, as a user would
// run it.
const draftThreads = opts["draft-threads"] || opts.threads;
const draftModel = opts["draft-model"] ? await llama.loadModel({ modelPath: opts["draft-model"], gpuLayers: 0 }) : null;
const draftContext = draftModel ? await draftModel.createContext({ ...contextOptions, threads: draftThreads }) : null;
const draftSequence = draftContext?.getSequence() ?? null;
const modes = ["plain", "lookup", ...(draftModel ? ["draft"] : [])];

// Kestrel's encode: BOS first where the vocabulary adds one and the template did not write it.
function promptIds(text) {
    const { bos, bosString, shouldPrependBosToken } = model.tokens;
    const addBos = shouldPrependBosToken && bos != null && !(bosString && text.startsWith(bosString));
    return [...(addBos ? [bos] : []), ...model.tokenize(text, true)];
}

async function generate(mode, ids, limit) {
    let predictor;
    if (mode === "lookup") predictor = new InputLookupTokenPredictor(lookupOptions);
    if (mode === "draft") {
        await draftSequence.clearHistory();
        predictor = new DraftSequenceTokenPredictor(draftSequence, draftOptions);
    }
    // sequence.evaluate() never gives a predictor the input to look in (LlamaChat and
    // LlamaCompletion call updateInputTokens themselves): without this, prompt lookup predicts
    // nothing. The whole prompt, as Kestrel's lookup searches the whole history.
    predictor?.updateInputTokens(ids);
    const sequence = context.getSequence({ tokenPredictor: predictor }); // new: an empty KV cache
    const counters = predictor ? { verifying_steps: 0, falls: 0, target_steps: 0 } : null;
    const tokens = [];
    let first, last, draftDifference = null;
    try {
        const iterator = sequence.evaluate(ids, { temperature: 0 });
        let before = sequence.tokenPredictions;
        const start = performance.now();
        while (tokens.length < limit) {
            const step = await iterator.next();
            const now = performance.now();
            if (counters) {
                const after = sequence.tokenPredictions;
                const judged = after.validated + after.refuted - before.validated - before.refuted;
                counters.verifying_steps += Number(judged > 0);
                counters.falls += Number(after.refuted > before.refuted);
                counters.target_steps += Number(after.used === before.used);
                before = after;
            }
            if (step.done) break; // an end-of-generation token
            tokens.push(step.value);
            first ??= now - start;
            last = now - start;
        }
        if (mode === "draft") draftDifference = draftContextDifference(sequence.contextTokens, ids.length, tokens.length);
        await iterator.return();
        if (counters) Object.assign(counters, sequence.tokenPredictions);
    } finally {
        await sequence.dispose(); // disposes the predictor too
    }
    const decodeMs = tokens.length > 1 ? last - first : null;
    return {
        tokens, ttftMs: first ?? null, decodeMs, decodeTokS: decodeMs ? ((tokens.length - 1) / decodeMs) * 1000 : null,
        counters, draftDifference,
    };
}

// Where the draft model's context first parts from the target's, as an index into the generated
// tokens (null: nowhere). node-llama-cpp 3.22.1's DraftSequenceTokenPredictor can leave out of
// the draft's context a token the target kept (its drafts then continue a text the target never
// had). Only the part both surely hold is compared: the draft evaluates up to maxTokens
// predictions ahead, and a refuted one stays in its context until the predictor hears of it.
function draftContextDifference(target, promptTokens, generated) {
    const draft = draftSequence.contextTokens;
    const n = Math.min(draft.length, promptTokens + generated) - draftOptions.maxTokens - 1;
    for (let i = promptTokens; i < n; i++) if (draft[i] !== target[i]) return i - promptTokens;
    return null;
}

// Ratios of the counters (null without predictions).
function rates(c) {
    const ratio = (a, b) => (b > 0 ? r3(a / b) : null);
    return {
        acceptance: ratio(c.validated, c.validated + c.refuted),
        acceptance_judged: ratio(c.validated, c.validated + c.falls),
        tokens_per_verifying_step: ratio(c.validated + c.verifying_steps, c.verifying_steps),
    };
}

const spread = (a) => (a.length ? { median: r3(median(a)), min: r3(Math.min(...a)), max: r3(Math.max(...a)), n: a.length } : null);

// Warm-up: the weights paged in and each mode's code run once, untimed.
const warmIds = promptIds(renderChat(model, [{ role: "user", content: workloads[names[0]][0] }]));
for (let i = 0; i < opts.warmup; i++) for (const mode of modes) await generate(mode, warmIds, 8);

const runs = [];
for (const workload of names) {
    for (const [p, text] of workloads[workload].entries()) {
        const ids = promptIds(renderChat(model, [{ role: "user", content: text }]));
        if (ids.length + maxTokens > N_CTX) throw new Error(`${workload} prompt ${p}: ${ids.length} tokens, too long for ${N_CTX}`);
        for (let r = 0; r < opts.repeats; r++) {
            const k = (p + r) % modes.length;
            const order = [...modes.slice(k), ...modes.slice(0, k)];
            const out = {};
            for (const mode of order) out[mode] = await generate(mode, ids, maxTokens);
            const plain = out.plain.tokens;
            for (const mode of modes) {
                const g = out[mode];
                let diff = g.tokens.findIndex((t, i) => t !== plain[i]);
                if (diff < 0 && g.tokens.length !== plain.length) diff = Math.min(g.tokens.length, plain.length);
                runs.push({
                    workload, prompt: p, repeat: r, mode, position: order.indexOf(mode),
                    prompt_tokens: ids.length, tokens: g.tokens.length,
                    ttft_ms: g.ttftMs === null ? null : r3(g.ttftMs),
                    decode_ms: g.decodeMs === null ? null : r3(g.decodeMs),
                    decode_tok_s: g.decodeTokS === null ? null : r3(g.decodeTokS),
                    same_as_plain: mode === "plain" ? null : diff < 0,
                    first_difference: mode === "plain" || diff < 0 ? null : diff,
                    counters: g.counters,
                    ...(g.counters ? rates(g.counters) : {}),
                    ...(mode === "draft" ? { draft_context_difference: g.draftDifference } : {}),
                    ids: g.tokens,
                });
            }
            const rate = (m) => out[m].decodeTokS?.toFixed(2) ?? "-";
            console.error(`${workload} prompt ${p} repeat ${r}: ${ids.length} prompt tokens, ` +
                modes.map((m) => `${m} ${rate(m)} tok/s (${out[m].tokens.length} tokens)`).join(", ") +
                `; order ${order.join(", ")}`);
        }
    }
}

function summary(workload) {
    const mine = runs.filter((x) => x.workload === workload);
    const of = (mode) => mine.filter((x) => x.mode === mode);
    const plainRate = new Map(of("plain").map((x) => [`${x.prompt}/${x.repeat}`, x.decode_tok_s]));
    const out = {};
    for (const mode of modes) {
        const rs = of(mode);
        const m = {
            decode_tok_s: spread(rs.map((x) => x.decode_tok_s).filter((x) => x !== null)),
            ttft_ms: spread(rs.map((x) => x.ttft_ms).filter((x) => x !== null)),
            tokens: sum(rs.map((x) => x.tokens)),
        };
        if (mode !== "plain") {
            // Pairs with a rate on both sides, as Kestrel's.
            const ratios = rs.map((x) => [x.decode_tok_s, plainRate.get(`${x.prompt}/${x.repeat}`)])
                .filter(([s, q]) => s > 0 && q > 0).map(([s, q]) => s / q);
            const counters = {};
            for (const k of Object.keys(rs[0].counters)) counters[k] = sum(rs.map((x) => x.counters[k]));
            Object.assign(m, {
                ratio_to_plain: spread(ratios), same_tokens: rs.every((x) => x.same_as_plain), counters, ...rates(counters),
            });
            if (mode === "draft") m.draft_context_misaligned_runs = rs.filter((x) => x.draft_context_difference !== null).length;
        }
        out[mode] = m;
    }
    return { workload, prompts: workloads[workload].length, modes: out };
}

const doc = {
    schema: "kestrel-native-peer-speculative/1",
    engine: "llama.cpp",
    version: versionInfo(llama),
    model: modelInfo(opts.model),
    draft_model: draftModel ? modelInfo(opts["draft-model"]) : null,
    host: hostInfo(loadavgStart),
    settings: {
        threads: opts.threads,
        draft_threads: draftModel ? draftThreads : null,
        threads_note: "target and draft contexts each have a pool of this many threads; DraftSequenceTokenPredictor " +
            "keeps drafting (up to draft.maxTokens ahead) while the target decodes, so both pools can run at once",
        n_ctx: N_CTX, n_batch: N_BATCH, flash_attention: "off", kv_cache: "f16", gpu: false,
        max_tokens: maxTokens, repeats: opts.repeats, warmup: opts.warmup, modes,
        sampling: "greedy (temperature 0), stops at an end-of-generation token or max_tokens",
        prompt_rule: `each prompt of ${path.basename(opts.prompts)} as one user message, the target's chat template ` +
            "rendered with @huggingface/jinja (add_generation_prompt), special tokens parsed, BOS as Kestrel's encode",
        lookup: lookupOptions,
        draft: draftModel ? draftOptions : null,
    },
    workloads: names.map(summary),
    runs,
    // This process's peak resident memory: both models' mapped pages and Node's own.
    peak_rss_bytes: process.resourceUsage().maxRSS * 1024,
};
writeReport(doc, opts.json);

const cell = (s, digits) => (s ? `${s.median.toFixed(digits)} (${s.min.toFixed(digits)}-${s.max.toFixed(digits)})` : "-");
const pct = (x) => (x === null ? "-" : `${Math.round(100 * x)}%`);
console.error(`\nllama.cpp CPU, ${opts.threads} threads` + (draftModel ? ` (draft model: ${draftThreads})` : "") +
    `, at most ${maxTokens} tokens; median (range)`);
console.error("| workload | mode | decode tok/s | ratio to plain | tokens / verifying step | acceptance (judged) | same tokens |");
console.error("|---|---|--:|--:|--:|--:|---|");
for (const w of doc.workloads) {
    for (const [mode, m] of Object.entries(w.modes)) {
        const rest = mode === "plain" ? ["", "", "", ""] : [
            cell(m.ratio_to_plain, 2), m.tokens_per_verifying_step?.toFixed(2) ?? "-",
            `${pct(m.acceptance)} (${pct(m.acceptance_judged)})`, m.same_tokens ? "yes" : "no",
        ];
        console.error(`| ${[w.workload, mode, cell(m.decode_tok_s, 1), ...rest].join(" | ")} |`);
    }
}

const misaligned = sum(doc.workloads.map((w) => w.modes.draft?.draft_context_misaligned_runs ?? 0));
if (misaligned) console.error(`${misaligned} draft run(s) whose draft context lost step with the target's (draft_context_difference)`);

await context.dispose();
await draftContext?.dispose();
await model.dispose();
await draftModel?.dispose();
await llama.dispose();
