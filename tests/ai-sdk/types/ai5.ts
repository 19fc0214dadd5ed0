// ai 5: the provider's models are LanguageModelV2s (ai 5 takes no other), the provider a
// ProviderV2 (no specificationVersion, textEmbeddingModel).
import { createProviderRegistry, generateObject, generateText, streamText, type LanguageModel } from 'ai';
import { z } from 'zod';
import { createKestrel, type KestrelLanguageModel, type KestrelProvider } from '../../../www/ai-sdk.js';

type IsAny<T> = 0 extends 1 & T ? true : false;
const notAny: IsAny<KestrelLanguageModel> = false;
const kestrel: KestrelProvider = createKestrel({ model: 'https://example.com/model.gguf' });
const model = kestrel();
const version: 'v2' = model.specificationVersion;
const provider: 'kestrel' = model.provider;
const sdkModel: LanguageModel = kestrel.languageModel('smol');
// @ts-expect-error ProviderV2 names no specificationVersion
kestrel.specificationVersion;
await generateText({ model, prompt: 'Hi' });
streamText({ model: kestrel(), prompt: 'Hi' });
await generateObject({ model, schema: z.object({ name: z.string() }), prompt: 'Hi' });
createProviderRegistry({ kestrel });
export { notAny, version, provider, sdkModel };
