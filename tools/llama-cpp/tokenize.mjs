#!/usr/bin/env node
// Record llama.cpp's tokenization of a set of strings, and what it derives from the vocabulary
// (end-of-generation set, BOS/EOS, whether BOS is added), for a GGUF file.
//
//   node tools/llama-cpp/tokenize.mjs MODEL.gguf STRINGS.json OUT.json
//        [--more-strings MORE.json] [--add-special] [--detokenize]
//
// STRINGS.json: {"strings": ["...", ...]}. The model is loaded vocabulary-only (no weights are
// read), so a file that holds a vocabulary and a header works. Per string: common_tokenize with
// add_special = false and parse_special true, then false (node-llama-cpp's
// `model.tokenize(text, specialTokens)`). The end-of-generation set is every id for which
// llama_vocab_is_eog is true. The output records the node-llama-cpp and llama.cpp versions and
// the model's sha256. bos_id, eos_id and eot_id are node-llama-cpp's: null unless the token is a
// control token.
//
// --more-strings: a second strings file, its strings after STRINGS.json's.
// --add-special: also llama_tokenize(text, add_special = true, parse_special true, then false) per
//   string, as "add_special" and "add_special_no_parse". node-llama-cpp's addon always passes
//   add_special = false, so these come from the same prebuilt libllama called through Python's
//   ctypes (python3 must be on PATH); its add_special = false ids are checked against the addon's.
// --detokenize: also llama_detokenize(the parse_special ids, remove_special = false,
//   unparse_special = true) per string, as "detokenized" (node-llama-cpp's
//   `model.detokenize(tokens, true)`).
import { spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { HERE, loadLlama, parseArgs, versionInfo } from "./common.mjs";

const { opts, pos } = parseArgs(process.argv.slice(2), {
    "log-level": "error",
    "more-strings": "",
    "add-special": false,
    detokenize: false,
});
if (pos.length !== 3) {
    console.error("usage: node tokenize.mjs MODEL.gguf STRINGS.json OUT.json [--more-strings MORE.json] [--add-special] [--detokenize]");
    process.exit(2);
}
const [modelPath, stringsPath, outPath] = pos;
const readStrings = (p) => JSON.parse(fs.readFileSync(p, "utf8")).strings;
const strings = [...readStrings(stringsPath), ...(opts["more-strings"] ? readStrings(opts["more-strings"]) : [])];

// llama_tokenize through ctypes on the prebuilt CPU libraries (the struct is llama.h's
// llama_model_params at the commit in common.mjs). Reads {"model", "strings"} on stdin, writes
// [[add_special parse, add_special no parse, plain parse, plain no parse], ...].
const CTYPES_TOKENIZE = String.raw`
import ctypes, json, os, sys
bins = sys.argv[1]
for lib in ["libggml-base.so", "libggml.v0.5.0.so", "libllama.v0.5.0.so"]:
    L = ctypes.CDLL(os.path.join(bins, lib), mode=ctypes.RTLD_GLOBAL)
class ModelParams(ctypes.Structure):
    _fields_ = [("devices", ctypes.c_void_p), ("tensor_buft_overrides", ctypes.c_void_p),
                ("n_gpu_layers", ctypes.c_int32), ("split_mode", ctypes.c_int32),
                ("load_mode", ctypes.c_int32), ("lazy_mode", ctypes.c_int32), ("main_gpu", ctypes.c_int32),
                ("tensor_split", ctypes.c_void_p), ("progress_callback", ctypes.c_void_p),
                ("progress_callback_user_data", ctypes.c_void_p), ("kv_overrides", ctypes.c_void_p),
                ("vocab_only", ctypes.c_bool), ("check_tensors", ctypes.c_bool), ("use_extra_bufts", ctypes.c_bool),
                ("no_host", ctypes.c_bool), ("no_alloc", ctypes.c_bool), ("load_mtp", ctypes.c_bool)]
L.llama_model_default_params.restype = ModelParams
L.llama_model_load_from_file.restype = ctypes.c_void_p
L.llama_model_load_from_file.argtypes = [ctypes.c_char_p, ModelParams]
L.llama_model_get_vocab.restype = ctypes.c_void_p
L.llama_model_get_vocab.argtypes = [ctypes.c_void_p]
L.llama_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                             ctypes.c_int32, ctypes.c_bool, ctypes.c_bool]
L.llama_model_free.argtypes = [ctypes.c_void_p]
req = json.load(sys.stdin)
L.llama_backend_init()
params = L.llama_model_default_params()
params.vocab_only = True
model = L.llama_model_load_from_file(req["model"].encode(), params)
if not model:
    sys.exit("llama_model_load_from_file failed")
vocab = L.llama_model_get_vocab(model)
def tokenize(text, add_special, parse_special):
    b = text.encode()
    cap = len(b) + 8
    buf = (ctypes.c_int32 * cap)()
    n = L.llama_tokenize(vocab, b, len(b), buf, cap, add_special, parse_special)
    if n < 0:
        sys.exit("llama_tokenize needs more room")
    return list(buf[:n])
json.dump([[tokenize(s, a, p) for (a, p) in [(True, True), (True, False), (False, True), (False, False)]]
           for s in req["strings"]], sys.stdout)
L.llama_model_free(model)
`;

function ctypesTokenize(modelPath, strings) {
    const bins = path.join(HERE, "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64");
    const run = spawnSync("python3", ["-c", CTYPES_TOKENIZE, bins], {
        input: JSON.stringify({ model: path.resolve(modelPath), strings }),
        encoding: "utf8",
        maxBuffer: 1 << 28,
    });
    if (run.status !== 0) throw new Error(`python3 ctypes llama_tokenize failed: ${run.stderr || run.error}`);
    return JSON.parse(run.stdout);
}

const llama = await loadLlama({ logLevel: opts["log-level"] });
if (opts["add-special"] && (llama.gpu !== false || process.platform !== "linux" || process.arch !== "x64")) {
    throw new Error("--add-special calls @node-llama-cpp/linux-x64's libraries: run it on linux x64 with the CPU build");
}
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
if (opts["add-special"]) {
    const ctypes = ctypesTokenize(modelPath, strings);
    doc.how += "; add_special, add_special_no_parse: llama_tokenize(text, add_special=true, parse_special true / false) " +
        "on the same prebuilt libllama through Python ctypes (its add_special=false ids equal the addon's)";
    doc.cases.forEach((c, i) => {
        const [special, specialNoParse, plain, plainNoParse] = ctypes[i];
        const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
        if (!same(plain, c.parse_special) || !same(plainNoParse, c.no_parse_special)) {
            throw new Error(`ctypes llama_tokenize disagrees with node-llama-cpp on ${JSON.stringify(c.text)}`);
        }
        c.add_special = special;
        c.add_special_no_parse = specialNoParse;
    });
}
if (opts.detokenize) {
    doc.how += "; detokenized: llama_detokenize(parse_special ids, remove_special=false, unparse_special=true)";
    for (const c of doc.cases) c.detokenized = model.detokenize(c.parse_special, true);
}
fs.mkdirSync(path.dirname(path.resolve(outPath)), { recursive: true });
fs.writeFileSync(outPath, JSON.stringify(doc) + "\n");
console.error(`wrote ${outPath}: ${strings.length} strings, EOG ${JSON.stringify(eogIds)}`);

await model.dispose();
await llama.dispose();
