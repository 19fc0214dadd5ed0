//! Prompt lookup (n-gram) drafts, as llama.cpp's `ngram-simple`: the last n tokens of the
//! sequence so far are looked for earlier in it (the prompt and the generated text), and the
//! tokens that followed their latest earlier occurrence are the draft. No second model: an app
//! that edits a given text, answers from a document or quotes arguments repeats long runs of its
//! prompt, and each such run is verified several tokens per read of the weights.

/// The longest n-gram tried first: a longer match predicts its continuation better.
pub const MAX_NGRAM: usize = 4;
/// The shortest: one repeated token predicts too little to be worth a verification row.
pub const MIN_NGRAM: usize = 2;

/// Up to `max` tokens that followed the latest earlier occurrence of `history`'s last n tokens,
/// n from `MAX_NGRAM` down to `MIN_NGRAM` (the first n that matches anywhere wins); empty when
/// none matches.
pub fn lookup_draft(history: &[u32], max: usize) -> Vec<u32> {
    if max == 0 {
        return Vec::new();
    }
    for n in (MIN_NGRAM..=MAX_NGRAM).rev() {
        let Some(tail_start) = history.len().checked_sub(n) else { continue };
        let tail = &history[tail_start..];
        // The latest start before the tail's own, whose n tokens equal the tail's.
        let found = (0..tail_start).rev().find(|&start| &history[start..start + n] == tail);
        if let Some(start) = found {
            let from = start + n;
            let end = (from + max).min(history.len());
            return history[from..end].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draft_continues_the_latest_earlier_match_of_the_longest_ngram() {
        // "1 2 3 4 5" then "9 2 3 4 6", then the tail "2 3 4": its latest earlier occurrence is
        // the second, which 6 followed; the 4-gram "0 2 3 4" appears nowhere earlier.
        let history = [1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 0, 2, 3, 4];
        assert_eq!(lookup_draft(&history, 3), vec![6, 7, 0]);
        assert_eq!(lookup_draft(&history, 1), vec![6]);
    }

    #[test]
    fn a_longer_ngram_wins_over_a_later_shorter_one() {
        // The tail 7 8 9 occurs at the start (followed by 1); 8 9 alone occurs later (followed
        // by 2): the 3-gram is tried first.
        let history = [7, 8, 9, 1, 5, 8, 9, 2, 6, 7, 8, 9];
        assert_eq!(lookup_draft(&history, 2), vec![1, 5]);
    }

    #[test]
    fn no_match_no_draft() {
        assert!(lookup_draft(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(lookup_draft(&[1], 4).is_empty());
        assert!(lookup_draft(&[], 4).is_empty());
        assert!(lookup_draft(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn the_draft_stops_at_the_end_of_the_history() {
        // The match at 0 overlaps the tail: its continuation runs into the tail itself.
        assert_eq!(lookup_draft(&[5, 5, 5, 5], 8), vec![5]);
    }
}
