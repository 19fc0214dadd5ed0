//! Reading a [`Vocabulary`] from GGUF metadata (kestrel-gguf).

use kestrel_gguf::{Metadata, MetadataValue};

use crate::error::{Result, TokenizerError};
use crate::vocab::{SpecialTokenIds, TokenType, Vocabulary, VocabularyModel};

fn meta_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Metadata(e.to_string())
}

impl Vocabulary {
    /// Reads the `tokenizer.*` keys. A special-token id outside the vocabulary is ignored
    /// (llama.cpp warns and keeps its default, as for an absent key).
    pub fn from_metadata(md: &Metadata) -> Result<Self> {
        let model_name = md.get_str("tokenizer.ggml.model").map_err(meta_err)?.ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?;
        let model = match model_name {
            "gpt2" => VocabularyModel::Gpt2,
            "llama" => VocabularyModel::Llama,
            "bert" => VocabularyModel::Bert,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let pre = md.get_str("tokenizer.ggml.pre").map_err(meta_err)?.map(str::to_string);
        let tokens: Vec<String> = md
            .get_string_array("tokenizer.ggml.tokens")
            .map_err(meta_err)?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?
            .into_iter()
            .map(str::to_string)
            .collect();
        let n = tokens.len();
        let token_types = match md.get_i32_array("tokenizer.ggml.token_type").map_err(meta_err)? {
            Some(t) => {
                if t.len() != n {
                    return Err(TokenizerError::InvalidVocabulary(format!(
                        "tokenizer.ggml.token_type has {} entries for {} tokens",
                        t.len(),
                        n
                    )));
                }
                t.into_iter().map(TokenType::from_i32).collect()
            }
            None => Vec::new(),
        };
        let scores = match md.get("tokenizer.ggml.scores") {
            None => Vec::new(),
            Some(MetadataValue::Array(a)) => {
                let s = a
                    .iter()
                    .map(|v| match v {
                        MetadataValue::F32(x) => Ok(*x),
                        MetadataValue::F64(x) => Ok(*x as f32),
                        _ => Err(TokenizerError::Metadata("tokenizer.ggml.scores is not an array of floats".into())),
                    })
                    .collect::<Result<Vec<f32>>>()?;
                if s.len() != n {
                    return Err(TokenizerError::InvalidVocabulary(format!(
                        "tokenizer.ggml.scores has {} entries for {} tokens",
                        s.len(),
                        n
                    )));
                }
                s
            }
            Some(_) => return Err(TokenizerError::Metadata("tokenizer.ggml.scores is not an array".into())),
        };
        let merges = md
            .get_string_array("tokenizer.ggml.merges")
            .map_err(meta_err)?
            .map(|m| m.into_iter().map(str::to_string).collect())
            .unwrap_or_default();
        let id = |key: &str| -> Result<Option<u32>> { Ok(md.get_u32(key).map_err(meta_err)?.filter(|&i| (i as usize) < n)) };
        // llama.cpp's ids for a file that names none (or one out of range): SentencePiece's
        // <unk> <s> </s> at 0, 1, 2, GPT-2's <|endoftext|> at 11 for both ends, and BERT's
        // [PAD] [UNK] [CLS] [SEP] at 0, 100, 101, 102 (no EOS).
        let (bos_default, eos_default, unk_default, sep_default, pad_default) = match model {
            VocabularyModel::Llama => (Some(1), Some(2), Some(0), None, None),
            VocabularyModel::Gpt2 => (Some(11), Some(11), None, None, None),
            VocabularyModel::Bert => (Some(101), None, Some(100), Some(102), Some(0)),
        };
        let in_range = |d: Option<u32>| d.filter(|&i| (i as usize) < n);
        Ok(Vocabulary {
            model,
            pre,
            scores,
            token_types,
            merges,
            ids: SpecialTokenIds {
                bos: id("tokenizer.ggml.bos_token_id")?.or(in_range(bos_default)),
                eos: id("tokenizer.ggml.eos_token_id")?.or(in_range(eos_default)),
                eot: id("tokenizer.ggml.eot_token_id")?,
                eom: id("tokenizer.ggml.eom_token_id")?,
                unk: id("tokenizer.ggml.unknown_token_id")?.or(in_range(unk_default)),
                pad: id("tokenizer.ggml.padding_token_id")?.or(in_range(pad_default)),
                sep: id("tokenizer.ggml.seperator_token_id")?.or(in_range(sep_default)),
                // The deprecated keys are read after the new ones in llama.cpp, so they win.
                fim_pre: id("tokenizer.ggml.prefix_token_id")?.or(id("tokenizer.ggml.fim_pre_token_id")?),
                fim_suf: id("tokenizer.ggml.suffix_token_id")?.or(id("tokenizer.ggml.fim_suf_token_id")?),
                fim_mid: id("tokenizer.ggml.middle_token_id")?.or(id("tokenizer.ggml.fim_mid_token_id")?),
                fim_pad: id("tokenizer.ggml.fim_pad_token_id")?,
                fim_rep: id("tokenizer.ggml.fim_rep_token_id")?,
                fim_sep: id("tokenizer.ggml.fim_sep_token_id")?,
            },
            model_name: md.get_str("general.name").map_err(meta_err)?.map(str::to_string),
            add_bos: md.get_bool("tokenizer.ggml.add_bos_token").map_err(meta_err)?,
            add_eos: md.get_bool("tokenizer.ggml.add_eos_token").map_err(meta_err)?,
            add_space_prefix: md.get_bool("tokenizer.ggml.add_space_prefix").map_err(meta_err)?,
            lowercase: md.get_bool("tokenizer.ggml.normalizer.lowercase").map_err(meta_err)?,
            strip_accents: md.get_bool("tokenizer.ggml.normalizer.strip_accents").map_err(meta_err)?,
            chat_template: md.get_str("tokenizer.chat_template").map_err(meta_err)?.map(str::to_string),
            tokens,
        })
    }
}
