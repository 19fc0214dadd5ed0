//! Bad model files: each gives its clear error (with a stable code) and nothing panics.

mod common;

use kestrel_engine::generation::Generator;
use kestrel_gguf::{GgmlType, GgufWriter, Metadata, MetadataValue, TensorSpec};
use kestrel_model::{LoadOptions, ModelError, ModelLoader};

fn load_bytes(bytes: &[u8], chunk: usize) -> Result<kestrel_model::Model, ModelError> {
    let gpu = common::gpu();
    let mut loader = ModelLoader::new(&gpu, LoadOptions { context_length: Some(64), ..LoadOptions::default() });
    for piece in bytes.chunks(chunk.max(1)) {
        loader.push(piece)?;
    }
    pollster::block_on(loader.finish())
}

fn model_bytes() -> Vec<u8> {
    std::fs::read(common::default_model_path()).expect("read the default model")
}

#[test]
fn truncated_file_names_the_incomplete_tensor() {
    let bytes = model_bytes();
    let err = load_bytes(&bytes[..bytes.len() / 2], 1 << 20).err().expect("a truncated file must not load");
    assert_eq!(err.code(), "bad_model", "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn garbage_and_empty_files_are_bad_models() {
    for bytes in [b"not a gguf file at all, just text".to_vec(), Vec::new(), vec![0u8; 4096]] {
        let err = load_bytes(&bytes, 7).err().expect("garbage must not load");
        assert_eq!(err.code(), "bad_model", "{err}");
    }
}

#[test]
fn corrupted_header_is_a_bad_model_not_a_panic() {
    let mut bytes = model_bytes();
    bytes.truncate(4 << 20);
    // Flip bytes across the metadata: every outcome must be an error, never a panic.
    for offset in (8..4096).step_by(97) {
        let mut corrupt = bytes.clone();
        corrupt[offset] ^= 0xff;
        if load_bytes(&corrupt, 1 << 20).is_ok() {
            panic!("a 4 MiB prefix loaded as a model (flipped byte {offset})");
        }
    }
}

/// The default model's header with some tensors' types replaced, and no tensor data: a file
/// refused from its header alone.
fn header_with_types(retype: impl Fn(&str) -> Option<GgmlType>) -> Vec<u8> {
    header_with(|_, specs| {
        for t in specs.iter_mut() {
            t.ggml_type = retype(&t.name).unwrap_or(t.ggml_type);
        }
    })
}

/// The default model's header as `edit` changes its metadata and tensor list, without data.
fn header_with(edit: impl Fn(&mut Metadata, &mut Vec<TensorSpec>)) -> Vec<u8> {
    let (header, _) = common::default_model_file();
    let mut metadata = header.metadata.clone();
    let mut specs: Vec<TensorSpec> =
        header.tensors.iter().map(|t| TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ggml_type: t.ggml_type }).collect();
    edit(&mut metadata, &mut specs);
    let mut header_bytes = Vec::new();
    // The writer emits the header on creation.
    drop(GgufWriter::new(&mut header_bytes, &metadata, &specs).expect("write a header"));
    header_bytes
}

/// RoPE variants Kestrel does not implement would silently give wrong text: refused, saying why;
/// malformed RoPE factors and scaling are bad models.
#[test]
fn unsupported_or_malformed_rope_scaling_is_refused() {
    let longrope = header_with(|md, _| {
        md.set("llama.rope.scaling.type", MetadataValue::String("longrope".into()));
        md.set("llama.rope.scaling.factor", MetadataValue::F32(4.0));
    });
    let negative = header_with(|md, _| md.set("llama.rope.scaling.factor", MetadataValue::F32(-2.0)));
    let misshapen = header_with(|_, specs| {
        specs.insert(0, TensorSpec { name: "rope_freqs.weight".into(), dims: vec![16], ggml_type: GgmlType::F32 });
    });
    for (what, bytes, says) in [
        ("longrope", longrope, "\"longrope\" with factor 4 is not supported"),
        ("negative factor", negative, "factor -2 is out of range"),
        ("16 factors for 32 pairs", misshapen, "rope_freqs.weight"),
    ] {
        let err = load_bytes(&bytes, 1 << 20).err().unwrap_or_else(|| panic!("{what} must be refused"));
        assert_eq!(err.code(), "bad_model", "{what}: {err}");
        assert!(err.to_string().contains(says), "{what}: {err}");
    }
    // Factors that would divide by zero are caught once their data arrives.
    let mut variant = common::ROPE_VARIANTS[0].clone();
    variant.factors = Some(|i| if i == 7 { 0.0 } else { 1.0 });
    variant.reference_dir = "reference-rope-zero-factor"; // names its file
    let err =
        load_bytes(&std::fs::read(common::rope_variant(&variant)).expect("read"), 1 << 20).err().expect("a zero factor must be refused");
    assert!(err.to_string().contains("finite positive"), "{err}");
}

/// A head size the attention kernels are not built for (4 heads of 144 over the default model's
/// 576) is refused from the header, before any weight is fetched.
#[test]
fn unsupported_head_dim_is_refused_from_the_header() {
    let bytes = header_with(|md, _| {
        md.set("llama.attention.head_count", MetadataValue::U32(4));
        md.set("llama.attention.head_count_kv", MetadataValue::U32(2));
        md.set("llama.attention.key_length", MetadataValue::U32(144));
    });
    let err = load_bytes(&bytes, 1 << 20).err().expect("head_dim 144 must be refused");
    assert_eq!(err.code(), "bad_model", "{err}");
    assert!(err.to_string().contains("unsupported architecture") && err.to_string().contains("head_dim 144"), "{err}");
}

/// An architecture Kestrel does not run is refused from the header, naming it and the ones it runs.
#[test]
fn unknown_architecture_is_refused_from_the_header() {
    let bytes = header_with(|md, _| md.set("general.architecture", MetadataValue::String("mamba".into())));
    let err = load_bytes(&bytes, 1 << 20).err().expect("an unknown architecture must be refused");
    assert_eq!(err.code(), "bad_model", "{err}");
    assert!(err.to_string().contains("\"mamba\"") && err.to_string().contains("qwen3"), "{err}");
}

#[test]
fn unsupported_tensor_type_is_refused_before_upload() {
    // An i-quant, which no GPU kernel reads.
    let bytes = header_with_types(|name| (name == "blk.3.ffn_down.weight").then_some(GgmlType::IQ2_XXS));
    let err = load_bytes(&bytes, 1 << 20).err().expect("IQ2_XXS must be refused");
    assert_eq!(err.code(), "unsupported_quant", "{err}");
    assert!(err.to_string().contains("blk.3.ffn_down.weight") && err.to_string().contains("IQ2_XXS"), "{err}");
}

#[test]
fn gate_and_up_of_different_types_are_refused_before_upload() {
    let bytes = header_with_types(|name| (name == "blk.5.ffn_up.weight").then_some(GgmlType::Q8_0));
    let err = load_bytes(&bytes, 1 << 20).err().expect("mixed gate/up must be refused");
    assert_eq!(err.code(), "unsupported_quant", "{err}");
    assert!(err.to_string().contains("blk.5.ffn_gate/ffn_up"), "{err}");
}

/// A chat template is code from whoever made the file: one that runs away, or one that makes a
/// namespace hold itself (printing it overflowed the stack, which in the browser trapped the
/// engine), fails the request with the `template` code and leaves the model working; one that
/// does not compile is a bad model.
#[test]
fn hostile_chat_template_fails_the_request_not_the_model() {
    use kestrel_engine::generation::{GenerateOptions, Prompt};
    use kestrel_model::ChatMessage;
    let runaway = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let cycle = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns %}{% endfor %}{{ ns }}";
    let cases = [
        (runaway, "synthetic-qwen3-runaway-template.gguf", "fuel"),
        (cycle, "synthetic-qwen3-namespace-cycle-template.gguf", "contains the namespace"),
    ];
    for (template, file, says) in cases {
        let bytes = common::synthetic::with_template_bytes(&common::synthetic::QWEN3_F32, template);
        // The browser suite serves the same file (./build.sh copies it from here).
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(file);
        std::fs::write(&path, &bytes).expect("write the hostile-template model for the browser suite");
        let mut model = Generator::new(load_bytes(&bytes, 1 << 20).expect("the file itself is sound"));
        let err = model.encode(&Prompt::Chat(&[ChatMessage::new("user", "hi")])).expect_err("a hostile template must fail");
        assert_eq!(err.code(), "template", "{file}: {err}");
        assert!(err.to_string().contains(says), "{file}: {err}");
        // The same model still answers a plain-text prompt.
        let prompt = model.encode(&Prompt::Text("Hello")).expect("text prompts need no template");
        let options = GenerateOptions { max_tokens: 3, ignore_eos: true, ..GenerateOptions::greedy() };
        let out = pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).expect("generate after the failed render");
        assert_eq!(out.tokens.len(), 3, "{file}");
    }

    let err = load_bytes(&common::synthetic::with_template_bytes(&common::synthetic::QWEN3_F32, "{% for %}"), 1 << 20)
        .err()
        .expect("a template that does not compile");
    assert_eq!(err.code(), "bad_model", "{err}");
    assert!(err.to_string().contains("chat template"), "{err}");
}

/// A split model's shards (`kestrel_gguf::split_model`) pushed out of order, incomplete or past
/// the last: each a `bad_model` naming what is wrong, before any model is built.
#[test]
fn shards_out_of_order_missing_or_extra_are_bad_models() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bad-shards");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make the shards' folder");
    let prefix = dir.join("model").display().to_string();
    let shards = kestrel_gguf::split_model(&common::default_model_path(), &prefix, kestrel_gguf::SplitLimit::Bytes(40_000_000), false)
        .expect("split");
    let shards: Vec<Vec<u8>> = shards.iter().map(|p| std::fs::read(p).expect("read a shard")).collect();
    assert_eq!(shards.len(), 3);
    // The CPU backend: the same loader and checks, without the GPU's upload.
    let load = |order: &[usize]| -> Result<kestrel_model::Model, ModelError> {
        let mut loader = ModelLoader::new_cpu(LoadOptions { context_length: Some(64), ..LoadOptions::default() });
        for (k, &i) in order.iter().enumerate() {
            if k > 0 {
                loader.next_shard()?;
            }
            loader.push(&shards[i])?;
        }
        pollster::block_on(loader.finish())
    };
    let expect_bad = |order: &[usize], says: &str| {
        let err = load(order).err().unwrap_or_else(|| panic!("shards {order:?} must not load"));
        assert_eq!(err.code(), "bad_model", "{err}");
        assert!(err.to_string().contains(says), "shards {order:?}: {err}");
    };
    expect_bad(&[0, 2, 1], "shard 2 of 3 is shard 3 of 3");
    expect_bad(&[0, 1], "only 2 of the model's 3 shards arrived");
    expect_bad(&[1, 0, 2], "starts at shard 2 of 3");
    expect_bad(&[0, 1, 2, 2], "after the last of 3");
    // A shard's header then an end in its data: the truncation names the tensor.
    let mut loader = ModelLoader::new_cpu(LoadOptions::default());
    loader.push(&shards[0]).expect("first shard");
    loader.next_shard().expect("next shard");
    loader.push(&shards[1][..shards[1].len() / 2]).expect("half a shard");
    let err = loader.next_shard().expect_err("an incomplete shard must not end");
    assert!(err.code() == "bad_model" && err.to_string().contains("truncated"), "{err}");
    // In order, they load.
    load(&[0, 1, 2]).expect("the shards in order");
}
