//! An encoder's layers on the GPU (kestrel-gpu's kernels), its ends on the host: the host
//! gathers the embeddings and normalizes them (O(tokens x hidden)), uploads them, the layers run
//! as one submission, and the last layer's rows come back to be pooled by the CPU encoder's code,
//! so every pooling and the rank head are the CPU path's.
//!
//! The hidden state lives in `a`. Per layer: Q, K and V into the fused `qkv` rows (their biases
//! the products' epilogue), RoPE in place (nomic-bert), attention into `attended`, the output
//! product added into `a` with its bias (the residual is the accumulate epilogue), LayerNorm into
//! `b`, the FFN (GELU of up + bias, or SwiGLU) into `ffn`, the down product added into `b`, and
//! LayerNorm back into `a`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ops::Range;

use kestrel_gguf::GgmlType;
use kestrel_gpu::kernels::encoder::{rope_table, token_spans, EncoderAttentionKernel, EncoderRopeKernel, GeluKernel, PackedQkv, QkvLayout};
use kestrel_gpu::kernels::layernorm::{LayerNormKernel, LayerNormOperands};
use kestrel_gpu::kernels::matmul::{MatmulKernel, SwigluMatmulKernel};
use kestrel_gpu::kernels::{Epilogue, GateUpOperands, Operands, OutputColumns};
use kestrel_gpu::{DType, Gpu, Readback, Recorder, StepOp, StepParams, StepUniform, Tensor, WeightTensor};
use kestrel_ops::params::GateActivation;

use super::forward::{take_layers, Layer, Qkv};
use super::{Encoder, EncoderConfig, EncoderTensors};
use crate::cpu_backend::Quantized;
use crate::error::{bad_model, ModelError};

/// A product's weights and, where the file has one, its bias.
struct Product {
    w: WeightTensor,
    bias: Option<Tensor>,
}

struct GpuLayer {
    /// One fused product, or Q, K and V into their columns of the fused row.
    qkv: Vec<Product>,
    attn_output: Product,
    attn_norm: [Tensor; 2],
    up: Product,
    /// SwiGLU's gate (nomic-bert): the fused gate/up product; none: GELU of `up`.
    gate: Option<WeightTensor>,
    down: Product,
    output_norm: [Tensor; 2],
}

/// The kernels, built at load (one matmul pipeline per weight type and epilogue).
struct Kernels {
    matmul: HashMap<(GgmlType, Epilogue), MatmulKernel>,
    swiglu: HashMap<GgmlType, SwigluMatmulKernel>,
    layernorm: LayerNormKernel,
    gelu: GeluKernel,
    rope: EncoderRopeKernel,
    attention: EncoderAttentionKernel,
}

/// The buffers of one pass, sized for its tokens.
struct Activations {
    a: Tensor,
    b: Tensor,
    qkv: Tensor,
    attended: Tensor,
    ffn: Tensor,
    spans: Tensor,
}

pub(crate) struct GpuEncoder {
    gpu: Gpu,
    /// The embeddings, their norm, pooling and the rank head; it holds no layers.
    host: Encoder<Quantized>,
    layers: Vec<GpuLayer>,
    kernels: Kernels,
    /// nomic-bert's (cos, sin) per position and pair (`rope_table`).
    rope_table: Option<Tensor>,
}

fn upload(gpu: &Gpu, label: &str, values: Vec<f32>) -> Result<Tensor, ModelError> {
    Ok(Tensor::from_f32(gpu, label, &[values.len()], &values)?)
}

fn upload_norm(gpu: &Gpu, label: &str, [w, b]: [Vec<f32>; 2]) -> Result<[Tensor; 2], ModelError> {
    Ok([upload(gpu, &format!("{label}.weight"), w)?, upload(gpu, &format!("{label}.bias"), b)?])
}

fn product(gpu: &Gpu, label: &str, w: WeightTensor, bias: Option<Vec<f32>>) -> Result<Product, ModelError> {
    Ok(Product { w, bias: bias.map(|b| upload(gpu, &format!("{label}.bias"), b)).transpose()? })
}

impl GpuEncoder {
    /// The device the layers run on.
    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// From the host's tensors (the token embeddings, their norm, the rank head: `cpu`), the
    /// layers' matrices already on `gpu`, and every vector (`cpu.values`).
    pub(crate) async fn new(
        gpu: &Gpu,
        config: EncoderConfig,
        cpu: EncoderTensors<kestrel_cpu::Matrix>,
        mut matrices: HashMap<String, WeightTensor>,
    ) -> Result<Self, ModelError> {
        if config.n_heads * config.head_dim != config.hidden {
            return Err(bad_model(format!("{} heads of {} are not the hidden {}", config.n_heads, config.head_dim, config.hidden)));
        }
        let EncoderTensors { matrices: cpu_matrices, mut values } = cpu;
        let layers = take_layers(&config, &mut matrices, &mut values)?;
        let host = Encoder::<Quantized>::with_layers(config, EncoderTensors { matrices: cpu_matrices, values }, Vec::new())?;
        let mut kernels = Kernels {
            matmul: HashMap::new(),
            swiglu: HashMap::new(),
            layernorm: LayerNormKernel::new(gpu).await?,
            gelu: GeluKernel::new(gpu).await?,
            rope: EncoderRopeKernel::new(gpu).await?,
            attention: EncoderAttentionKernel::new(gpu, host.config.head_dim).await?,
        };
        let mut gpu_layers = Vec::with_capacity(layers.len());
        for (l, layer) in layers.into_iter().enumerate() {
            gpu_layers.push(upload_layer(gpu, l, layer)?);
        }
        for layer in &gpu_layers {
            let residual = |p: &Product| Epilogue { bias: p.bias.is_some(), accumulate: true };
            let plain = |p: &Product| Epilogue { bias: p.bias.is_some(), accumulate: false };
            let mut needed: Vec<(GgmlType, Epilogue)> = layer.qkv.iter().map(|p| (p.w.ty, plain(p))).collect();
            needed.extend([(layer.attn_output.w.ty, residual(&layer.attn_output)), (layer.down.w.ty, residual(&layer.down))]);
            match &layer.gate {
                Some(gate) => {
                    if let Entry::Vacant(slot) = kernels.swiglu.entry(gate.ty) {
                        slot.insert(SwigluMatmulKernel::new(gpu, gate.ty, GateActivation::Silu).await?);
                    }
                }
                None => needed.push((layer.up.w.ty, plain(&layer.up))),
            }
            for (ty, epilogue) in needed {
                if let Entry::Vacant(slot) = kernels.matmul.entry((ty, epilogue)) {
                    slot.insert(MatmulKernel::new(gpu, ty, epilogue).await?);
                }
            }
        }
        let rope_table = match host.rope() {
            Some(rope) => {
                let table = rope_table(rope, host.config.head_dim, host.config.train_context)?;
                Some(upload(gpu, "encoder.rope_table", table)?)
            }
            None => None,
        };
        gpu.flush_writes();
        gpu.check_faults()?;
        Ok(Self { gpu: gpu.clone(), host, layers: gpu_layers, kernels, rope_table })
    }

    pub(crate) fn config(&self) -> &EncoderConfig {
        &self.host.config
    }

    /// The host's bytes and the GPU's.
    pub(crate) fn weight_bytes(&self) -> usize {
        let tensors = |p: &Product| p.w.byte_size() + p.bias.as_ref().map_or(0, Tensor::byte_size);
        let norms = |n: &[Tensor; 2]| n.iter().map(Tensor::byte_size).sum::<u64>();
        let gpu: u64 = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.iter().map(tensors).sum::<u64>()
                    + [&l.attn_output, &l.up, &l.down].into_iter().map(tensors).sum::<u64>()
                    + l.gate.as_ref().map_or(0, WeightTensor::byte_size)
                    + norms(&l.attn_norm)
                    + norms(&l.output_norm)
            })
            .sum();
        self.host.weight_bytes() + gpu as usize
    }

    /// `Encoder::embed` with the layers on the GPU: the same inputs, the same outputs.
    pub(crate) async fn embed(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError> {
        let (x, ranges) = self.host.input(inputs);
        let x = self.layers(x, &ranges).await?;
        Ok(self.host.output(&x, &ranges))
    }

    /// Runs every layer over the packed rows `x` of the inputs `ranges` and reads them back.
    async fn layers(&self, x: Vec<f32>, ranges: &[Range<usize>]) -> Result<Vec<f32>, ModelError> {
        let gpu = &self.gpu;
        let c = &self.host.config;
        let n = x.len() / c.hidden;
        let lengths: Vec<usize> = ranges.iter().map(Range::len).collect();
        let spans: Vec<u32> = token_spans(&lengths).concat();
        let act = Activations {
            a: Tensor::from_f32(gpu, "encoder.a", &[n, c.hidden], &x)?,
            b: Tensor::zeros(gpu, "encoder.b", &[n, c.hidden], DType::F32)?,
            qkv: Tensor::zeros(gpu, "encoder.qkv", &[n, 3 * c.hidden], DType::F32)?,
            attended: Tensor::zeros(gpu, "encoder.attended", &[n, c.hidden], DType::F32)?,
            ffn: Tensor::zeros(gpu, "encoder.ffn", &[n, c.ffn], DType::F32)?,
            spans: Tensor::from_u32(gpu, "encoder.spans", &[n, 2], &spans)?,
        };
        let step = StepUniform::new(gpu);
        let params = StepParams::new(n as u32, 0, 0);
        step.write(gpu, &params);
        // Bound per pass: its buffers are sized for its tokens (a pass is one input of up to the
        // model's context or up to TOKENS_PER_PASS packed), and a layer binds a dozen groups.
        let mut ops: Vec<Box<dyn StepOp>> = Vec::new();
        for layer in &self.layers {
            self.bind_layer(layer, &act, &step, n, &mut ops)?;
        }
        let mut rec = Recorder::new(gpu);
        for op in &ops {
            op.record(&mut rec, &params);
        }
        let bytes = act.a.byte_size();
        let readback = Readback::new(gpu, bytes);
        rec.copy(&act.a.buffer, 0, readback.buffer(), 0, bytes);
        let submission = rec.submit();
        let out = readback.read_after(gpu, bytes, Some(submission)).await;
        gpu.check_faults()?;
        Ok(bytemuck::pod_collect_to_vec(&out?))
    }

    fn bind_layer(
        &self,
        layer: &GpuLayer,
        act: &Activations,
        step: &StepUniform,
        n: usize,
        ops: &mut Vec<Box<dyn StepOp>>,
    ) -> Result<(), ModelError> {
        let (gpu, c, k) = (&self.gpu, &self.host.config, &self.kernels);
        let max = n as u32;
        let h = c.hidden as u32;
        let matmul = |p: &Product, accumulate: bool| {
            let epilogue = Epilogue { bias: p.bias.is_some(), accumulate };
            k.matmul.get(&(p.w.ty, epilogue)).ok_or_else(|| bad_model(format!("no {} matmul kernel for {epilogue:?}", p.w.ty)))
        };
        for (i, p) in layer.qkv.iter().enumerate() {
            // One fused product fills the whole row; split ones their third of it.
            let out =
                if layer.qkv.len() == 1 { OutputColumns::whole(3 * h) } else { OutputColumns { offset: i as u32 * h, stride: 3 * h } };
            let product = Operands { w: &p.w, x: &act.a, y: &act.qkv, out, bias: p.bias.as_ref() };
            ops.push(Box::new(matmul(p, false)?.bind(gpu, &product, step, max)?));
        }
        let rows = PackedQkv { qkv: &act.qkv, layout: QkvLayout::fused(c.n_heads, c.head_dim), spans: &act.spans, max_tokens: n };
        if let Some(table) = &self.rope_table {
            ops.push(Box::new(k.rope.bind(gpu, step, &rows, table)?));
        }
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        ops.push(Box::new(k.attention.bind(gpu, step, &rows, &act.attended, scale)?));
        let o = &layer.attn_output;
        ops.push(Box::new(matmul(o, true)?.bind(gpu, &Operands::whole(&o.w, &act.attended, &act.a, o.bias.as_ref()), step, max)?));
        let [weight, bias] = &layer.attn_norm;
        let norm = LayerNormOperands { x: &act.a, weight, bias, out: &act.b, eps: c.norm_eps };
        ops.push(Box::new(k.layernorm.bind(gpu, step, &norm)?));
        match &layer.gate {
            Some(gate) => {
                let swiglu = k.swiglu.get(&gate.ty).ok_or_else(|| bad_model(format!("no {} SwiGLU kernel", gate.ty)))?;
                ops.push(Box::new(swiglu.bind(gpu, &GateUpOperands { gate, up: &layer.up.w, x: &act.b, out: &act.ffn }, step, max)?));
            }
            None => {
                let up = &layer.up;
                ops.push(Box::new(matmul(up, false)?.bind(gpu, &Operands::whole(&up.w, &act.b, &act.ffn, up.bias.as_ref()), step, max)?));
                ops.push(Box::new(k.gelu.bind(gpu, step, &act.ffn)?));
            }
        }
        let d = &layer.down;
        ops.push(Box::new(matmul(d, true)?.bind(gpu, &Operands::whole(&d.w, &act.ffn, &act.b, d.bias.as_ref()), step, max)?));
        let [weight, bias] = &layer.output_norm;
        let norm = LayerNormOperands { x: &act.b, weight, bias, out: &act.a, eps: c.norm_eps };
        ops.push(Box::new(k.layernorm.bind(gpu, step, &norm)?));
        Ok(())
    }
}

/// Uploads a layer's vectors next to its matrices. nomic-bert's up bias, which the CPU pass
/// never reads either (SwiGLU has none in llama.cpp's graph), is left out.
fn upload_layer(gpu: &Gpu, l: usize, layer: Layer<WeightTensor>) -> Result<GpuLayer, ModelError> {
    let name = |s: &str| format!("blk.{l}.{s}");
    let qkv = match layer.qkv {
        Qkv::Fused { w, bias } => vec![product(gpu, &name("attn_qkv"), w, bias)?],
        Qkv::Split { w, bias } => {
            let mut parts = Vec::with_capacity(3);
            for ((w, bias), s) in w.into_iter().zip(bias).zip(["attn_q", "attn_k", "attn_v"]) {
                parts.push(product(gpu, &name(s), w, bias)?);
            }
            parts
        }
    };
    let up_bias = if layer.gate.is_some() { None } else { layer.up_bias };
    Ok(GpuLayer {
        qkv,
        attn_output: product(gpu, &name("attn_output"), layer.attn_output, layer.attn_output_bias)?,
        attn_norm: upload_norm(gpu, &name("attn_output_norm"), layer.attn_norm)?,
        up: product(gpu, &name("ffn_up"), layer.up, up_bias)?,
        gate: layer.gate,
        down: product(gpu, &name("ffn_down"), layer.down, layer.down_bias)?,
        output_norm: upload_norm(gpu, &name("layer_output_norm"), layer.output_norm)?,
    })
}
