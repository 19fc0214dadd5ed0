//! Embedding gather against the CPU reference on the same quantized table. Dequantization is exact
//! on both sides (a 4- to 8-bit integer times an f16 scale, or times a K-quant's d·scale, fits in
//! f32; the `+ m` of Q4_1, Q5_1, Q4_K and Q5_K rounds once either way after an exact product;
//! f16 -> f32 is exact), so the rows must match bit for bit.

mod common;

use kestrel_gguf::{quant, GgmlType};
use kestrel_gpu::kernels::embedding::EmbeddingKernel;
use kestrel_gpu::{DType, GpuError, GpuOptions, Recorder, RowShards, StepOp, StepParams, StepUniform, Tensor, WeightTensor};
use kestrel_ops::reference::embedding::embedding;
use kestrel_ops::reference::matmul::dequantize_weights;

const SENTINEL: f32 = 1234.5;

#[test]
fn gathers_rows_of_every_type() {
    let mut rng = common::rng(1);
    let cases = [
        (GgmlType::F32, 37, 96),
        (GgmlType::F32, 5, 13),
        (GgmlType::F16, 37, 96),
        (GgmlType::F16, 5, 14),
        (GgmlType::Q8_0, 37, 96),
        (GgmlType::Q4_0, 37, 576),
        (GgmlType::Q4_1, 1000, 576),
        (GgmlType::Q5_0, 37, 576),
        (GgmlType::Q5_1, 37, 576),
        (GgmlType::Q4_K, 37, 512),
        (GgmlType::Q5_K, 37, 768),
        (GgmlType::Q6_K, 37, 768),
    ];
    for (device, gpu) in [("default", common::gpu()), ("no subgroups", common::gpu_without_subgroups())] {
        let step = StepUniform::new(&gpu);
        for (ty, vocab, hidden) in cases {
            let bytes = quant::quantize(ty, &common::random_vec(&mut rng, vocab * hidden, 1.0)).unwrap();
            let table = dequantize_weights(ty, &bytes, vocab, hidden).unwrap();
            let weights = WeightTensor::from_gguf_bytes(&gpu, "table", ty, vocab, hidden, &bytes).unwrap();
            let kernel = pollster::block_on(EmbeddingKernel::new(&gpu, ty, 1.0)).unwrap();
            // The first and last ids, a repeat, ids past the vocabulary (zeros), and two slots
            // past this step's n_tokens whose output must stay untouched.
            let ids = [0, vocab as u32 - 1, 3, 3, vocab as u32, u32::MAX, 1, 0, 0];
            let n_tokens = ids.len() - 2;
            let ids_t = Tensor::from_u32(&gpu, "ids", &[ids.len()], &ids).unwrap();
            let out = Tensor::from_f32(&gpu, "out", &[ids.len(), hidden], &vec![SENTINEL; ids.len() * hidden]).unwrap();
            let dispatch = kernel.bind(&gpu, &weights, &ids_t, &out, &step, ids.len() as u32).unwrap();
            let params = StepParams::new(n_tokens as u32, 0, 0);
            step.write(&gpu, &params);
            let mut rec = Recorder::new(&gpu);
            dispatch.record(&mut rec, &params);
            rec.submit();
            let got = pollster::block_on(out.read_f32(&gpu)).unwrap();
            let what = format!("embedding {ty} {vocab}x{hidden} ({device})");
            let want = embedding(&table, vocab, hidden, &ids[..n_tokens]);
            assert!(got[..n_tokens * hidden] == want[..], "{what}: rows differ");
            assert!(got[n_tokens * hidden..].iter().all(|&v| v == SENTINEL), "{what}: wrote past n_tokens");
        }
    }
}

/// A table over the device's binding limit, split into row shards: one gather per shard, each
/// writing only the ids in its rows, together equal to the whole table's gather.
#[test]
fn gathers_rows_of_a_row_sharded_table() {
    let gpu = common::gpu_with(&GpuOptions { max_storage_binding: Some(16 << 10), ..GpuOptions::default() });
    let mut rng = common::rng(3);
    // 160 bytes per packed row: 102 rows would fit a 16 KiB shard, 96 (3 whole tiles of 32 rows)
    // do: 11 shards.
    let (ty, vocab, hidden) = (GgmlType::Q4_1, 1000, 256);
    let bytes = quant::quantize(ty, &common::random_vec(&mut rng, vocab * hidden, 1.0)).unwrap();
    let table = dequantize_weights(ty, &bytes, vocab, hidden).unwrap();
    let shards = RowShards::from_gguf_bytes(&gpu, "table", ty, vocab, hidden, &bytes).unwrap();
    assert_eq!(shards.shards.len(), 11);
    assert!(shards.shards.iter().all(|s| s.weight.byte_size() <= 16 << 10));
    // Both sides of a shard boundary, the first and last ids, a repeat, and ids past the
    // vocabulary (zeros, written once).
    let ids = [0, 95, 96, 97, 3, 3, vocab as u32 - 1, 990, vocab as u32, u32::MAX];
    let ids_t = Tensor::from_u32(&gpu, "ids", &[ids.len()], &ids).unwrap();
    let out = Tensor::from_f32(&gpu, "out", &[ids.len(), hidden], &vec![SENTINEL; ids.len() * hidden]).unwrap();
    let step = StepUniform::new(&gpu);
    let kernel = pollster::block_on(EmbeddingKernel::new(&gpu, ty, 1.0)).unwrap();
    let dispatches = kernel.bind_shards(&gpu, &shards, &ids_t, &out, &step, ids.len() as u32).unwrap();
    let params = StepParams::new(ids.len() as u32, 0, 0);
    step.write(&gpu, &params);
    let mut rec = Recorder::new(&gpu);
    dispatches.iter().for_each(|d| d.record(&mut rec, &params));
    rec.submit();
    let got = pollster::block_on(out.read_f32(&gpu)).unwrap();
    assert!(got == embedding(&table, vocab, hidden, &ids), "sharded gather differs from the whole table's");
    // An empty table (sizes come from the file) is an error, not a panic.
    for (rows, cols) in [(0, hidden), (vocab, 0)] {
        let empty = RowShards::from_gguf_bytes(&gpu, "empty", ty, rows, cols, &[]);
        assert!(matches!(empty, Err(GpuError::InvalidArgs(_))), "{rows} x {cols}");
    }
}

/// Gemma's scaled embedding: every gathered row times sqrt(hidden), as the f32 product of the
/// dequantized value and the scale (exactly what llama.cpp's ggml_scale computes).
#[test]
fn scaled_gather_multiplies_each_row() {
    let gpu = common::gpu();
    let mut rng = common::rng(4);
    let (ty, vocab, hidden) = (GgmlType::Q8_0, 50, 640);
    let scale = (hidden as f32).sqrt();
    let bytes = quant::quantize(ty, &common::random_vec(&mut rng, vocab * hidden, 1.0)).unwrap();
    let table = dequantize_weights(ty, &bytes, vocab, hidden).unwrap();
    let weights = WeightTensor::from_gguf_bytes(&gpu, "table", ty, vocab, hidden, &bytes).unwrap();
    let ids = [0, 49, 7];
    let ids_t = Tensor::from_u32(&gpu, "ids", &[ids.len()], &ids).unwrap();
    let out = Tensor::zeros(&gpu, "out", &[ids.len(), hidden], DType::F32).unwrap();
    let step = StepUniform::new(&gpu);
    let kernel = pollster::block_on(EmbeddingKernel::new(&gpu, ty, scale)).unwrap();
    let dispatch = kernel.bind(&gpu, &weights, &ids_t, &out, &step, ids.len() as u32).unwrap();
    let params = StepParams::new(ids.len() as u32, 0, 0);
    step.write(&gpu, &params);
    let mut rec = Recorder::new(&gpu);
    dispatch.record(&mut rec, &params);
    rec.submit();
    let got = pollster::block_on(out.read_f32(&gpu)).unwrap();
    let want: Vec<f32> = embedding(&table, vocab, hidden, &ids).iter().map(|v| v * scale).collect();
    assert!(got == want, "scaled rows differ");
    for bad in [0.0, f32::NAN, -1.0] {
        assert!(matches!(pollster::block_on(EmbeddingKernel::new(&gpu, ty, bad)), Err(GpuError::InvalidArgs(_))), "scale {bad}");
    }
}

#[test]
fn bind_rejects_mismatched_shapes() {
    let gpu = common::gpu();
    let mut rng = common::rng(2);
    let (vocab, hidden) = (10, 64);
    let bytes = quant::quantize(GgmlType::Q8_0, &common::random_vec(&mut rng, vocab * hidden, 1.0)).unwrap();
    let table = WeightTensor::from_gguf_bytes(&gpu, "table", GgmlType::Q8_0, vocab, hidden, &bytes).unwrap();
    let step = StepUniform::new(&gpu);
    let kernel = pollster::block_on(EmbeddingKernel::new(&gpu, GgmlType::Q8_0, 1.0)).unwrap();
    let ids = Tensor::zeros(&gpu, "ids", &[4], DType::U32).unwrap();
    let out = Tensor::zeros(&gpu, "out", &[4, hidden], DType::F32).unwrap();
    let ids_f32 = Tensor::zeros(&gpu, "ids", &[4], DType::F32).unwrap();
    assert!(kernel.bind(&gpu, &table, &ids, &out, &step, 4).is_ok());
    for (what, result) in [
        ("max_tokens past the buffers", kernel.bind(&gpu, &table, &ids, &out, &step, 5)),
        ("f32 ids", kernel.bind(&gpu, &table, &ids_f32, &out, &step, 4)),
        ("max_tokens 0", kernel.bind(&gpu, &table, &ids, &out, &step, 0)),
    ] {
        assert!(matches!(result, Err(GpuError::InvalidArgs(_))), "{what}: expected InvalidArgs");
    }
}
