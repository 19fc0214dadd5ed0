// A small app as a user of the npm package writes it: one greedy streamed completion on a model
// served by the app's own origin, then the same greedy chat question through each integration
// (subpath exports: the AI SDK provider driven by `ai`, the Prompt API shape, LangChain's chat
// model), all on one engine, and on a shared engine (`shared: true`: the package's SharedWorker,
// which the bundler must build as it builds the dedicated worker). bundlers.test.mjs reads the
// outcome from `window.kestrelOutcome`: `{ ok: true, chunks, usage, chat, integrations, shared }`
// or `{ ok: false, code, message }`.
import { createEngine } from '@kestrel-llm/web';
import { createKestrel } from '@kestrel-llm/web/ai-sdk';
import { ChatKestrel } from '@kestrel-llm/web/langchain';
import { createLanguageModel } from '@kestrel-llm/web/prompt-api';
import { generateText } from 'ai';

/** The chat question each integration asks, greedy, and how many tokens its answer may have. */
const QUESTION = 'Hi';
const ANSWER_TOKENS = 2;
const MODEL = { model: '/models/synthetic-qwen3-f32.gguf', context_length: 256 };

/** The greedy answer to QUESTION from `engine`'s own chat API. */
async function ask(engine) {
  const answer = await engine.chat.completions.create({ messages: [{ role: 'user', content: QUESTION }], max_tokens: ANSWER_TOKENS, temperature: 0 });
  return { text: answer.choices[0].message.content, tokens: answer.usage.completion_tokens };
}

async function run() {
  const engine = await createEngine(MODEL);
  const chunks = [];
  let usage = null;
  // ignore_eos: the random-weight model may pick its end token first, and the test wants tokens.
  const stream = await engine.completions.create({ prompt: 'The kestrel', max_tokens: 2, temperature: 0, ignore_eos: true, stream: true });
  for await (const chunk of stream) {
    if (chunk.choices[0]) chunks.push({ text: chunk.choices[0].text, token_id: chunk.choices[0].token_id });
    usage = chunk.usage ?? usage;
  }
  // The package's own answer, which every integration and the shared engine must give again.
  const chat = await ask(engine);
  const kestrel = createKestrel({ engine });
  const aiSdk = await generateText({ model: kestrel(), prompt: QUESTION, maxOutputTokens: ANSWER_TOKENS, temperature: 0 });
  const LanguageModel = createLanguageModel({ engine, maxTokens: ANSWER_TOKENS });
  const session = await LanguageModel.create({ topK: 1, temperature: 0 });
  const promptApi = await session.prompt(QUESTION);
  session.destroy();
  const langchain = await new ChatKestrel({ engine, temperature: 0, maxTokens: ANSWER_TOKENS }).invoke(QUESTION);
  await engine.unload();
  const sharedEngine = await createEngine({ ...MODEL, shared: true });
  const shared = { ...(await ask(sharedEngine)), mode: sharedEngine.info.shared?.mode ?? null };
  await sharedEngine.unload();
  return {
    chunks,
    usage,
    chat,
    integrations: { 'ai-sdk': aiSdk.text, 'prompt-api': promptApi, langchain: langchain.content },
    shared,
  };
}

run().then(
  (result) => {
    window.kestrelOutcome = { ok: true, ...result };
    document.getElementById('out').textContent = result.chunks.map((c) => c.text).join('');
  },
  (e) => {
    window.kestrelOutcome = { ok: false, code: e?.code, message: e?.message ?? String(e) };
    document.getElementById('out').textContent = `${e?.code}: ${e?.message}`;
  },
);
