//! The runtime itself: device limits and features, pipeline cache, recorder, readback.

mod common;

use kestrel_gpu::kernels::{CopyKernel, FmaKernel, FmaParams};
use kestrel_gpu::{Defines, GpuError, Readback, Recorder, Tensor};

#[test]
fn device_reports_real_limits_not_webgpu_defaults() {
    let gpu = common::gpu();
    let info = &gpu.info;
    eprintln!("adapter {:?} backend {} features {:?}", info.adapter_name, info.backend, info.features);
    // WebGPU's defaults are 128 MiB per binding and 16 KiB of workgroup memory; lavapipe and
    // every desktop GPU offer at least that, and we must have asked for the adapter's values.
    assert!(info.max_storage_buffer_binding_size >= 128 << 20);
    assert!(info.max_compute_workgroup_storage_size >= 16 << 10);
    assert_eq!(gpu.limits.max_storage_buffer_binding_size, info.max_storage_buffer_binding_size);
    let forced = common::gpu_without_subgroups();
    assert!(!forced.features.subgroups && !forced.features.shader_f16 && !forced.features.timestamps);
}

#[test]
fn copy_kernel_round_trips_through_recorder_and_readback() {
    let gpu = common::gpu();
    let kernel = pollster::block_on(CopyKernel::new(&gpu)).unwrap();
    let n = 4 * 1000; // not a multiple of the 256-thread workgroup
    let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
    let src = Tensor::from_f32(&gpu, "src", &[n], &data).unwrap();
    let dst = Tensor::zeros(&gpu, "dst", &[n], kestrel_gpu::DType::F32).unwrap();
    let dispatch = kernel.bind(&gpu, &src, &dst).unwrap();
    let readback = Readback::new(&gpu, dst.byte_size());
    // The same dispatch recorded twice in one submit, then copied out in the same encoder.
    let mut rec = Recorder::new(&gpu);
    dispatch.record(&mut rec);
    dispatch.record(&mut rec);
    rec.copy(&dst.buffer, 0, readback.buffer(), 0, dst.byte_size());
    assert_eq!(rec.dispatches(), 2);
    rec.submit();
    let got = pollster::block_on(readback.read_f32(&gpu, dst.byte_size())).unwrap();
    assert_eq!(got, data);
    // The readback buffer is reusable after unmap.
    let again = pollster::block_on(readback.read_f32(&gpu, 16)).unwrap();
    assert_eq!(again, data[..4]);
}

/// The arithmetic yardstick computes what its chains of multiply-adds compute on the CPU: each
/// thread's sum of 32 values after 100 f32 FMAs each. Both sides round the same operations the
/// same way, up to the order of the final sum (a few ulps of values below 40).
#[test]
fn fma_kernel_computes_its_chains() {
    let gpu = common::gpu();
    let kernel = pollster::block_on(FmaKernel::new(&gpu)).unwrap();
    let params = FmaParams { iterations: 100, scale: 0.999, shift: 0.01 };
    let n = 3000; // not a multiple of the 256-thread workgroup
    let out = Tensor::zeros(&gpu, "out", &[n], kestrel_gpu::DType::F32).unwrap();
    let dispatch = kernel.bind(&gpu, &out, params).unwrap();
    let mut rec = Recorder::new(&gpu);
    dispatch.record(&mut rec);
    rec.submit();
    let got = pollster::block_on(out.read_f32(&gpu)).unwrap();
    let want: Vec<f32> = (0..n as u32).map(|i| params.expected(i)).collect();
    common::assert_close("fma chains", &got, &want, 1e-6, 1e-5);
    assert_eq!(params.flops_per_thread(), 100 * 8 * 4 * 2);
}

#[test]
fn pipelines_compile_once_per_specialization() {
    let gpu = common::gpu();
    let a = pollster::block_on(gpu.pipelines.get("copy", "main", &Defines::new())).unwrap();
    let b = pollster::block_on(gpu.pipelines.get("copy", "main", &Defines::new())).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    let mut other = Defines::new();
    other.insert("SUBGROUPS".into(), "0".into());
    let c = pollster::block_on(gpu.pipelines.get("copy", "main", &other)).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&a, &c) || !gpu.features.subgroups);
}

#[test]
fn shader_errors_are_reported_not_panics() {
    let gpu = common::gpu();
    match pollster::block_on(gpu.pipelines.get("copy", "no_such_entry", &Defines::new())) {
        Err(GpuError::Shader { name, .. }) => assert!(name.contains("copy")),
        Err(other) => panic!("expected a shader error, got {other}"),
        Ok(_) => panic!("a missing entry point compiled"),
    }
    assert!(matches!(pollster::block_on(gpu.pipelines.get("nope", "main", &Defines::new())), Err(GpuError::UnknownShader(_))));
}

#[test]
fn buffers_beyond_the_binding_limit_are_refused() {
    let gpu = common::gpu();
    let too_big = gpu.max_binding_size() + 4;
    assert!(matches!(gpu.storage_buffer("huge", too_big), Err(GpuError::Limit { .. })));
}
