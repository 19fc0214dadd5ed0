// A small app as a user of the npm package writes it: one greedy streamed completion on a model
// served by the app's own origin. bundlers.test.mjs reads the outcome from `window.kestrelOutcome`:
// `{ ok: true, chunks, usage }` or `{ ok: false, code, message }`.
import { createEngine } from '@kestrel-llm/web';

async function run() {
  const engine = await createEngine({ model: '/models/synthetic-qwen3-f32.gguf', context_length: 256 });
  const chunks = [];
  let usage = null;
  // ignore_eos: the random-weight model may pick its end token first, and the test wants tokens.
  const stream = await engine.completions.create({ prompt: 'The kestrel', max_tokens: 2, temperature: 0, ignore_eos: true, stream: true });
  for await (const chunk of stream) {
    if (chunk.choices[0]) chunks.push({ text: chunk.choices[0].text, token_id: chunk.choices[0].token_id });
    usage = chunk.usage ?? usage;
  }
  return { chunks, usage };
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
