// The GPUBuffers this worker holds, for `engine.memory()`: created, and neither destroyed nor
// garbage collected. Counted here, where every buffer passes, because wgpu cannot: on the web it
// drops a buffer without destroying it and leaves it to the garbage collector. Importing this
// module patches GPUDevice and GPUBuffer once for the worker.

/** The live buffers and their bytes. */
export const gpuBuffers = { count: 0, bytes: 0 };

if (globalThis.GPUDevice && globalThis.GPUBuffer) {
  /** @param {number} size */
  const forget = (size) => {
    gpuBuffers.count--;
    gpuBuffers.bytes -= size;
  };
  /** @type {FinalizationRegistry<number>} */
  const collected = new FinalizationRegistry(forget);
  const createBuffer = GPUDevice.prototype.createBuffer;
  GPUDevice.prototype.createBuffer = function (descriptor) {
    const buffer = createBuffer.call(this, descriptor);
    gpuBuffers.count++;
    gpuBuffers.bytes += buffer.size;
    collected.register(buffer, buffer.size, buffer);
    return buffer;
  };
  const destroy = GPUBuffer.prototype.destroy;
  GPUBuffer.prototype.destroy = function () {
    if (collected.unregister(this)) forget(this.size);
    return destroy.call(this);
  };
}
