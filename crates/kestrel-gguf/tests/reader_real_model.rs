//! The reader against the default model; ground truth from the `gguf` PyPI package.

mod common;

use std::collections::BTreeMap;

use common::{model_bytes, model_path, stream_collect};
use kestrel_gguf::{parse_header, read_file, GgmlType, GgufHeader, MetadataValue};
use rand::{Rng, SeedableRng};

fn header() -> GgufHeader {
    parse_header(model_bytes()).expect("parse default model")
}

#[test]
fn real_model_header_matches_gguf_python() {
    let h = header();
    assert_eq!(h.version, 3);
    assert_eq!(h.alignment, 32);
    assert_eq!(h.data_start, 1_785_664);
    assert_eq!(h.metadata.len(), 33);
    assert_eq!(h.tensors.len(), 272);
    let m = &h.metadata;
    assert_eq!(m.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(m.get_u32("llama.block_count").unwrap(), Some(30));
    assert_eq!(m.get_u64("llama.embedding_length").unwrap(), Some(576));
    assert_eq!(m.get_u32("llama.attention.head_count_kv").unwrap(), Some(3));
    assert_eq!(m.get_f32("llama.rope.freq_base").unwrap(), Some(100000.0));
    assert_eq!(m.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(), Some(1e-5));
    assert_eq!(m.get_u32("general.file_type").unwrap(), Some(3));
    assert_eq!(m.get_bool("tokenizer.ggml.add_bos_token").unwrap(), Some(false));
    assert_eq!(m.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
    assert_eq!(m.get_u32("tokenizer.ggml.eos_token_id").unwrap(), Some(2));
    let tokens = m.get_string_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(m.get_string_array("tokenizer.ggml.merges").unwrap().unwrap().len(), 48900);
    assert_eq!(m.get_i32_array("tokenizer.ggml.token_type").unwrap().unwrap().len(), 49152);
    assert_eq!(m.get_string_array("general.languages").unwrap(), Some(vec!["en"]));
    assert!(m.get_str("tokenizer.chat_template").unwrap().unwrap().contains("<|im_start|>"));
    assert!(matches!(m.get("general.quantization_version"), Some(MetadataValue::U32(2))));
    // Keys keep file order.
    assert_eq!(m.iter().next().map(|(k, _)| k), Some("general.architecture"));

    let mut counts = BTreeMap::new();
    for t in &h.tensors {
        *counts.entry(t.ggml_type.name()).or_insert(0) += 1;
    }
    assert_eq!(counts, BTreeMap::from([("F32", 61), ("Q4_1", 210), ("Q8_0", 1)]));
    let embd = &h.tensors[0];
    assert_eq!(embd.name, "token_embd.weight");
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!((embd.offset, embd.n_bytes(), embd.n_elements()), (0, 30_081_024, 576 * 49152));
    let down = h.tensors.iter().find(|t| t.name == "blk.0.ffn_down.weight").unwrap();
    assert_eq!((down.dims.as_slice(), down.ggml_type), ([1536, 576].as_slice(), GgmlType::Q4_1));
    assert_eq!((down.offset + h.data_start, down.n_bytes()), (31_868_992, 552_960));
    h.check_file_len(model_bytes().len() as u64).unwrap();
    // The header alone tells the download's size: the file ends where its last tensor does.
    assert_eq!(h.data_end(), model_bytes().len() as u64);
}

/// Streams the model with the given chunk sizes and checks every tensor against the
/// one-shot parse, comparing in the callback so no copy of the model is kept.
fn check_stream(sizes: &mut dyn FnMut(u64) -> usize) {
    let bytes = model_bytes();
    let expected = header();
    let order = expected.data_order();
    let mut reader = kestrel_gguf::GgufStreamReader::new();
    let mut seen = 0usize;
    let mut got_header = false;
    let mut pos = 0usize;
    while pos < bytes.len() {
        let n = sizes(pos as u64).clamp(1, bytes.len() - pos);
        reader
            .push(&bytes[pos..pos + n], &mut |event| {
                match event {
                    kestrel_gguf::StreamEvent::Header(h) => {
                        assert_eq!(h, &expected);
                        got_header = true;
                    }
                    kestrel_gguf::StreamEvent::Tensor { index, info, bytes: data } => {
                        assert_eq!(index, order[seen], "tensors must come in offset order");
                        assert_eq!(info, &expected.tensors[index]);
                        assert!(data == expected.tensor_bytes(index, bytes).unwrap(), "tensor {index} bytes differ");
                        seen += 1;
                    }
                }
                Ok(())
            })
            .unwrap();
        pos += n;
    }
    reader.finish().unwrap();
    assert!(got_header);
    assert_eq!(seen, 272);
}

#[test]
fn real_model_stream_chunk_4096() {
    check_stream(&mut |_| 4096);
}

#[test]
fn real_model_stream_chunk_7() {
    check_stream(&mut |_| 7);
}

#[test]
fn real_model_stream_random_chunks() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    check_stream(&mut |_| match rng.random_range(0..4) {
        0 => rng.random_range(1..16),
        1 => rng.random_range(1..5000),
        _ => rng.random_range(1..3_000_000),
    });
}

#[test]
fn real_model_stream_chunk_1_through_header_and_first_mib() {
    // Byte by byte over the header and the first MiB of the embedding (so it is assembled
    // across chunks), then large chunks.
    let first_tensors_end = 1_785_664 + (1 << 20);
    check_stream(&mut |pos| if pos < first_tensors_end { 1 } else { 1 << 20 });
}

#[test]
fn real_model_read_file_matches_one_shot() {
    let (h, tensors) = read_file(&model_path()).unwrap();
    assert_eq!(h, header());
    for (i, data) in tensors.iter().enumerate() {
        assert!(data.as_slice() == h.tensor_bytes(i, model_bytes()).unwrap(), "tensor {i}");
    }
}

#[test]
fn real_model_header_by_small_random_chunks_collects_same_header() {
    // Header delivery alone, on the header plus a little data, through the shared helper.
    let prefix_end = 1_785_664 + 30_081_024;
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let got = stream_collect(&model_bytes()[..prefix_end], &mut || rng.random_range(1..64));
    // The prefix ends right after the first tensor, so finish() reports the second one.
    let err = got.err().unwrap();
    assert!(matches!(err, kestrel_gguf::GgufError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains("blk.0.attn_norm.weight"), "{err}");
}
