// ai 6: the provider's models are LanguageModelV3s (what ai 6 calls natively), the provider a
// ProviderV3.
import { createProviderRegistry, generateObject, generateText, Output, streamText, type LanguageModel } from 'ai';
import { z } from 'zod';
import { createKestrel, type KestrelLanguageModel, type KestrelProvider } from '../../../www/ai-sdk.js';

type IsAny<T> = 0 extends 1 & T ? true : false;
const notAny: IsAny<KestrelLanguageModel> = false;
const kestrel: KestrelProvider = createKestrel({ model: 'https://example.com/model.gguf' });
const model = kestrel();
const version: 'v3' = model.specificationVersion;
const providerVersion: 'v3' = kestrel.specificationVersion;
const sdkModel: LanguageModel = kestrel.languageModel('smol');
await generateText({ model, prompt: 'Hi', output: Output.object({ schema: z.object({ name: z.string() }) }) });
streamText({ model: kestrel(), prompt: 'Hi' });
await generateObject({ model, schema: z.object({ name: z.string() }), prompt: 'Hi' });
createProviderRegistry({ kestrel });
export { notAny, version, providerVersion, sdkModel };
