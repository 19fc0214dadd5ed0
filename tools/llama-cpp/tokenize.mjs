#!/usr/bin/env node
// Record llama.cpp's tokenization of a set of strings, and what it derives from the vocabulary
// (end-of-generation set, BOS/EOS, whether BOS is added), for a GGUF file.
//
//   node tools/llama-cpp/tokenize.mjs MODEL.gguf STRINGS.json OUT.json
//
// STRINGS.json: {"strings": ["...", ...]}. The model is loaded vocabulary-only (no weights are
// read), so a file that holds a vocabulary and a header works. Per string: common_tokenize with
// add_special = false and parse_special true, then false (node-llama-cpp's
// `model.tokenize(text, specialTokens)`). The end-of-generation set is every id for which
// llama_vocab_is_eog is true. The output records the node-llama-cpp and llama.cpp versions and
// the model's sha256. bos_id, eos_id and eot_id are node-llama-cpp's: null unless the token is a
// control token.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { loadLlama, parseArgs, versionInfo } from "./common.mjs";

const { opts, pos } = parseArgs(process.argv.slice(2), { "log-level": "error" });
if (pos.length !== 3) {
    console.error("usage: node tokenize.mjs MODEL.gguf STRINGS.json OUT.json");
    process.exit(2);
}
const [modelPath, stringsPath, outPath] = pos;
const strings = JSON.parse(fs.readFileSync(stringsPath, "utf8")).strings;

const llama = await loadLlama({ logLevel: opts["log-level"] });
const model = await llama.loadModel({ modelPath, vocabOnly: true });
const meta = model.fileInfo.metadata;
const nVocab = meta.tokenizer.ggml.tokens.length;
const eogIds = [];
for (let t = 0; t < nVocab; t++) if (model.isEogToken(t)) eogIds.push(t);

const sha256 = crypto.createHash("sha256").update(fs.readFileSync(modelPath)).digest("hex");
const doc = {
    model: path.basename(modelPath),
    model_sha256: sha256,
    engine: "llama.cpp via node-llama-cpp (prebuilt binaries), vocabulary only",
    version: versionInfo(llama),
    how: "common_tokenize(text, add_special=false, parse_special) for parse_special true and false; " +
        "eog_ids: every id for which llama_vocab_is_eog is true",
    vocab: {
        n_tokens: nVocab,
        bos_id: model.tokens.bos,
        eos_id: model.tokens.eos,
        eot_id: model.tokens.eot,
        add_bos: model.tokens.shouldPrependBosToken,
        add_eos: model.tokens.shouldAppendEosToken,
        eog_ids: eogIds,
    },
    cases: strings.map((text) => ({
        text,
        parse_special: Array.from(model.tokenize(text, true)),
        no_parse_special: Array.from(model.tokenize(text, false)),
    })),
};
fs.mkdirSync(path.dirname(path.resolve(outPath)), { recursive: true });
fs.writeFileSync(outPath, JSON.stringify(doc) + "\n");
console.error(`wrote ${outPath}: ${strings.length} strings, EOG ${JSON.stringify(eogIds)}`);

await model.dispose();
await llama.dispose();
