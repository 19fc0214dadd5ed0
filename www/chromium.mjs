// Headless Chromium as the browser tests and the benchmark suite launch it (development tooling,
// not part of the npm package): WebGPU through SwiftShader's Vulkan on a machine without a GPU,
// or on the machine's GPU. The caller passes playwright-core's `chromium`: each of them has
// playwright-core in its own node_modules, and the package (www/) has none.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const WEBGPU_FLAGS = {
  swiftshader: ['--enable-unsafe-webgpu', '--enable-features=Vulkan', '--use-vulkan=swiftshader', '--use-webgpu-adapter=swiftshader', '--disable-vulkan-surface'],
  gpu: ['--enable-unsafe-webgpu', '--enable-features=Vulkan'],
};
const COMMON_FLAGS = ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'];

/**
 * Launches Chromium ($CHROMIUM, else /usr/bin/chromium) through playwright-core's `chromium`
 * with a fresh profile. `webgpu`:
 * 'swiftshader', 'gpu', or null for WebGPU off; `flags`: more command-line switches.
 * Resolves to {context, userDataDir, close()}; close() also removes the profile.
 * @template {{ close(): Promise<void> }} Context
 * @param {{ launchPersistentContext(userDataDir: string, options: { executablePath: string, headless: boolean, args: string[] }): Promise<Context> }} chromium
 *   playwright-core's BrowserType (the part used here), whose contexts are `Context`s
 * @param {{ webgpu?: keyof typeof WEBGPU_FLAGS | null, flags?: string[] }} [options]
 */
export async function launchChromium(chromium, { webgpu = 'swiftshader', flags = [] } = {}) {
  const userDataDir = mkdtempSync(join(tmpdir(), 'kestrel-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: [...(webgpu ? WEBGPU_FLAGS[webgpu] : []), ...COMMON_FLAGS, ...flags],
  });
  return {
    context,
    userDataDir,
    async close() {
      await context.close();
      rmSync(userDataDir, { recursive: true, force: true });
    },
  };
}
