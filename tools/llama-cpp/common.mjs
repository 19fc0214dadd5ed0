// Shared by the scripts here: load node-llama-cpp's *prebuilt* llama.cpp (CPU only), never
// downloading or compiling anything; render chat prompts; the JSON reports' common blocks and
// statistics.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

// node-llama-cpp reads these when its modules load; set them before importing it. SKIP_DOWNLOAD
// stops any attempt to fetch llama.cpp sources from GitHub, GPU=false skips CUDA/Metal probing:
// the CPU build (@node-llama-cpp/linux-x64) runs unless a caller asks for `gpu: "vulkan"`
// (@node-llama-cpp/linux-x64-vulkan, the same release built with ggml-vulkan).
process.env.NODE_LLAMA_CPP_SKIP_DOWNLOAD ??= "true";
process.env.NODE_LLAMA_CPP_GPU ??= "false";
// ggml-vulkan skips CPU-type devices (lavapipe) unless they are listed explicitly; device 0 is
// the only Vulkan device on a machine without a GPU.
process.env.GGML_VK_VISIBLE_DEVICES ??= "0";

const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");

export const HERE = path.dirname(fileURLToPath(import.meta.url));

export function packageVersion(name) {
    const p = path.join(HERE, "node_modules", ...name.split("/"), "package.json");
    return JSON.parse(fs.readFileSync(p, "utf8")).version;
}

// The llama.cpp source the prebuilt binaries were made from (see README.md: the bundle in
// node_modules/node-llama-cpp/llama/gitRelease.bundle is at this commit).
export const LLAMA_CPP_COMMIT = "ggml-org/llama.cpp@de3ff815ea7d559ee917f063901b8986f038abc6";

// `gpu`: false for the CPU build, "vulkan" for the Vulkan build.
export async function loadLlama({ logLevel = "warn", gpu = false } = {}) {
    const llama = await getLlama({
        build: "never", // use the prebuilt binary or fail; never compile llama.cpp
        usePrebuiltBinaries: true,
        skipDownload: true,
        gpu,
        progressLogs: false,
        maxThreads: 0, // a context's `threads` is then exactly the thread count used
        logLevel: LlamaLogLevel[logLevel] ?? logLevel,
    });
    if (llama.buildType !== "prebuilt") {
        throw new Error(`expected node-llama-cpp's prebuilt llama.cpp, got a ${llama.buildType}`);
    }
    if (llama.gpu !== gpu) throw new Error(`asked for llama.cpp with gpu ${gpu}, got ${llama.gpu}`);
    return llama;
}

export function versionInfo(llama) {
    return {
        node_llama_cpp: packageVersion("node-llama-cpp"),
        prebuilt_package: llama.gpu === "vulkan"
            ? `@node-llama-cpp/linux-x64-vulkan@${packageVersion("@node-llama-cpp/linux-x64-vulkan")}`
            : `@node-llama-cpp/linux-x64@${packageVersion("@node-llama-cpp/linux-x64")}`,
        gpu: llama.gpu,
        llama_cpp_release: llama.llamaCppRelease.release,
        llama_cpp_commit: LLAMA_CPP_COMMIT,
        build_type: llama.buildType,
        system_info: llama.systemInfo,
    };
}

export function parseArgs(argv, spec) {
    // spec: {name: default}; "--name value" or "--name=value"; the rest are positionals
    const opts = { ...spec };
    const pos = [];
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        if (!a.startsWith("--")) {
            pos.push(a);
            continue;
        }
        let [k, v] = a.slice(2).split(/=(.*)/s, 2);
        if (!(k in spec)) throw new Error(`unknown option --${k}`);
        if (v === undefined) {
            if (typeof spec[k] === "boolean") v = "true";
            else v = argv[++i];
        }
        if (v === undefined) throw new Error(`--${k} needs a value`);
        opts[k] = typeof spec[k] === "number" ? Number(v) : typeof spec[k] === "boolean" ? v === "true" : v;
    }
    return { opts, pos };
}

// A conversation as the GGUF's own tokenizer.chat_template renders it through @huggingface/jinja
// (the Jinja engine node-llama-cpp itself uses for GGUF templates), with add_generation_prompt =
// true and bos_token / eos_token from the vocabulary: what Kestrel's Prompt::Chat renders.
export function renderChat(model, messages) {
    const { chat_template: template, ggml } = model.fileInfo.metadata.tokenizer;
    if (!template) throw new Error("the GGUF has no tokenizer.chat_template");
    return new Template(template).render({
        messages,
        add_generation_prompt: true,
        bos_token: ggml.tokens[ggml.bos_token_id],
        eos_token: ggml.tokens[ggml.eos_token_id],
    });
}

export const r3 = (x) => Math.round(x * 1000) / 1000;
export const sum = (a) => a.reduce((x, y) => x + y, 0);
export const median = (a) => {
    const s = [...a].sort((x, y) => x - y), m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

export function modelInfo(file) {
    return { path: path.resolve(file), file: path.basename(file), size_bytes: fs.statSync(file).size };
}

// The machine, and its load average at the start (given) and now: on a shared machine the
// figures are only as good as the load around them.
export function hostInfo(loadavgStart) {
    return {
        cpu: os.cpus()[0]?.model ?? "unknown", logical_cpus: os.cpus().length,
        loadavg_start: loadavgStart.map(r3), loadavg_end: os.loadavg().map(r3),
    };
}

// A script's JSON report: to `file` where given (its folder made), else to stdout.
export function writeReport(doc, file) {
    const text = JSON.stringify(doc, null, 1) + "\n";
    if (file) {
        fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
        fs.writeFileSync(file, text);
        console.error(`wrote ${file}`);
    } else {
        process.stdout.write(text);
    }
}
