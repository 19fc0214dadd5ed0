//! Adapter and device creation. Kestrel asks for the adapter's real limits (a 135M model's
//! embedding alone exceeds WebGPU's default 128 MiB binding and 16 KiB workgroup memory budgets
//! on many machines) and for the optional features it can use, and reports what it got.

use std::sync::Arc;

use crate::faults::DeviceFaults;
use crate::signal::Signal;
use crate::{GpuError, PipelineCache};

/// What the caller allows the runtime to use. Tests force features off to cover the fallbacks.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    pub allow_f16: bool,
    pub allow_subgroups: bool,
    pub allow_timestamps: bool,
    /// Requests at most this many bytes per storage binding instead of the adapter's limit: the
    /// device then behaves as one with less (tests of row-sharded tables use it).
    pub max_storage_binding: Option<u64>,
    /// The decode matvec's variant instead of the adapter's choice (`KernelChoice::for_adapter`);
    /// tests force each one.
    pub matvec: Option<MatvecVariant>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self { allow_f16: true, allow_subgroups: true, allow_timestamps: true, max_storage_binding: None, matvec: None }
    }
}

/// The optional features in use on this device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFeatures {
    pub shader_f16: bool,
    pub subgroups: bool,
    pub timestamps: bool,
    /// Smallest subgroup size the adapter may use; kernels relying on subgroups need >= 4.
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
}

/// How the decode matvec (shaders/matvec.wgsl) spreads a matrix over threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatvecVariant {
    /// Threads sharing one row, each taking every `slices`-th block of it (1, 2 or 4).
    pub slices: u32,
    /// Rows each thread computes with one load of the activations (1 to 8).
    pub rows_per_thread: u32,
}

impl MatvecVariant {
    /// A GPU needs many threads in flight to reach its bandwidth: 4 threads share a row and each
    /// computes 2 rows. A CPU-emulated adapter (lavapipe, SwiftShader, WARP) runs a workgroup as
    /// a few SIMD lanes per core, where every load of the activations is paid by each lane: one
    /// thread per row (no reduction, no barrier) computing 8 rows is fastest there (measured on
    /// lavapipe: 8 rows 2.9x faster than 1, 4 rows 2.4x).
    pub fn for_adapter(software: bool) -> Self {
        if software {
            Self { slices: 1, rows_per_thread: 8 }
        } else {
            Self { slices: 4, rows_per_thread: 2 }
        }
    }

    fn check(self) -> Result<Self, GpuError> {
        if ![1, 2, 4].contains(&self.slices) || !(1..=8).contains(&self.rows_per_thread) {
            return Err(GpuError::InvalidArgs(format!("matvec variant {self:?}: slices must be 1, 2 or 4 and rows per thread 1 to 8")));
        }
        Ok(self)
    }
}

/// The kernel variants chosen for this adapter at device creation, reported with `GpuInfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelChoice {
    pub matvec: MatvecVariant,
}

/// Whether an adapter runs on the CPU: its device type says so (lavapipe), or its name is a
/// known software rasterizer (SwiftShader and WARP report other types through WebGPU).
fn is_software_adapter(info: &wgpu::AdapterInfo) -> bool {
    let name = format!("{} {} {}", info.name, info.driver, info.driver_info).to_lowercase();
    info.device_type == wgpu::DeviceType::Cpu
        || ["swiftshader", "llvmpipe", "lavapipe", "microsoft basic render", "warp"].iter().any(|n| name.contains(n))
}

/// A human- and machine-readable description of the device, for `info` and benchmarks.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    pub adapter_name: String,
    pub backend: String,
    pub driver: String,
    pub features: GpuFeatures,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_storage_buffers_per_shader_stage: u32,
    /// A software (CPU-emulated) adapter.
    pub software: bool,
    pub kernels: KernelChoice,
}

/// The device, its queue and everything derived from them. Cheap to clone (all shared).
#[derive(Clone)]
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub limits: wgpu::Limits,
    pub features: GpuFeatures,
    pub info: Arc<GpuInfo>,
    pub pipelines: PipelineCache,
    faults: DeviceFaults,
}

/// The largest piece `Gpu::write` stages at once (a multiple of 4 bytes).
pub const WRITE_PIECE: usize = 16 << 20;

/// A load's uploads, flushed (`Gpu::flush_writes`) once `WRITE_PIECE` bytes of them wait: with
/// `Gpu::write`'s pieces, the staging memory a load holds beyond its buffers stays under two
/// pieces, where wgpu would keep every upload's copy until the first submission.
#[derive(Debug, Default)]
pub struct UploadFlusher {
    unflushed: u64,
}

impl UploadFlusher {
    /// Counts `bytes` just queued for upload on `gpu`, and flushes once a piece's worth waits.
    pub fn uploaded(&mut self, gpu: &Gpu, bytes: usize) {
        self.unflushed += bytes as u64;
        if self.unflushed >= WRITE_PIECE as u64 {
            gpu.flush_writes();
            self.unflushed = 0;
        }
    }
}

impl Gpu {
    /// Finds an adapter and creates a device with its full limits and the allowed features.
    pub async fn new(options: &GpuOptions) -> Result<Self, GpuError> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        if cfg!(target_arch = "wasm32") {
            desc.backends = wgpu::Backends::BROWSER_WEBGPU;
        }
        let instance = wgpu::Instance::new(desc);
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await
            .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        Self::from_adapter(adapter, options).await
    }

    /// Native convenience: blocks on [`Gpu::new`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking(options: &GpuOptions) -> Result<Self, GpuError> {
        pollster::block_on(Self::new(options))
    }

    pub async fn from_adapter(adapter: wgpu::Adapter, options: &GpuOptions) -> Result<Self, GpuError> {
        let available = adapter.features();
        let mut wanted = wgpu::Features::empty();
        if options.allow_f16 {
            wanted |= wgpu::Features::SHADER_F16;
        }
        if options.allow_subgroups {
            wanted |= wgpu::Features::SUBGROUP;
        }
        if options.allow_timestamps {
            wanted |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let required_features = available & wanted;
        let mut limits = adapter.limits();
        if let Some(cap) = options.max_storage_binding {
            limits.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size.min(cap);
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("kestrel"),
                required_features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::DeviceRequest(e.to_string()))?;
        let adapter_info = adapter.get_info();
        let subgroups = required_features.contains(wgpu::Features::SUBGROUP) && adapter_info.subgroup_min_size >= 4;
        let features = GpuFeatures {
            shader_f16: required_features.contains(wgpu::Features::SHADER_F16),
            subgroups,
            timestamps: required_features.contains(wgpu::Features::TIMESTAMP_QUERY),
            subgroup_min_size: adapter_info.subgroup_min_size,
            subgroup_max_size: adapter_info.subgroup_max_size,
        };
        let software = is_software_adapter(&adapter_info);
        let matvec = options.matvec.unwrap_or(MatvecVariant::for_adapter(software)).check()?;
        let kernels = KernelChoice { matvec };
        let info = GpuInfo {
            adapter_name: adapter_info.name.clone(),
            backend: format!("{:?}", adapter_info.backend),
            driver: format!("{} {}", adapter_info.driver, adapter_info.driver_info).trim().to_string(),
            features,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
            software,
            kernels,
        };
        let pipelines = PipelineCache::new(device.clone(), features);
        let faults = DeviceFaults::install(&device);
        Ok(Self { device, queue, limits, features, info: Arc::new(info), pipelines, faults })
    }

    /// Fails with the fault the device reported since the last check, if any: `DeviceLost` (on
    /// every check from then on), `OutOfMemory` or `Device` (once).
    pub fn check_faults(&self) -> Result<(), GpuError> {
        self.faults.check()
    }

    /// Resolves once every submission so far has finished on the device (natively by waiting
    /// for it; on wasm as the browser's promise, without blocking the worker), then fails with a
    /// fault the device reported meanwhile.
    pub async fn work_done(&self) -> Result<(), GpuError> {
        let signal = Signal::<()>::default();
        let sender = signal.clone();
        self.queue.on_submitted_work_done(move || sender.complete(()));
        #[cfg(not(target_arch = "wasm32"))]
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Device(e.to_string()))?;
        signal.await;
        self.check_faults()
    }

    /// Bytes of device memory held by live allocations, as the backend's allocator reports it;
    /// None where the backend keeps no report (the browser's WebGPU). Dropped buffers are freed
    /// when the device is next polled.
    pub fn allocated_bytes(&self) -> Option<u64> {
        self.device.generate_allocator_report().map(|report| report.total_allocated_bytes)
    }

    /// Largest byte size one storage binding may have on this device.
    pub fn max_binding_size(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size)
    }

    /// A storage buffer of `size` bytes (rounded up to 16), checked against the device limits.
    pub fn storage_buffer(&self, label: &str, size: u64) -> Result<wgpu::Buffer, GpuError> {
        // Whole 16-byte units, so that a kernel may read any f32 buffer as vec4s.
        let size = size.max(16).next_multiple_of(16);
        if size > self.max_binding_size() {
            return Err(GpuError::Limit { what: label.to_string(), needed: size, limit: self.max_binding_size() });
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        }))
    }

    /// A storage buffer initialised with `data` (padded to a multiple of 4 bytes).
    pub fn storage_buffer_init(&self, label: &str, data: &[u8]) -> Result<wgpu::Buffer, GpuError> {
        let buffer = self.storage_buffer(label, data.len() as u64)?;
        self.write(&buffer, 0, data);
        Ok(buffer)
    }

    /// A uniform buffer holding `data`; `data` is padded to 16 bytes as WGSL uniform structs need.
    pub fn uniform_buffer(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let size = (data.len() as u64).max(16).next_multiple_of(16);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.write(&buffer, 0, data);
        buffer
    }

    /// Submits the writes queued so far and, natively, waits for them, so that the staging memory
    /// `write` holds them in is given back: a load uploading gigabytes would otherwise hold a
    /// second copy of every weight until its first step. (In a browser the GPU process stages
    /// writes itself.)
    pub fn flush_writes(&self) {
        self.queue.submit(std::iter::empty());
        #[cfg(not(target_arch = "wasm32"))]
        {
            // A lost device fails the poll; the load's fault check reports it.
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        }
    }

    /// Queues a write of `data` at `offset`; zero-pads the tail to the 4-byte granularity WebGPU
    /// requires. It lands before the next submit's work. A large write (a weight table) goes in
    /// pieces of `WRITE_PIECE` bytes, each flushed before the next is staged, so that staging never
    /// holds a whole table.
    pub fn write(&self, buffer: &wgpu::Buffer, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if data.len() > WRITE_PIECE {
            for (i, piece) in data.chunks(WRITE_PIECE).enumerate() {
                self.write(buffer, offset + (i * WRITE_PIECE) as u64, piece);
                self.flush_writes();
            }
            return;
        }
        if data.len().is_multiple_of(4) {
            self.queue.write_buffer(buffer, offset, data);
        } else {
            let mut padded = data.to_vec();
            padded.resize(data.len().next_multiple_of(4), 0);
            self.queue.write_buffer(buffer, offset, &padded);
        }
    }
}
