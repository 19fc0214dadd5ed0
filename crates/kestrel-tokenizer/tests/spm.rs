//! SentencePiece ("llama") vocabularies: a tiny hand-made vocabulary checked against
//! what llama.cpp's `llm_tokenizer_spm` does (score-ordered merges, `▁` for spaces,
//! a space prefixed to every text fragment, `<0xXX>` byte fallback).

use kestrel_tokenizer::{SpecialTokenIds, StreamDecoder, TokenType, Tokenizer, Vocabulary, VocabularyModel};

fn vocab() -> Vocabulary {
    let mut tokens: Vec<(String, f32, TokenType)> =
        vec![("<unk>".into(), 0.0, TokenType::Unknown), ("<s>".into(), 0.0, TokenType::Control), ("</s>".into(), 0.0, TokenType::Control)];
    for b in 0..=255u8 {
        tokens.push((format!("<0x{b:02X}>"), 0.0, TokenType::Byte));
    }
    for (t, s) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -3.0),
        ("l", -4.0),
        ("o", -5.0),
        ("i", -6.0),
        ("ll", -7.0),
        ("▁h", -8.0),
        ("▁he", -9.0),
        ("llo", -10.0),
        ("▁hello", -11.0),
        ("▁hi", -12.0),
        ("he", -20.0),
    ] {
        tokens.push((t.into(), s, TokenType::Normal));
    }
    Vocabulary {
        model: VocabularyModel::Llama,
        pre: None,
        tokens: tokens.iter().map(|t| t.0.clone()).collect(),
        scores: tokens.iter().map(|t| t.1).collect(),
        token_types: tokens.iter().map(|t| t.2).collect(),
        merges: Vec::new(),
        ids: SpecialTokenIds { bos: Some(1), eos: Some(2), unk: Some(0), ..SpecialTokenIds::default() },
        model_name: None,
        add_bos: None,
        add_eos: None,
        add_space_prefix: None,
        lowercase: None,
        strip_accents: None,
        chat_template: None,
    }
}

#[test]
fn spm_encode_decode() {
    let t = Tokenizer::from_vocabulary(&vocab()).unwrap();
    let id = |s: &str| t.token_to_id(s).unwrap();
    assert!(t.add_bos(), "SentencePiece vocabularies add BOS by default, as in llama.cpp");
    // "▁hello": ▁h (-8) > ll (-7)? no: ll has the higher score and merges first.
    assert_eq!(t.encode("hello", true).unwrap(), vec![1, id("▁hello")]);
    assert_eq!(t.encode("hello", false).unwrap(), vec![id("▁hello")]);
    assert_eq!(t.decode(&[id("▁hello")]).unwrap(), "hello");
    assert_eq!(t.decode(&[1, id("▁hello")]).unwrap(), "<s> hello");
    // A space is prefixed to the fragment after a special token as well.
    assert_eq!(t.encode("<s>hi", false).unwrap(), vec![1, id("▁hi")]);
    // Unknown characters fall back to bytes.
    let ids = t.encode("hé", false).unwrap();
    assert_eq!(ids, vec![id("▁h"), id("<0xC3>"), id("<0xA9>")]);
    assert_eq!(t.decode(&ids).unwrap(), "hé");
    let mut sd = StreamDecoder::new();
    assert_eq!(sd.push(&t, ids[0]).unwrap(), "h");
    assert_eq!(sd.push(&t, ids[1]).unwrap(), "");
    assert_eq!(sd.push(&t, ids[2]).unwrap(), "é");
    assert_eq!(sd.finish(), "");
    // Output held to a grammar keeps the first token's space the grammar matched.
    let mut verbatim = StreamDecoder::verbatim();
    assert_eq!(verbatim.push(&t, id("▁hello")).unwrap(), " hello");
    assert_eq!(t.eog_ids(), &[2]);
}

#[test]
fn spm_without_scores_is_an_error() {
    let mut v = vocab();
    v.scores.clear();
    assert!(Tokenizer::from_vocabulary(&v).is_err());
}
