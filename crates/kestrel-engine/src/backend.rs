//! Where a model runs, chosen once for every front end (the CLI and server's `--backend`, the
//! browser's `backend` option): the GPU, or the CPU backend, and why the CPU when it is.

use kestrel_gpu::{Gpu, GpuOptions};
use kestrel_model::ModelError;

/// What the caller asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendPreference {
    /// The GPU unless there is none or its adapter is a software rasterizer (lavapipe, llvmpipe,
    /// SwiftShader, WARP), which the CPU backend outruns.
    Auto,
    Gpu,
    Cpu,
}

/// Where the model will run.
pub enum Placement {
    Gpu(Box<Gpu>),
    /// The CPU backend, and why.
    Cpu {
        reason: String,
    },
}

/// What the front end knows of its platform, for the choice and its reasons.
pub struct Platform<'a> {
    /// What its GPU interface is called in a reason ("WebGPU", "GPU").
    pub api: &'a str,
    /// Why there can be no GPU at all, known before a device is asked for (a browser without
    /// WebGPU).
    pub missing_api: Option<&'a str>,
    /// The reason given when the CPU backend was asked for.
    pub cpu_asked: &'a str,
}

/// Creates the GPU device `preference` calls for, or says why the CPU backend runs instead.
/// Asking for the GPU where there is none is an error (`no_webgpu`).
pub async fn choose_backend(preference: BackendPreference, options: &GpuOptions, platform: &Platform<'_>) -> Result<Placement, ModelError> {
    let cpu = |reason: String| Ok(Placement::Cpu { reason });
    match (preference, platform.missing_api) {
        (BackendPreference::Cpu, _) => cpu(platform.cpu_asked.to_owned()),
        (BackendPreference::Gpu, Some(why)) => Err(ModelError::Gpu(kestrel_gpu::GpuError::NoAdapter(why.to_owned()))),
        (BackendPreference::Gpu, None) => Ok(Placement::Gpu(Box::new(Gpu::new(options).await?))),
        (BackendPreference::Auto, Some(why)) => cpu(why.to_owned()),
        (BackendPreference::Auto, None) => match Gpu::new(options).await {
            Ok(gpu) if gpu.info.software => {
                // wgpu often has no adapter name on the web.
                let name = &gpu.info.adapter_name;
                let api = platform.api;
                let reason = if name.is_empty() {
                    format!("the {api} adapter is a software rasterizer")
                } else {
                    format!("the {api} adapter ({name}) is a software rasterizer")
                };
                gpu.device.destroy();
                cpu(reason)
            }
            Ok(gpu) => Ok(Placement::Gpu(Box::new(gpu))),
            Err(e) => cpu(format!("no {} device: {e}", platform.api)),
        },
    }
}
