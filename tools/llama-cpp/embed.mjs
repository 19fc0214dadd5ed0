#!/usr/bin/env node
// Record llama.cpp's embeddings of a set of texts for an embedding GGUF (bert, nomic-bert, or a
// decoder with a pooling type), as node-llama-cpp's embedding context computes them: the text
// tokenized without special tokens, the vocabulary's beginning and end tokens added as it adds
// them ([CLS] ... [SEP] for WordPiece; BOS / EOS where a BPE or SentencePiece vocabulary's
// add_bos_token / add_eos_token ask), one sequence per text, pooled as the file says
// (`{arch}.pooling_type`), not normalized.
//
//   node tools/llama-cpp/embed.mjs MODEL.gguf TEXTS.json OUT.json [--threads N]
//   node tools/llama-cpp/embed.mjs MODEL.gguf --bench INPUTS.json [--repeats R] [--threads N] [--json OUT]
//   node tools/llama-cpp/embed.mjs MODEL.gguf --rank QUERY_DOCS.json OUT.json [--threads N]
//
// TEXTS.json: {"reference": ["...", ...]}. OUT.json records, per text, the token ids llama.cpp
// embedded and its vector (rounded to 7 significant digits), with the versions and the model's
// sha256. With --bench: INPUTS.json is an array of token-id arrays (`kestrel bench embed
// --write-inputs`), each embedded in turn as node-llama-cpp embeds (one sequence a call), an
// untimed round and then R timed ones: sentences per second, median and range. With --rank
// (a reranker, pooling_type 4): QUERY_DOCS.json is {"query": "...", "documents": ["...", ...]};
// OUT.json records, per document, the token ids node-llama-cpp's ranking context evaluates for
// the pair (its own _getEvaluationInput) and the score rankAll gives (a probability: the sigmoid
// of the classifier head's first value, for every architecture but qwen3's).
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { LlamaVocabularyType } from "node-llama-cpp";
import { loadLlama, parseArgs, versionInfo } from "./common.mjs";

const { opts, pos } = parseArgs(process.argv.slice(2), { threads: "2", "log-level": "error", bench: "", repeats: "3", json: "", rank: "" });
if (opts.rank) {
    await rank(pos[0], JSON.parse(fs.readFileSync(opts.rank, "utf8")), pos[1]);
    process.exit(0);
}
if (opts.bench) {
    await bench(pos[0], JSON.parse(fs.readFileSync(opts.bench, "utf8")));
    process.exit(0);
}
if (pos.length !== 3) {
    console.error("usage: node embed.mjs MODEL.gguf TEXTS.json OUT.json [--threads N]");
    process.exit(2);
}
const [modelPath, textsPath, outPath] = pos;
const texts = JSON.parse(fs.readFileSync(textsPath, "utf8")).reference;

const llama = await loadLlama({ logLevel: opts["log-level"] });
const model = await llama.loadModel({ modelPath });
const context = await model.createEmbeddingContext({ contextSize: model.trainContextSize, threads: Number(opts.threads) });
const round = (x) => Number(x.toPrecision(7));
const cases = [];
for (const text of texts) {
    // The ids getEmbeddingFor evaluates: its tokenization plus the beginning and end tokens
    // (LlamaEmbeddingContext._prepareInput), recomputed with the same rules.
    const tokens = Array.from(model.tokenize(text, false));
    const { begin, end } = addedTokens(model);
    if (begin != null && tokens[0] !== begin) tokens.unshift(begin);
    if (end != null && tokens.at(-1) !== end) tokens.push(end);
    const embedding = await context.getEmbeddingFor(text);
    cases.push({ text, tokens, vector: Array.from(embedding.vector, round) });
}
const meta = model.fileInfo.metadata;
const arch = meta.general.architecture;
const doc = {
    model: path.basename(modelPath),
    model_sha256: crypto.createHash("sha256").update(fs.readFileSync(modelPath)).digest("hex"),
    engine: "llama.cpp via node-llama-cpp (prebuilt CPU binaries): createEmbeddingContext / getEmbeddingFor",
    version: versionInfo(llama),
    pooling_type: meta[arch]?.pooling_type ?? null,
    how: "one sequence per text, pooled as the file says, not normalized; tokens: model.tokenize(text, false) with the beginning and end tokens added as getEmbeddingFor adds them",
    cases,
};
fs.mkdirSync(path.dirname(path.resolve(outPath)), { recursive: true });
fs.writeFileSync(outPath, JSON.stringify(doc) + "\n");
console.error(`wrote ${outPath}: ${cases.length} texts, ${cases[0]?.vector.length} dimensions`);
await context.dispose();
await model.dispose();
await llama.dispose();

// The tokens getEmbeddingFor adds around a text: node-llama-cpp's resolveBeginningTokenToPrepend
// and resolveEndTokenToAppend (utils/tokenizerUtils.js, not exported). WordPiece: [CLS] and
// [SEP] always; SentencePiece-unigram: EOS; RWKV: none; else (BPE, SentencePiece) BOS and EOS as
// the vocabulary's add_bos_token / add_eos_token say.
function addedTokens(model) {
    const t = model.tokens;
    switch (model.vocabularyType) {
        case LlamaVocabularyType.rwkv: return { begin: null, end: null };
        case LlamaVocabularyType.wpm: return { begin: t.bos, end: t.sep };
        case LlamaVocabularyType.ugm: return { begin: null, end: t.eos };
        default: return { begin: t.shouldPrependBosToken ? t.bos : null, end: t.shouldAppendEosToken ? t.eos : null };
    }
}

async function bench(modelPath, inputs) {
    const llama = await loadLlama({ logLevel: opts["log-level"] });
    const model = await llama.loadModel({ modelPath });
    const context = await model.createEmbeddingContext({ contextSize: model.trainContextSize, threads: Number(opts.threads) });
    const round = async () => {
        const start = performance.now();
        for (const tokens of inputs) await context.getEmbeddingFor(tokens);
        return inputs.length / ((performance.now() - start) / 1000);
    };
    await round();
    const rates = [];
    for (let r = 0; r < Number(opts.repeats); r++) rates.push(await round());
    const sorted = [...rates].sort((a, b) => a - b);
    const report = {
        engine: "llama.cpp",
        version: versionInfo(llama),
        threads: Number(opts.threads),
        inputs: inputs.length,
        tokens_per_input: inputs[0]?.length ?? 0,
        sentences_per_s: { median: sorted[Math.floor(sorted.length / 2)], min: sorted[0], max: sorted.at(-1), n: sorted.length },
    };
    const s = report.sentences_per_s;
    console.log(`${report.inputs} inputs of ${report.tokens_per_input} tokens, llama.cpp CPU (${report.threads} threads): ${s.median.toFixed(1)} sentences/s (median; ${s.min.toFixed(1)}-${s.max.toFixed(1)})`);
    if (opts.json) fs.writeFileSync(opts.json, JSON.stringify(report, null, 2) + "\n");
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

async function rank(modelPath, { query, documents }, outPath) {
    if (!modelPath || !outPath) {
        console.error("usage: node embed.mjs MODEL.gguf --rank QUERY_DOCS.json OUT.json [--threads N]");
        process.exit(2);
    }
    const llama = await loadLlama({ logLevel: opts["log-level"] });
    const model = await llama.loadModel({ modelPath });
    const context = await model.createRankingContext({ contextSize: model.trainContextSize, threads: Number(opts.threads) });
    const scores = await context.rankAll(query, documents);
    // The ids rankAll evaluates per pair: each text as its tokenizeInput gives it (no special
    // tokens, "trimLeadingSpace"), joined by the context's own _getEvaluationInput.
    const tokenize = (text) => model.tokenize(text, false, "trimLeadingSpace");
    const cases = documents.map((document, i) => ({
        document,
        tokens: Array.from(context._getEvaluationInput(tokenize(query), tokenize(document))),
        score: scores[i],
    }));
    const meta = model.fileInfo.metadata;
    const doc = {
        model: path.basename(modelPath),
        model_sha256: crypto.createHash("sha256").update(fs.readFileSync(modelPath)).digest("hex"),
        engine: "llama.cpp via node-llama-cpp (prebuilt CPU binaries): createRankingContext / rankAll",
        version: versionInfo(llama),
        pooling_type: meta[meta.general.architecture]?.pooling_type ?? null,
        how: "one sequence per pair, [BOS] query [EOS] [SEP] document [EOS] without the special tokens the vocabulary lacks; score: sigmoid of the classifier head's first value",
        query,
        cases,
    };
    fs.mkdirSync(path.dirname(path.resolve(outPath)), { recursive: true });
    fs.writeFileSync(outPath, JSON.stringify(doc) + "\n");
    console.error(`wrote ${outPath}: ${cases.length} documents`);
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}
