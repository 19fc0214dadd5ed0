//! Compute pipelines compiled once per (shader, entry point, defines) and shared. Kernels are
//! built at model load so that no compilation ever lands in a generated token's path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::{preprocess, Defines, GpuError, GpuFeatures};

/// Identifies one specialization of a kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    pub shader: String,
    pub entry: String,
    pub defines: Defines,
}

#[derive(Clone)]
pub struct PipelineCache {
    device: wgpu::Device,
    features: GpuFeatures,
    compiled: Arc<Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>>,
}

impl PipelineCache {
    pub(crate) fn new(device: wgpu::Device, features: GpuFeatures) -> Self {
        Self { device, features, compiled: Arc::default() }
    }

    /// The pipeline for `entry` of shader file `shader` under `defines`, compiling it on first
    /// use. `SUBGROUPS` is defined from the device's features unless the caller set it (tests
    /// set it to "0" to exercise the workgroup-memory fallback on adapters that have subgroups).
    pub async fn get(&self, shader: &str, entry: &str, defines: &Defines) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        let mut defines = defines.clone();
        let subgroups = if self.features.subgroups { "1" } else { "0" };
        defines.entry("SUBGROUPS".into()).or_insert_with(|| subgroups.into());
        let use_subgroups = defines.get("SUBGROUPS").is_some_and(|v| v != "0");
        if use_subgroups && !self.features.subgroups {
            return Err(GpuError::InvalidArgs(format!("{shader}: subgroups requested but the device has none")));
        }
        // Browsers (Tint) require `enable subgroups;` before subgroup built-ins; naga 30 rejects
        // the directive and enables them from the device feature alone.
        if use_subgroups && cfg!(target_arch = "wasm32") {
            defines.insert("WGSL_ENABLE_SUBGROUPS".into(), "1".into());
        }
        let key = PipelineKey { shader: shader.to_string(), entry: entry.to_string(), defines };
        if let Some(p) = self.lock().get(&key) {
            return Ok(p.clone());
        }
        let pipeline = Arc::new(self.compile(&key).await?);
        self.lock().insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// Number of distinct pipelines compiled so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>> {
        // A poisoned cache only means another thread panicked mid-insert; the map is still valid.
        self.compiled.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn compile(&self, key: &PipelineKey) -> Result<wgpu::ComputePipeline, GpuError> {
        let source = preprocess(&key.shader, &key.defines)?;
        #[cfg(not(target_arch = "wasm32"))]
        dump_variant(key);
        let label = format!("{}::{}", key.shader, key.entry);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(&label), source: wgpu::ShaderSource::Wgsl(source.into()) });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(&key.entry),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        if let Some(error) = scope.pop().await {
            return Err(GpuError::Shader { name: label, message: error.to_string() });
        }
        Ok(pipeline)
    }
}

/// With `KESTREL_DUMP_WGSL=DIR`, writes a compiled variant's source as a browser would compile it
/// (with `enable subgroups;` where it uses them) to `DIR/<shader>.<defines>.wgsl`, so that another
/// compiler can check every variant the native tests built: the browser suite runs them through
/// Chromium's Tint, which checks what naga does not (barriers in uniform control flow), including
/// the real-GPU variants that its SwiftShader adapter never picks. A failed write only loses it.
#[cfg(not(target_arch = "wasm32"))]
fn dump_variant(key: &PipelineKey) {
    let Some(dir) = std::env::var_os("KESTREL_DUMP_WGSL") else {
        return;
    };
    let mut defines = key.defines.clone();
    if defines.get("SUBGROUPS").is_some_and(|v| v != "0") {
        defines.insert("WGSL_ENABLE_SUBGROUPS".into(), "1".into());
    }
    let Ok(source) = preprocess(&key.shader, &defines) else {
        return;
    };
    let parts: Vec<String> = key.defines.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let name = format!("{}.{}.wgsl", key.shader, parts.join("."));
    let name: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || "._=-".contains(c) { c } else { '_' }).collect();
    let dir = std::path::Path::new(&dir);
    let _ = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(dir.join(name), source));
}
