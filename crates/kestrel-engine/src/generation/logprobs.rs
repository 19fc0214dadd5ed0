//! Log-probabilities of generated tokens (OpenAI's `logprobs`/`top_logprobs`), from a step's
//! logits, with the tokens' bytes.

use kestrel_tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};

/// Log-probabilities of one generated step. On the wire `{token_id, logprob, bytes, top: [[id,
/// logprob], ...], top_bytes: [bytes, ...]}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepLogprobs {
    #[serde(rename = "token_id")]
    pub token: u32,
    pub logprob: f32,
    /// The token's bytes (a token may hold part of a UTF-8 character): with those of `top`, what
    /// an answer shows of the tokens, taken here where the tokenizer is (a remote engine's
    /// answers are written from these, with no tokenizer).
    pub bytes: Vec<u8>,
    /// The most likely tokens, best first.
    pub top: Vec<(u32, f32)>,
    /// The bytes of each of `top`, in its order.
    pub top_bytes: Vec<Vec<u8>>,
}

/// Log-softmax of `logits`: the chosen token's value and the `n` best, with their bytes.
pub fn top_logprobs(logits: &[f32], token: u32, n: usize, tokenizer: &Tokenizer) -> StepLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits.iter().map(|&l| f64::from(l - max).exp()).sum::<f64>().ln() as f32;
    let logprob = |l: f32| l - max - log_sum;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(order.len());
    if n > 0 {
        order.select_nth_unstable_by(n - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    }
    let mut top: Vec<(u32, f32)> = order[..n].iter().map(|&i| (i, logprob(logits[i as usize]))).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    // Logits past the vocabulary (a padded output) are of no token: no bytes.
    let bytes = |id: u32| tokenizer.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
    StepLogprobs {
        token,
        logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| logprob(l)),
        bytes: bytes(token),
        top_bytes: top.iter().map(|&(id, _)| bytes(id)).collect(),
        top,
    }
}
