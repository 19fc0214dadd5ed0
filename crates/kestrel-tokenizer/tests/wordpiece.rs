//! WordPiece ("bert") vocabularies: a tiny hand-made vocabulary in llama.cpp's phantom-space form
//! checked against what llama.cpp's `llm_tokenizer_wpm_session` does (BERT word splitting,
//! lowercasing and accent stripping, greedy longest pieces, a word that cannot be covered is one
//! [UNK], `[CLS]` ... `[SEP]` with `add_special`) and how its `llama_detokenize` cleans up spaces.

use kestrel_tokenizer::{SpecialTokenIds, TokenType, Tokenizer, Vocabulary, VocabularyModel};

const CONTROL: &[&str] = &["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
const PIECES: &[&str] = &[
    "▁hello",
    "▁world",
    "▁play",
    "▁playing",
    "ing",
    "s",
    "▁,",
    "▁!",
    "▁.",
    "▁'",
    "▁t",
    "▁s",
    "▁don",
    "▁it",
    "▁cafe",
    "▁日",
    "▁本",
    "▁[",
    "▁]",
    "▁sep",
    "▁$",
    "5",
    "▁5",
    "▁€",
];

fn vocab(lowercase: Option<bool>, strip_accents: Option<bool>) -> Vocabulary {
    let tokens: Vec<String> = CONTROL.iter().chain(PIECES).map(|t| t.to_string()).collect();
    let token_types = (0..tokens.len()).map(|i| if i < CONTROL.len() { TokenType::Control } else { TokenType::Normal }).collect();
    Vocabulary {
        model: VocabularyModel::Bert,
        pre: None,
        tokens,
        scores: Vec::new(),
        token_types,
        merges: Vec::new(),
        ids: SpecialTokenIds { bos: Some(2), eos: Some(3), unk: Some(1), sep: Some(3), pad: Some(0), ..SpecialTokenIds::default() },
        model_name: None,
        add_bos: None,
        add_eos: None,
        add_space_prefix: None,
        lowercase,
        strip_accents,
        chat_template: None,
    }
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_vocabulary(&vocab(Some(true), None)).unwrap()
}

fn pieces(t: &Tokenizer, text: &str) -> Vec<String> {
    t.encode_with(text, false, true).unwrap().into_iter().map(|id| t.piece(id).unwrap()).collect()
}

#[test]
fn words_split_at_whitespace_punctuation_and_cjk() {
    let t = tokenizer();
    assert_eq!(pieces(&t, "Hello,World!"), [" hello", " ,", " world", " !"]);
    assert_eq!(pieces(&t, "  hello\t\n world  "), [" hello", " world"]);
    assert_eq!(pieces(&t, "日本"), [" 日", " 本"]);
    // ASCII symbols are words of their own, other symbols stay in the word.
    assert_eq!(pieces(&t, "$5"), [" $", " 5"]);
    assert_eq!(pieces(&t, "€5"), [" €", "5"]);
    assert_eq!(t.encode_with("", true, true).unwrap(), [2, 3]);
    assert_eq!(t.encode_with(" \t ", false, true).unwrap(), Vec::<u32>::new());
}

#[test]
fn longest_pieces_and_whole_word_unknown() {
    let t = tokenizer();
    assert_eq!(pieces(&t, "playing"), [" playing"]);
    assert_eq!(pieces(&t, "plays"), [" play", "s"]);
    // "▁play" matches but nothing covers "ers": the whole word is one [UNK], nothing partial.
    assert_eq!(pieces(&t, "players hello"), ["[UNK]", " hello"]);
    // A continuation piece cannot start a word.
    assert_eq!(pieces(&t, "ing"), ["[UNK]"]);
}

#[test]
fn lowercase_and_accent_stripping_follow_the_normalizer_keys() {
    let t = tokenizer();
    assert_eq!(pieces(&t, "CAFÉ Café cafe\u{301}"), [" cafe", " cafe", " cafe"]);
    // Control characters and U+FFFD are dropped, a zero-width joiner too (it is a format character).
    assert_eq!(pieces(&t, "he\u{0}l\u{FFFD}lo wor\u{200D}ld"), [" hello", " world"]);
    let cased = Tokenizer::from_vocabulary(&vocab(None, None)).unwrap();
    assert_eq!(pieces(&cased, "Hello hello café"), ["[UNK]", " hello", "[UNK]"]);
    let keep_accents = Tokenizer::from_vocabulary(&vocab(Some(true), Some(false))).unwrap();
    assert_eq!(pieces(&keep_accents, "CAFÉ CAFE"), ["[UNK]", " cafe"]);
}

#[test]
fn special_tokens_and_add_special() {
    let t = tokenizer();
    assert!(t.add_bos() && t.add_eos());
    assert_eq!((t.bos_id(), t.sep_id()), (Some(2), Some(3)));
    let hello = t.token_to_id("▁hello").unwrap();
    assert_eq!(t.encode_with("hello", true, true).unwrap(), [2, hello, 3]);
    assert_eq!(t.encode_with("[SEP]hello", true, true).unwrap(), [2, 3, hello, 3]);
    assert_eq!(pieces(&t, "hello [SEP]"), [" hello", "[SEP]"]);
    // Without special-token parsing "[SEP]" is text, lowercased like any other.
    let sep_text: Vec<String> = t.encode_with("[SEP]", false, false).unwrap().into_iter().map(|id| t.piece(id).unwrap()).collect();
    assert_eq!(sep_text, [" [", " sep", " ]"]);
    // llama.cpp appends [SEP] whatever add_eos_token says, and only then is it EOS here.
    let mut v = vocab(Some(true), None);
    v.add_eos = Some(false);
    v.ids.eos = None;
    let t = Tokenizer::from_vocabulary(&v).unwrap();
    assert_eq!(t.encode_with("hello", true, true).unwrap(), [2, hello, 3]);
    assert!(!t.add_eos());
}

#[test]
fn decode_keeps_the_first_space_and_cleans_up_like_llama_cpp() {
    let t = tokenizer();
    let ids = t.encode_with("Hello , world ! don ' t it ' s .", false, true).unwrap();
    assert_eq!(t.decode(&ids).unwrap(), " hello, world! don't it's.");
    let ids = t.encode_with("[CLS] hello [SEP]", false, true).unwrap();
    assert_eq!(t.decode(&ids).unwrap(), "[CLS] hello[SEP]");
}

#[test]
fn a_vocabulary_without_unknown_token_reports_uncoverable_words() {
    let mut v = vocab(Some(true), None);
    v.ids.unk = None;
    let t = Tokenizer::from_vocabulary(&v).unwrap();
    assert_eq!(t.encode_with("hello", false, true).unwrap(), [t.token_to_id("▁hello").unwrap()]);
    let err = t.encode_with("hello zzz", false, true).unwrap_err().to_string();
    assert!(err.contains("zzz"), "{err}");
}

#[test]
fn exports_a_hugging_face_wordpiece_tokenizer() {
    let json: serde_json::Value = serde_json::from_str(&tokenizer().to_json().unwrap()).unwrap();
    assert_eq!(json["model"]["type"], "WordPiece");
    assert_eq!(json["model"]["vocab"]["hello"], 5);
    assert_eq!(json["model"]["vocab"]["##ing"], 9);
    assert_eq!(json["model"]["vocab"]["[CLS]"], 2);
    assert_eq!(json["normalizer"]["type"], "BertNormalizer");
    let hf = tokenizers::Tokenizer::from_bytes(tokenizer().to_json().unwrap()).unwrap();
    assert_eq!(hf.encode("Hello, world!", false).unwrap().get_ids(), [5, 11, 6, 12]);
}
