// A TypeScript app using the package as its README shows, compiled with `tsc --strict` against
// www/index.d.ts (`npm run typecheck`): the declared API must accept what users write.
import { createEngine, isKestrelError, KestrelError, type ChatCompletionChunk, type Completion, type KestrelErrorCode } from '../../../www/index.js';

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
  // Errors narrow without a cast: by class, or by the guard (errors of another copy of the package).
  try {
    await engine.chat.completions.create({ messages: [], temperature: -1 });
  } catch (e) {
    if (e instanceof KestrelError) text += describe(e.code);
    else if (isKestrelError(e)) text += e.code + (e.remote?.code ?? '');
  }
  await engine.flush();
  const persist: boolean | undefined = engine.info.persist_prefix?.enabled;
  text += String(persist);
  await engine.unload();
  return text;
}

/** A switch over the code union: exhaustive (tsc fails if a code is added and not handled here). */
function describe(code: KestrelErrorCode): string {
  switch (code) {
    case 'bad_model': case 'unsupported_quant': case 'fetch_failed': return 'the model file';
    case 'device_limits': case 'out_of_memory': case 'no_webgpu': return 'this device';
    case 'invalid_option': case 'context_overflow': case 'template': case 'tokenizer': return 'the request';
    case 'no_model': case 'busy': case 'needs_gpu': case 'unloaded': return 'the engine state';
    case 'gpu': case 'device_lost': return 'the GPU';
    case 'bad_snapshot': case 'snapshot_mismatch': return 'a saved prefix';
    case 'worker_error': case 'internal': return 'a bug or the page setup';
    case 'remote_error': return 'the remote server';
    case 'leader_lost': return 'the shared engine moving to another tab';
    default: {
      const unhandled: never = code;
      return unhandled;
    }
  }
}
