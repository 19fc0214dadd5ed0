//! Loading a model from GGUF bytes as they arrive (a browser fetch, a file read in chunks).
//! The header is checked first (architecture, shapes, tensor types: an unsupported type is
//! refused before anything is uploaded); each tensor is then repacked, uploaded and dropped as
//! soon as its bytes are complete, so memory never holds the whole file.

use std::collections::{HashMap, HashSet};

use kestrel_gguf::{GgmlType, GgufError, GgufHeader, GgufStreamReader, StreamEvent, TensorInfo};
use kestrel_gpu::{Gpu, RowShards, Tensor, WeightTensor};
use kestrel_ops::params::KvType;
use kestrel_tokenizer::Tokenizer;

use crate::config::ModelConfig;
use crate::cpu_backend::{CpuBackend, Quantized};
use crate::cpu_forward::{CpuForward, CpuTensors};
use crate::error::{bad_model, ModelError};
use crate::graph::{Graph, GraphSize, LayerWeights, Projection, QkvWeights, Weights};
use crate::model::Model;
use crate::sequences::MAX_SLOTS;
use crate::tensors::{assign_roles, gpu_runs, Expected, Role};

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// KV cache length in tokens; None: the model's training context, capped at 4096.
    pub context_length: Option<usize>,
    /// Most tokens one prefill submit processes.
    pub max_chunk: usize,
    /// How the KV cache stores its values (default f16, as llama.cpp's).
    pub kv_cache: KvType,
    /// KV slots the GPU backend allocates: sequences that can generate at once in batched steps
    /// (`Model::add_sequence`), each with a KV cache of `context_length` (default 1). The CPU
    /// backend's slots grow with `Model::set_slots`.
    pub slots: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { context_length: None, max_chunk: 128, kv_cache: KvType::default(), slots: 1 }
    }
}

/// How far the upload of a model has come (binding and compiling follow in `finish`).
#[derive(Clone, Copy, Debug)]
pub struct LoadProgress {
    pub bytes_received: u64,
    pub tensors_loaded: usize,
    pub tensors_total: usize,
    /// The file's size as its header declares it (where its last tensor ends), once the header
    /// has arrived.
    pub file_bytes: Option<u64>,
}

pub struct ModelLoader {
    target: Target,
    options: LoadOptions,
    reader: GgufStreamReader,
    state: Option<Loading>,
    bytes_received: u64,
}

/// Where the loaded model runs.
enum Target {
    Gpu(Box<Gpu>),
    /// The CPU backend (`cpu_backend`): tensors become `kestrel-cpu` matrices as they arrive.
    Cpu,
}

/// What is known once the header is parsed, and the tensors uploaded so far.
struct Loading {
    config: ModelConfig,
    tokenizer: Tokenizer,
    roles: Vec<Option<Expected>>,
    tensors_total: usize,
    tensors_loaded: usize,
    weights: HashMap<Role, WeightTensor>,
    /// The embedding table and the LM head (when not tied), in row shards.
    tables: HashMap<Role, RowShards>,
    vectors: HashMap<Role, Vec<f32>>,
    /// Q, K and V bytes of a layer, held until all three arrived to upload them fused.
    qkv_parts: HashMap<usize, [Option<Vec<u8>>; 3]>,
    /// Layers whose Q, K and V differ in type: uploaded as three matrices, not fused.
    split_qkv: HashSet<usize>,
    /// The CPU backend's matrices and vectors.
    cpu: CpuTensors<kestrel_cpu::Matrix>,
}

impl ModelLoader {
    pub fn new(gpu: &Gpu, options: LoadOptions) -> Self {
        Self { target: Target::Gpu(Box::new(gpu.clone())), options, reader: GgufStreamReader::new(), state: None, bytes_received: 0 }
    }

    /// A loader for the CPU backend: the same file checks, the model on `kestrel-cpu`'s kernels.
    pub fn new_cpu(options: LoadOptions) -> Self {
        Self { target: Target::Cpu, options, reader: GgufStreamReader::new(), state: None, bytes_received: 0 }
    }

    /// Feeds the next bytes of the file.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), ModelError> {
        self.bytes_received += chunk.len() as u64;
        let Self { target, reader, state, .. } = self;
        let mut failure: Option<ModelError> = None;
        let result = reader.push(chunk, &mut |event| {
            let outcome = match event {
                StreamEvent::Header(header) => Loading::new(header, matches!(target, Target::Gpu(_))).map(|l| *state = Some(l)),
                StreamEvent::Tensor { index, info, bytes } => match state.as_mut() {
                    Some(loading) => loading.add_tensor(target, index, info, bytes),
                    None => Err(bad_model("tensor data before the header")),
                },
            };
            // The stream reader only carries GgufErrors: park ours and stop the stream.
            outcome.map_err(|e| {
                failure = Some(e);
                GgufError::Rejected("model loader rejected the tensor".into())
            })
        });
        match (failure, result) {
            (Some(e), _) => Err(e),
            (None, r) => Ok(r?),
        }
    }

    /// Where the next tensor ends in the file (`GgufStreamReader::next_tensor_end`).
    pub fn next_tensor_end(&self) -> Option<u64> {
        self.reader.next_tensor_end()
    }

    pub fn progress(&self) -> LoadProgress {
        let (loaded, total) = self.state.as_ref().map_or((0, 0), |s| (s.tensors_loaded, s.tensors_total));
        let file_bytes = self.reader.header().map(GgufHeader::data_end);
        LoadProgress { bytes_received: self.bytes_received, tensors_loaded: loaded, tensors_total: total, file_bytes }
    }

    /// Ends the stream (an incomplete file is an error naming the tensor) and builds the model.
    pub async fn finish(self) -> Result<Model, ModelError> {
        self.reader.finish()?;
        let loading = self.state.ok_or_else(|| bad_model("empty file"))?;
        match &self.target {
            Target::Gpu(gpu) => loading.into_model(gpu, &self.options).await,
            Target::Cpu => loading.into_cpu_model(&self.options),
        }
    }
}

impl Loading {
    /// `gpu`: the checks of the GPU graph's fused kernels apply.
    fn new(header: &GgufHeader, gpu: bool) -> Result<Self, ModelError> {
        let config = ModelConfig::from_header(header)?;
        let roles = assign_roles(header, &config)?;
        for (info, role) in header.tensors.iter().zip(&roles) {
            let Some(role) = role else { continue };
            if !gpu_runs(role, info) {
                return Err(ModelError::UnsupportedQuant { tensor: info.name.clone(), ty: info.ggml_type.name().to_string() });
            }
        }
        let types_differ = |layer_roles: &[Role]| {
            let types: Vec<GgmlType> = layer_roles
                .iter()
                .filter_map(|r| header.tensors.iter().zip(&roles).find(|(_, e)| e.as_ref().is_some_and(|e| e.role == *r)))
                .map(|(info, _)| info.ggml_type)
                .collect();
            types.windows(2).any(|w| w[0] != w[1]).then_some(types)
        };
        for l in (0..config.n_layers).filter(|_| gpu && !config.fused_gate_up_tensor) {
            if let Some(types) = types_differ(&[Role::Gate(l), Role::Up(l)]) {
                return Err(ModelError::UnsupportedQuant {
                    tensor: format!("blk.{l}.ffn_gate/ffn_up"),
                    ty: format!("mixed {types:?} (the fused SwiGLU kernel needs gate and up of one type)"),
                });
            }
        }
        let split_qkv = (0..config.n_layers)
            .filter(|&l| !config.fused_qkv_tensor && types_differ(&[Role::Q(l), Role::K(l), Role::V(l)]).is_some())
            .collect();
        let tokenizer = Tokenizer::from_gguf(&header.metadata)?;
        if tokenizer.vocab_size() != config.vocab {
            return Err(bad_model(format!("tokenizer has {} tokens, the model {}", tokenizer.vocab_size(), config.vocab)));
        }
        Ok(Self {
            tensors_total: roles.iter().flatten().count(),
            tensors_loaded: 0,
            config,
            tokenizer,
            roles,
            weights: HashMap::new(),
            tables: HashMap::new(),
            vectors: HashMap::new(),
            qkv_parts: HashMap::new(),
            split_qkv,
            cpu: CpuTensors::default(),
        })
    }

    fn add_tensor(&mut self, target: &Target, index: usize, info: &TensorInfo, bytes: &[u8]) -> Result<(), ModelError> {
        let Some(Some(e)) = self.roles.get(index) else { return Ok(()) };
        let e = e.clone();
        self.tensors_loaded += 1;
        let ty = info.ggml_type;
        let gpu = match target {
            Target::Gpu(gpu) => gpu,
            Target::Cpu => return self.cpu.add::<Quantized>(e.role, ty, bytes, e.rows, e.cols),
        };
        match e.role {
            Role::Q(l) | Role::K(l) | Role::V(l) if !self.split_qkv.contains(&l) => {
                let slot = match e.role {
                    Role::Q(_) => 0,
                    Role::K(_) => 1,
                    _ => 2,
                };
                let parts = self.qkv_parts.entry(l).or_default();
                parts[slot] = Some(bytes.to_vec());
                if let [Some(q), Some(k), Some(v)] = parts {
                    let fused = [q.as_slice(), k.as_slice(), v.as_slice()].concat();
                    let (c, rows) = (&self.config, self.config.qkv_width());
                    let w = WeightTensor::from_gguf_bytes(gpu, &format!("blk.{l}.attn_qkv"), ty, rows, c.hidden, &fused)?;
                    self.weights.insert(Role::Q(l), w);
                    self.qkv_parts.remove(&l);
                }
            }
            // Already the fused matrix: it takes the place of the one Kestrel builds.
            Role::Qkv(l) => {
                let w = WeightTensor::from_gguf_bytes(gpu, &e.name, ty, e.rows, e.cols, bytes)?;
                self.weights.insert(Role::Q(l), w);
            }
            // Rows are whole blocks, so the gate rows and the up rows are the two halves.
            Role::GateUp(l) => {
                let half = ty.row_bytes(e.cols as u64).map(|row| row * (e.rows / 2) as u64).and_then(|b| usize::try_from(b).ok());
                let (gate, up) = match half {
                    Some(half) if 2 * half == bytes.len() => bytes.split_at(half),
                    _ => return Err(bad_model(format!("{}: {} bytes are not two halves of {} rows", e.name, bytes.len(), e.rows))),
                };
                let (gate_name, up_name) = (format!("blk.{l}.ffn_gate"), format!("blk.{l}.ffn_up"));
                self.weights.insert(Role::Gate(l), WeightTensor::from_gguf_bytes(gpu, &gate_name, ty, e.rows / 2, e.cols, gate)?);
                self.weights.insert(Role::Up(l), WeightTensor::from_gguf_bytes(gpu, &up_name, ty, e.rows / 2, e.cols, up)?);
            }
            _ if e.rows == 1 => {
                let mut values = vec![0.0; e.cols];
                kestrel_gguf::dequantize(ty, bytes, &mut values)?;
                self.vectors.insert(e.role, values);
            }
            // The vocabulary-sized tables may exceed one binding: they are split by rows.
            role @ (Role::TokenEmbedding | Role::Output) => {
                let table = RowShards::from_gguf_bytes(gpu, &e.name, ty, e.rows, e.cols, bytes)?;
                self.tables.insert(role, table);
            }
            role => {
                let w = WeightTensor::from_gguf_bytes(gpu, &e.name, ty, e.rows, e.cols, bytes)?;
                self.weights.insert(role, w);
            }
        }
        Ok(())
    }

    async fn into_model(mut self, gpu: &Gpu, options: &LoadOptions) -> Result<Model, ModelError> {
        let c = self.config.clone();
        let max_ctx = context_length(&c, options.context_length)?;
        if options.max_chunk == 0 {
            return Err(ModelError::InvalidOption { name: "max_chunk", reason: "must be at least 1".into() });
        }
        let mut weight = |role: Role| self.weights.remove(&role).ok_or_else(|| bad_model(format!("tensor for {role:?} never arrived")));
        let mut layers_w = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            // Fused Q/K/V arrive as one matrix under Role::Q.
            let qkv = if self.split_qkv.contains(&l) {
                vec![weight(Role::Q(l))?, weight(Role::K(l))?, weight(Role::V(l))?]
            } else {
                vec![weight(Role::Q(l))?]
            };
            layers_w.push((qkv, weight(Role::AttnOutput(l))?, weight(Role::Gate(l))?, weight(Role::Up(l))?, weight(Role::Down(l))?));
        }
        let mut table = |role: Role| self.tables.remove(&role).ok_or_else(|| bad_model(format!("tensor for {role:?} never arrived")));
        let embedding = table(Role::TokenEmbedding)?;
        let output = if c.tied_embeddings { None } else { Some(table(Role::Output)?) };
        let mut vectors = std::mem::take(&mut self.vectors);
        let mut take_vector = |role: Role| vectors.remove(&role).ok_or_else(|| bad_model(format!("tensor for {role:?} never arrived")));
        let upload = |label: &str, values: Vec<f32>| Tensor::from_f32(gpu, label, &[values.len()], &values);
        let mut layers = Vec::with_capacity(c.n_layers);
        for (l, (qkv, attn_output, gate, up, down)) in layers_w.into_iter().enumerate() {
            // Biases follow the weights: one vector for fused Q/K/V, else one per part.
            let biases = if !c.qkv_bias {
                (0..qkv.len()).map(|_| None).collect()
            } else {
                let vectors = if c.fused_qkv_tensor {
                    vec![take_vector(Role::QkvBias(l))?]
                } else {
                    let parts = [take_vector(Role::QBias(l))?, take_vector(Role::KBias(l))?, take_vector(Role::VBias(l))?];
                    if qkv.len() == 1 {
                        vec![parts.concat()]
                    } else {
                        parts.to_vec()
                    }
                };
                vectors.into_iter().map(|v| upload(&format!("blk.{l}.qkv_bias"), v).map(Some)).collect::<Result<Vec<_>, _>>()?
            };
            let parts = qkv.into_iter().zip(biases).map(|(weight, bias)| Projection { weight, bias }).collect();
            // Two norm vectors of the layer, uploaded when the architecture has them.
            let mut norm_pair = |present: bool, roles: [(Role, &str); 2]| -> Result<Option<[Tensor; 2]>, ModelError> {
                if !present {
                    return Ok(None);
                }
                let [a, b] = roles.map(|(role, name)| take_vector(role).and_then(|v| Ok(upload(&format!("blk.{l}.{name}"), v)?)));
                Ok(Some([a?, b?]))
            };
            let qk_norm = norm_pair(c.qk_norm, [(Role::QNorm(l), "attn_q_norm"), (Role::KNorm(l), "attn_k_norm")])?;
            let post_norms =
                norm_pair(c.post_norms, [(Role::AttnPostNorm(l), "post_attention_norm"), (Role::FfnPostNorm(l), "post_ffw_norm")])?;
            layers.push(LayerWeights {
                attn_norm: upload(&format!("blk.{l}.attn_norm"), take_vector(Role::AttnNorm(l))?)?,
                qkv: QkvWeights { parts },
                qk_norm,
                post_norms,
                attn_output,
                ffn_norm: upload(&format!("blk.{l}.ffn_norm"), take_vector(Role::FfnNorm(l))?)?,
                gate,
                up,
                down,
            });
        }
        let rope = c.rope_config(c.rope_factors_role(max_ctx).map(&mut take_vector).transpose()?)?;
        let weights = Weights { embedding, output_norm: upload("output_norm", take_vector(Role::OutputNorm)?)?, output, layers };
        let max_chunk = options.max_chunk.min(max_ctx);
        if options.slots == 0 || options.slots > max_chunk.min(MAX_SLOTS) {
            let reason = format!("{}: 1 to {}", options.slots, max_chunk.min(MAX_SLOTS));
            return Err(ModelError::InvalidOption { name: "slots", reason });
        }
        let size = GraphSize { max_ctx, max_chunk, kv: options.kv_cache, slots: options.slots };
        let graph = Graph::new(gpu, c, weights, &rope, size).await?;
        // A buffer the device failed to allocate, or a loss during the upload, fails the load here
        // rather than the first request.
        gpu.check_faults()?;
        Model::new(graph, self.tokenizer)
    }
}

impl Loading {
    fn into_cpu_model(self, options: &LoadOptions) -> Result<Model, ModelError> {
        let max_ctx = context_length(&self.config, options.context_length)?;
        if options.max_chunk == 0 {
            return Err(ModelError::InvalidOption { name: "max_chunk", reason: "must be at least 1".into() });
        }
        let forward = CpuForward::<Quantized>::from_tensors(self.config, self.cpu, max_ctx, options.kv_cache)?;
        Model::new_cpu(CpuBackend::new(forward, options.max_chunk.min(max_ctx), options.kv_cache), self.tokenizer)
    }
}

/// The KV cache length a load takes: the one asked for, else the model's training context capped
/// at 4096.
pub(crate) fn context_length(c: &ModelConfig, asked: Option<usize>) -> Result<usize, ModelError> {
    let context = asked.unwrap_or(c.train_context.min(4096));
    if context == 0 {
        return Err(ModelError::InvalidOption { name: "context_length", reason: "must be at least 1".into() });
    }
    Ok(context)
}
