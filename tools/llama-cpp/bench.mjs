#!/usr/bin/env node
// Native peer benchmark: llama.cpp (node-llama-cpp's prebuilt CPU build) prefill and decode speed,
// the counterpart of `kestrel bench`.
//
//   node tools/llama-cpp/bench.mjs --model M.gguf [--threads 2] [--prompt-tokens 128,512]
//        [--decode-tokens 128] [--repeats 3] [--warmup 1] [--json OUT.json]
//        [--prompts tests/data/reference/greedy.json] [--ctx N] [--batch 512]
//        [--flash-attention off|on|auto] [--gpu vulkan]
//
// --gpu vulkan: llama.cpp's Vulkan build (@node-llama-cpp/linux-x64-vulkan) with every layer
// offloaded to Vulkan device 0 (lavapipe on a machine without a GPU: the fair peer of Kestrel's
// GPU kernels on the same emulated device); --threads then only sizes its CPU-side work.
//
// Prompt of P tokens: the ids of `bench_prompt.ids` in --prompts (256 ids of llama.cpp's
// tokenization of the bench text, the same ids every peer is fed), repeated cyclically and cut to
// exactly P ids: ids[i] = bench_prompt.ids[i % 256]. No BOS (the model adds none).
// One measurement ("repeat") for a prompt size P: clear the KV cache; prefill = one llama_decode
// of the P ids (batch --batch, so up to 512 ids in one batch) plus the greedy pick of the first
// new token; then decode = D more steps, each one llama_decode of the previous token plus the
// greedy pick (argmax), timed one by one. Nothing stops at end-of-generation tokens. --warmup
// untimed repeats (32-token prompt, 8 decode steps) come first. Times are wall clock
// (performance.now()) around node-llama-cpp's async calls, so include its small JS overhead.
//
// JSON written to --json (and printed to stdout when --json is absent), schema
// "kestrel-native-peer-bench/1"; every time is in milliseconds, every rate in tokens/s:
// {
//   "schema": "kestrel-native-peer-bench/1",
//   "engine": "llama.cpp",
//   "version": { node_llama_cpp, prebuilt_package, llama_cpp_release, llama_cpp_commit,
//                build_type, system_info },
//   "model": { "path", "file", "size_bytes" },
//   "host": { "cpu", "logical_cpus", "loadavg_start": [1,5,15 min], "loadavg_end": [...] },
//   "settings": { "threads", "n_ctx", "n_batch", "flash_attention", "kv_cache": "f16",
//                 "gpu": false, "repeats", "warmup", "prompt_rule" },
//   "load": { "model_ms", "context_ms" },           // loadModel (mmap + checks), createContext
//   "runs": [ {                                      // one per --prompt-tokens value
//       "prompt_tokens": P, "decode_tokens": D,
//       "prefill": { "ms": [per repeat], "tok_per_s": [per repeat],
//                    "median_ms", "min_ms", "max_ms", "median_tok_per_s", "spread" },
//       "decode":  { "ms": [total per repeat], "tok_per_s": [per repeat],
//                    "median_tok_per_s", "min_tok_per_s", "max_tok_per_s", "spread",
//                    "token_ms": { "p50", "p90", "p99", "mean", "min", "max" },  // all D x repeats steps
//                    "token_ms_per_repeat": [ { "p50", "p90", "p99" } ] },
//       "decode_ids": [D ids of the first repeat]      // the greedy continuation, for checking
//   } ]
// }
// spread = (max - min) / median over the repeats. Percentiles are nearest-rank on sorted values.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { HERE, hostInfo, loadLlama, median, modelInfo, parseArgs, r3, sum, versionInfo, writeReport } from "./common.mjs";

const { opts, pos } = parseArgs(process.argv.slice(2), {
    model: "", threads: 2, "prompt-tokens": "128,512", "decode-tokens": 128, repeats: 3, warmup: 1,
    json: "", prompts: path.join(HERE, "..", "..", "tests", "data", "reference", "greedy.json"),
    ctx: 0, batch: 512, "flash-attention": "off", "log-level": "warn", gpu: "",
});
if (!["", "vulkan"].includes(opts.gpu)) throw new Error("--gpu must be vulkan (or absent for the CPU build)");
const gpu = opts.gpu || false;
if (!opts.model || pos.length) {
    console.error("usage: node bench.mjs --model M.gguf [--threads N] [--prompt-tokens 128,512] " +
        "[--decode-tokens 128] [--repeats R] [--warmup W] [--json OUT.json]");
    process.exit(2);
}
const promptSizes = String(opts["prompt-tokens"]).split(",").map(Number);
const D = opts["decode-tokens"];
if (promptSizes.some((p) => !(p > 0)) || !(D >= 0) || !(opts.repeats >= 1)) throw new Error("bad sizes");
// The default context holds the longest prompt and its decode: 2048, or the next multiple of 1024.
if (!opts.ctx) opts.ctx = Math.max(2048, Math.ceil((Math.max(...promptSizes) + D) / 1024) * 1024);
if (Math.max(...promptSizes) + D > opts.ctx) throw new Error(`--ctx ${opts.ctx} too small`);
const fa = { auto: "auto", on: true, off: false }[opts["flash-attention"]];
if (fa === undefined) throw new Error("--flash-attention must be auto, on or off");

const benchIds = JSON.parse(fs.readFileSync(opts.prompts, "utf8")).bench_prompt?.ids;
if (!Array.isArray(benchIds) || benchIds.length === 0) throw new Error(`${opts.prompts}: no bench_prompt.ids`);
const promptIds = (n) => Array.from({ length: n }, (_, i) => benchIds[i % benchIds.length]);

const loadavgStart = os.loadavg();
const llama = await loadLlama({ logLevel: opts["log-level"], gpu });
let t = performance.now();
const model = await llama.loadModel({ modelPath: opts.model, gpuLayers: gpu ? "max" : 0 });
const modelMs = performance.now() - t;
t = performance.now();
const context = await model.createContext({
    contextSize: opts.ctx, batchSize: opts.batch, threads: opts.threads, sequences: 1, flashAttention: fa,
});
const contextMs = performance.now() - t;
const seq = context.getSequence();

async function measure(ids, nDecode) {
    await seq.clearHistory();
    const gen = seq.evaluate(ids, { temperature: 0, yieldEogToken: true });
    const out = [];
    const stepMs = [];
    let t0 = performance.now();
    let r = await gen.next(); // prefill + first greedy token
    const prefillMs = performance.now() - t0;
    out.push(r.value.token ?? r.value);
    for (let i = 0; i < nDecode; i++) {
        t0 = performance.now();
        r = await gen.next();
        stepMs.push(performance.now() - t0);
        if (r.done) throw new Error("generation ended early");
        out.push(r.value.token ?? r.value);
    }
    await gen.return();
    return { prefillMs, stepMs, ids: out.slice(0, nDecode) };
}

const sorted = (a) => [...a].sort((x, y) => x - y);
const pct = (a, p) => {
    const s = sorted(a);
    return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};

for (let i = 0; i < opts.warmup; i++) await measure(promptIds(32), 8);

const runs = [];
for (const P of promptSizes) {
    const ids = promptIds(P);
    const reps = [];
    for (let i = 0; i < opts.repeats; i++) {
        reps.push(await measure(ids, D));
        const last = reps[reps.length - 1];
        console.error(`prompt ${P}, repeat ${i + 1}/${opts.repeats}: prefill ${(P / last.prefillMs * 1000).toFixed(1)} tok/s, ` +
            `decode ${D ? (D / sum(last.stepMs) * 1000).toFixed(1) : "-"} tok/s`);
    }
    const pMs = reps.map((x) => x.prefillMs);
    const pRate = pMs.map((ms) => (P / ms) * 1000);
    const dMs = reps.map((x) => sum(x.stepMs));
    const dRate = dMs.map((ms) => (D / ms) * 1000);
    const all = reps.flatMap((x) => x.stepMs);
    runs.push({
        prompt_tokens: P,
        decode_tokens: D,
        prefill: {
            ms: pMs.map(r3), tok_per_s: pRate.map(r3),
            median_ms: r3(median(pMs)), min_ms: r3(Math.min(...pMs)), max_ms: r3(Math.max(...pMs)),
            median_tok_per_s: r3(median(pRate)),
            spread: r3((Math.max(...pRate) - Math.min(...pRate)) / median(pRate)),
        },
        decode: D === 0 ? null : {
            ms: dMs.map(r3), tok_per_s: dRate.map(r3),
            median_tok_per_s: r3(median(dRate)), min_tok_per_s: r3(Math.min(...dRate)),
            max_tok_per_s: r3(Math.max(...dRate)),
            spread: r3((Math.max(...dRate) - Math.min(...dRate)) / median(dRate)),
            token_ms: {
                p50: r3(pct(all, 50)), p90: r3(pct(all, 90)), p99: r3(pct(all, 99)),
                mean: r3(sum(all) / all.length), min: r3(Math.min(...all)), max: r3(Math.max(...all)),
            },
            token_ms_per_repeat: reps.map((x) => ({
                p50: r3(pct(x.stepMs, 50)), p90: r3(pct(x.stepMs, 90)), p99: r3(pct(x.stepMs, 99)),
            })),
        },
        decode_ids: reps[0].ids,
    });
}

const doc = {
    schema: "kestrel-native-peer-bench/1",
    engine: "llama.cpp",
    version: versionInfo(llama),
    model: modelInfo(opts.model),
    host: hostInfo(loadavgStart),
    settings: {
        threads: opts.threads, n_ctx: context.contextSize, n_batch: opts.batch,
        flash_attention: opts["flash-attention"], kv_cache: "f16", gpu,
        gpu_device: gpu ? (await llama.getGpuDeviceNames()).join(", ") : null,
        repeats: opts.repeats, warmup: opts.warmup,
        prompt_rule: "ids[i] = bench_prompt.ids[i % bench_prompt.ids.length] from " + path.basename(opts.prompts) + ", no BOS",
    },
    load: { model_ms: r3(modelMs), context_ms: r3(contextMs) },
    runs,
    // This process's peak resident memory: llama.cpp (its mapped file's resident pages included)
    // plus Node's own, tens of MB.
    peak_rss_bytes: process.resourceUsage().maxRSS * 1024,
};
writeReport(doc, opts.json);
for (const r of runs) {
    console.error(`P=${r.prompt_tokens}: prefill ${r.prefill.median_tok_per_s} tok/s (spread ${r.prefill.spread}); ` +
        (r.decode ? `decode ${r.decode.median_tok_per_s} tok/s (spread ${r.decode.spread}), ` +
            `token ms p50 ${r.decode.token_ms.p50} p90 ${r.decode.token_ms.p90} p99 ${r.decode.token_ms.p99}` : ""));
}

await context.dispose();
await model.dispose();
await llama.dispose();
