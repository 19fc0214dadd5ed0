// The one name shown for a WebGPU adapter, by the worker (`engine.info.gpu.adapter`) and the demo.

/**
 * A readable name from a GPUAdapterInfo: its description, else vendor, architecture and device,
 * else 'unnamed adapter' (browsers may hide all of them).
 * @param {{ vendor?: string, architecture?: string, device?: string, description?: string } | null | undefined} info
 */
export function adapterName(info) {
  const { vendor, architecture, device, description } = info ?? {};
  return description || [vendor, architecture, device].filter(Boolean).join(' ') || 'unnamed adapter';
}
