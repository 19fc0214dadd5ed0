//! Loading a model from GGUF bytes as they arrive (a browser fetch, a file read in chunks).
//! The header is checked first (architecture, shapes, tensor types: an unsupported type is
//! refused before anything is uploaded); each tensor is then repacked, uploaded and dropped as
//! soon as its bytes are complete, so memory never holds the whole file. A split model's shards
//! arrive one after another (`ModelLoader::next_shard` between them): each shard's header is
//! checked as it comes, and the whole model's checks run once the last one's has.

use std::collections::{HashMap, HashSet};

use kestrel_gguf::{GgmlType, GgufError, GgufHeader, GgufStreamReader, ShardSequence, StreamEvent, TensorInfo};
use kestrel_gpu::{Gpu, RowShards, Tensor, UploadFlusher, WeightTensor};
use kestrel_ops::params::KvType;
use kestrel_tokenizer::Vocabulary;

use crate::config::ModelConfig;
use crate::cpu_backend::{CpuBackend, Quantized};
use crate::cpu_forward::{CpuForward, CpuTensors};
use crate::encoder::{decoder_pooling, DecoderEmbedder, Embedder, EncoderConfig, EncoderLoading, Pooling};
use crate::error::{bad_model, ModelError};
use crate::graph::{Graph, GraphSize, LayerWeights, Projection, QkvWeights, Weights};
use crate::model::Model;
use crate::model::MAX_SLOTS;
use crate::pending_tokenizer::PendingTokenizer;
use crate::tensors::{gpu_runs, Role, RoleAssigner};

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// KV cache length in tokens; None: the model's training context, capped at 4096.
    pub context_length: Option<usize>,
    /// Most tokens one prefill submit processes.
    pub max_chunk: usize,
    /// How the KV cache stores its values (default f16, as llama.cpp's).
    pub kv_cache: KvType,
    /// KV slots the GPU backend allocates: sequences that can generate at once in batched steps
    /// (the engine's `Generator::add_sequence`), each with a KV cache of `context_length` (default 1). The CPU
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
    /// The current file's size as its header declares it (where its last tensor ends), once the
    /// header has arrived: the current shard's, in a split model.
    pub file_bytes: Option<u64>,
}

pub struct ModelLoader {
    target: Target,
    options: LoadOptions,
    /// The current file's: the current shard's, in a split model.
    reader: GgufStreamReader,
    /// The headers so far, checked as one model's shards (a whole file is a split of one).
    shards: Option<ShardSequence>,
    /// Tensors in the shards before the current one: its tensor `i` is the model's `base + i`.
    base: usize,
    state: Option<State>,
    bytes_received: u64,
}

/// What the file's first header showed the model to be.
enum State {
    /// A Llama-family model: a chat model, or an embedding one where it has a pooling type.
    Chat(Box<Loading>),
    /// An embedding model (`encoder`): its layers on the GPU when loaded for one (natively),
    /// else on the CPU backend.
    Encoder(Box<EncoderLoading>),
}

/// A loaded model: one that generates text, or one that embeds it.
/// Both boxed: the two differ by hundreds of bytes, and a load makes one.
pub enum LoadedModel {
    Chat(Box<Model>),
    Embedding(Box<Embedder>),
}

impl LoadedModel {
    /// The chat model, or `invalid_option` naming why an embedding model cannot chat.
    pub fn into_chat(self) -> Result<Model, ModelError> {
        match self {
            Self::Chat(model) => Ok(*model),
            Self::Embedding(e) => Err(not_a_chat_model(e.config().arch)),
        }
    }
}

/// The error of a text generation asked of an embedding model.
pub fn not_a_chat_model(arch: &str) -> ModelError {
    let reason = format!("this is an embedding model ({arch}): it embeds text (embeddings), it cannot generate it");
    ModelError::InvalidOption { name: "model", reason }
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
    /// A decoder embedding model's pooling (`{arch}.pooling_type`): it loads as a chat model does,
    /// on either backend, and becomes an `Embedder`.
    pooling: Option<Pooling>,
    tokenizer: PendingTokenizer,
    /// Each tensor's role, from the headers so far.
    roles: RoleAssigner,
    /// The GPU graph's fused kernels' checks apply.
    gpu: bool,
    /// The types of the tensors with roles, from the headers so far.
    types: HashMap<Role, GgmlType>,
    tensors_total: usize,
    tensors_loaded: usize,
    weights: HashMap<Role, WeightTensor>,
    /// The embedding table and the LM head (when not tied), in row shards.
    tables: HashMap<Role, RowShards>,
    vectors: HashMap<Role, Vec<f32>>,
    /// Q, K and V of a layer, held until all three arrived to upload them fused.
    qkv_parts: HashMap<usize, [Option<QkvPart>; 3]>,
    /// Layers whose Q, K and V differ in type: uploaded as three matrices, not fused.
    split_qkv: HashSet<usize>,
    /// The CPU backend's matrices and vectors.
    cpu: CpuTensors<kestrel_cpu::Matrix>,
    /// The uploads' staging copies, given back as the load goes.
    flusher: UploadFlusher,
}

impl ModelLoader {
    pub fn new(gpu: &Gpu, options: LoadOptions) -> Self {
        Self::with_target(Target::Gpu(Box::new(gpu.clone())), options)
    }

    /// A loader for the CPU backend: the same file checks, the model on `kestrel-cpu`'s kernels.
    pub fn new_cpu(options: LoadOptions) -> Self {
        Self::with_target(Target::Cpu, options)
    }

    fn with_target(target: Target, options: LoadOptions) -> Self {
        Self { target, options, reader: GgufStreamReader::new(), shards: None, base: 0, state: None, bytes_received: 0 }
    }

    /// Feeds the next bytes of the file.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), ModelError> {
        self.bytes_received += chunk.len() as u64;
        let Self { target, reader, shards, base, state, .. } = self;
        let mut failure: Option<ModelError> = None;
        let result = reader.push(chunk, &mut |event| {
            let outcome = match (event, shards.as_mut(), state.as_mut()) {
                (StreamEvent::Header(header), None, _) => ShardSequence::first(header).map_err(ModelError::from).and_then(|sequence| {
                    let loading = match EncoderConfig::from_header(header)? {
                        Some(config) => {
                            let gpu = match target {
                                Target::Gpu(gpu) => Some(&**gpu),
                                Target::Cpu => None,
                            };
                            State::Encoder(Box::new(EncoderLoading::new(config, header, u32::from(sequence.count()), gpu)?))
                        }
                        None => State::Chat(Box::new(Loading::new(header, matches!(target, Target::Gpu(_)), sequence.count() == 1)?)),
                    };
                    *shards = Some(sequence);
                    *state = Some(loading);
                    Ok(())
                }),
                (StreamEvent::Header(header), Some(sequence), Some(State::Chat(loading))) => sequence
                    .next(header)
                    .map_err(ModelError::from)
                    .and_then(|()| loading.add_header(header, sequence.seen() == sequence.count())),
                (StreamEvent::Tensor { index, info, bytes }, _, Some(State::Chat(loading))) => {
                    loading.add_tensor(target, *base + index, info, bytes)
                }
                (StreamEvent::Tensor { info, bytes, .. }, _, Some(State::Encoder(loading))) => loading.add_tensor(info, bytes),
                _ => Err(bad_model("tensor data before the header")),
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

    /// Ends the current file of a split model, which must be complete: the bytes pushed next are
    /// the next shard's, from its start.
    pub fn next_shard(&mut self) -> Result<(), ModelError> {
        let reader = std::mem::take(&mut self.reader);
        let tensors = reader.header().map_or(0, |h| h.tensors.len());
        reader.finish()?;
        match &self.shards {
            Some(s) if s.seen() < s.count() => {}
            Some(s) => return Err(GgufError::Split { reason: format!("a shard after the last of {}", s.count()) }.into()),
            None => return Err(bad_model("next shard before the first")),
        }
        self.base += tensors;
        Ok(())
    }

    /// Where the next tensor ends in the current file (`GgufStreamReader::next_tensor_end`).
    pub fn next_tensor_end(&self) -> Option<u64> {
        self.reader.next_tensor_end()
    }

    pub fn progress(&self) -> LoadProgress {
        let (loaded, total) = match &self.state {
            None => (0, 0),
            Some(State::Chat(s)) => (s.tensors_loaded, s.tensors_total),
            Some(State::Encoder(s)) => (s.tensors_loaded, s.tensors_total()),
        };
        let file_bytes = self.reader.header().map(GgufHeader::data_end);
        LoadProgress { bytes_received: self.bytes_received, tensors_loaded: loaded, tensors_total: total, file_bytes }
    }

    /// Ends the stream (an incomplete file is an error naming the tensor) and builds the chat
    /// model; an embedding model is `invalid_option` (`finish_any` takes both).
    pub async fn finish(self) -> Result<Model, ModelError> {
        self.finish_any().await?.into_chat()
    }

    /// Ends the stream and builds the model, whichever kind the file holds.
    pub async fn finish_any(self) -> Result<LoadedModel, ModelError> {
        self.reader.finish()?;
        self.shards.as_ref().map(ShardSequence::finish).transpose()?;
        match (self.state.ok_or_else(|| bad_model("empty file"))?, &self.target) {
            (State::Chat(loading), target) => {
                let pooling = loading.pooling;
                // An embedding model runs one input at a time: one KV cache, as its estimate says.
                let options = if pooling.is_some() { LoadOptions { slots: 1, ..self.options.clone() } } else { self.options.clone() };
                let model = match target {
                    Target::Gpu(gpu) => loading.into_model(gpu, &options).await?,
                    Target::Cpu => loading.into_cpu_model(&options)?,
                };
                Ok(match pooling {
                    Some(pooling) => {
                        let tokenizer = model.tokenizer().clone();
                        LoadedModel::Embedding(Box::new(Embedder::decoder(DecoderEmbedder::new(model, pooling), tokenizer)))
                    }
                    None => LoadedModel::Chat(Box::new(model)),
                })
            }
            (State::Encoder(loading), _) => Ok(LoadedModel::Embedding(Box::new(loading.into_embedder().await?))),
        }
    }
}

/// One of a layer's Q, K and V, held for the fused upload.
struct QkvPart {
    name: String,
    ty: GgmlType,
    rows: usize,
    bytes: Vec<u8>,
}

impl Loading {
    /// From the model's first file. `gpu`: the checks of the GPU graph's fused kernels apply.
    /// `last`: no shard follows.
    fn new(header: &GgufHeader, gpu: bool, last: bool) -> Result<Self, ModelError> {
        let config = ModelConfig::from_header(header)?;
        let pooling = decoder_pooling(header)?;
        let vocabulary = Vocabulary::from_metadata(&header.metadata)?;
        if vocabulary.tokens.len() != config.vocab {
            return Err(bad_model(format!("tokenizer has {} tokens, the model {}", vocabulary.tokens.len(), config.vocab)));
        }
        let tokenizer = PendingTokenizer::new(vocabulary);
        let roles = RoleAssigner::new(&config);
        let mut loading = Self {
            tensors_total: roles.expected_count(),
            tensors_loaded: 0,
            config,
            pooling,
            tokenizer,
            roles,
            gpu,
            types: HashMap::new(),
            weights: HashMap::new(),
            tables: HashMap::new(),
            vectors: HashMap::new(),
            qkv_parts: HashMap::new(),
            split_qkv: HashSet::new(),
            cpu: CpuTensors::default(),
            flusher: UploadFlusher::default(),
        };
        loading.add_header(header, last)?;
        // The first header passed its checks: the tokenizer builds beside the tensors.
        loading.tokenizer = loading.tokenizer.start();
        Ok(loading)
    }

    /// The tensors of the next file's header (the first's, or a shard's): each one's shape, and
    /// on the GPU its type, checked before its bytes arrive. `last`: no shard follows, so the
    /// whole model's checks run.
    fn add_header(&mut self, header: &GgufHeader, last: bool) -> Result<(), ModelError> {
        let before = self.roles.roles().len();
        self.roles.add(&header.tensors)?;
        for (info, role) in header.tensors.iter().zip(self.roles.roles().get(before..).unwrap_or_default()) {
            let Some(role) = role else { continue };
            if self.gpu && !gpu_runs(role, info) {
                return Err(ModelError::UnsupportedQuant { tensor: info.name.clone(), ty: info.ggml_type.name().to_string() });
            }
            self.types.insert(role.role, info.ggml_type);
        }
        if last {
            self.roles.check_complete()?;
            self.check_fused_gate_up()?;
        }
        Ok(())
    }

    /// The GPU's fused SwiGLU kernel reads gate and up of one type.
    fn check_fused_gate_up(&self) -> Result<(), ModelError> {
        if !self.gpu || self.config.fused_gate_up_tensor {
            return Ok(());
        }
        for l in 0..self.config.n_layers {
            let types = [Role::Gate(l), Role::Up(l)].map(|r| self.types.get(&r).copied());
            if types[0] != types[1] {
                return Err(ModelError::UnsupportedQuant {
                    tensor: format!("blk.{l}.ffn_gate/ffn_up"),
                    ty: format!("mixed {types:?} (the fused SwiGLU kernel needs gate and up of one type)"),
                });
            }
        }
        Ok(())
    }

    fn add_tensor(&mut self, target: &Target, index: usize, info: &TensorInfo, bytes: &[u8]) -> Result<(), ModelError> {
        let Some(Some(e)) = self.roles.roles().get(index) else { return Ok(()) };
        let e = e.clone();
        self.tensors_loaded += 1;
        let ty = info.ggml_type;
        let gpu = match target {
            Target::Gpu(gpu) => gpu,
            _ => return self.cpu.add::<Quantized>(e.role, ty, bytes, e.rows, e.cols),
        };
        match e.role {
            Role::Q(l) | Role::K(l) | Role::V(l) => {
                let slot = match e.role {
                    Role::Q(_) => 0,
                    Role::K(_) => 1,
                    _ => 2,
                };
                let parts = self.qkv_parts.entry(l).or_default();
                parts[slot] = Some(QkvPart { name: e.name.clone(), ty, rows: e.rows, bytes: bytes.to_vec() });
                if let [Some(q), Some(k), Some(v)] = parts {
                    let cols = self.config.hidden;
                    if q.ty == k.ty && k.ty == v.ty {
                        let fused = [q.bytes.as_slice(), &k.bytes, &v.bytes].concat();
                        let w =
                            WeightTensor::from_gguf_bytes(gpu, &format!("blk.{l}.attn_qkv"), ty, self.config.qkv_width(), cols, &fused)?;
                        self.weights.insert(Role::Q(l), w);
                    } else {
                        // Types that differ cannot share one matrix: three products.
                        for (role, part) in [(Role::Q(l), &*q), (Role::K(l), &*k), (Role::V(l), &*v)] {
                            let w = WeightTensor::from_gguf_bytes(gpu, &part.name, part.ty, part.rows, cols, &part.bytes)?;
                            self.weights.insert(role, w);
                        }
                        self.split_qkv.insert(l);
                    }
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
        self.flusher.uploaded(gpu, bytes.len());
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
        let rope = c.rope_config(crate::tensors::rope_factors_role(&c, max_ctx).map(&mut take_vector).transpose()?)?;
        let weights = Weights { embedding, output_norm: upload("output_norm", take_vector(Role::OutputNorm)?)?, output, layers };
        let max_chunk = options.max_chunk.min(max_ctx);
        if options.slots == 0 || options.slots > max_chunk.min(MAX_SLOTS) {
            let reason = format!("{}: 1 to {}", options.slots, max_chunk.min(MAX_SLOTS));
            return Err(ModelError::InvalidOption { name: "slots", reason });
        }
        let size = GraphSize { max_ctx, max_chunk, kv: options.kv_cache, slots: options.slots };
        let graph = Graph::new(gpu, c, weights, &rope, size).await?;
        // The last uploads' staging memory is given back before the first step.
        gpu.flush_writes();
        // A buffer the device failed to allocate, or a loss during the upload, fails the load here
        // rather than the first request.
        gpu.check_faults()?;
        Model::new(graph, self.tokenizer.finish()?)
    }
}

impl Loading {
    fn into_cpu_model(self, options: &LoadOptions) -> Result<Model, ModelError> {
        let max_ctx = context_length(&self.config, options.context_length)?;
        if options.max_chunk == 0 {
            return Err(ModelError::InvalidOption { name: "max_chunk", reason: "must be at least 1".into() });
        }
        let forward = CpuForward::<Quantized>::from_tensors(self.config, self.cpu, max_ctx, options.kv_cache)?;
        Model::new_cpu(CpuBackend::new(forward, options.max_chunk.min(max_ctx), options.kv_cache), self.tokenizer.finish()?)
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
