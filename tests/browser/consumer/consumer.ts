// A TypeScript app using the package as its README shows, compiled with `tsc --strict` against
// www/index.d.ts (`npm run typecheck`): the declared API must accept what users write.
import { createEngine, type ChatCompletionChunk, type Completion, type KestrelError } from '../../../www/index.js';

export async function chat(streamed: boolean): Promise<string> {
  const engine = await createEngine({
    model: '/models/SmolLM2-135M-Instruct.Q4_1.gguf',
    onProgress: (p) => console.log(p.phase, p.loaded, p.total),
    remote: { baseURL: 'http://127.0.0.1:8080/v1', apiKey: 'key', model: 'kestrel' },
  });
  console.log(engine.info.backend, engine.info.fallback?.code, engine.info.gpu?.adapter);
  let text = '';
  for await (const chunk of await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi!' }], stream: true, max_tokens: 8 })) {
    const c: ChatCompletionChunk = chunk;
    text += c.choices[0]?.delta?.content ?? '';
  }
  const whole = await engine.completions.create({ prompt: 'Once', max_tokens: 4, temperature: 0, stop: ['\n'] });
  text += whole.choices[0].text + whole.usage?.completion_tokens;
  // `stream` known only at run time.
  const result = await engine.completions.create({ prompt: 'Once', stream: streamed });
  if (Symbol.asyncIterator in result) {
    for await (const chunk of result) text += chunk.choices[0]?.text ?? '';
  } else {
    const completion: Completion = result;
    text += completion.choices[0].text;
  }
  try {
    await engine.chat.completions.create({ messages: [], temperature: -1 });
  } catch (e) {
    text += (e as KestrelError).code;
  }
  await engine.unload();
  return text;
}
