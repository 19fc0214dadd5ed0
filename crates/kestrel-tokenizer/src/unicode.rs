//! The character classes, lowercase map and accent stripping of llama.cpp's `unicode.cpp`, as its
//! WordPiece preprocessing (`llm_tokenizer_wpm_session::preprocess`) uses them.
//!
//! llama.cpp generates its tables from Unicode 15.1 (`scripts/gen-unicode-data.py`): a general
//! category per code point, the simple (one code point) lowercase mapping, and for "NFD" only the
//! first code point of each character's canonical decomposition. Here the same answers come from
//! `unicode-general-category` (Unicode 16.0), the standard library's lowercase mapping and
//! `unicode-normalization`'s decompositions, with every code point that Unicode 16.0 assigned
//! treated as llama.cpp treats it: unassigned, so it has no category, case or decomposition. A
//! code point newer than 16.0 is unassigned to `unicode-general-category` too. Checked against
//! llama.cpp's tables for all 1,112,064 scalar values (the same class, lowercase and decomposition
//! for each).

use unicode_general_category::{get_general_category, GeneralCategory};

/// The Unicode version of `unicode-general-category` that [`ASSIGNED_IN_16_0`] was made for: a
/// newer version assigns more code points, which would then need listing there too.
#[cfg(test)]
const CATEGORY_UNICODE_VERSION: (u64, u64, u64) = (16, 0, 0);

/// The code points Unicode 16.0 assigned (inclusive ranges, sorted): unassigned in llama.cpp's
/// Unicode 15.1 tables.
const ASSIGNED_IN_16_0: &[(u32, u32)] = &[
    (0x897, 0x897),
    (0x1B4E, 0x1B4F),
    (0x1B7F, 0x1B7F),
    (0x1C89, 0x1C8A),
    (0x2427, 0x2429),
    (0x31E4, 0x31E5),
    (0xA7CB, 0xA7CD),
    (0xA7DA, 0xA7DC),
    (0x105C0, 0x105F3),
    (0x10D40, 0x10D65),
    (0x10D69, 0x10D85),
    (0x10D8E, 0x10D8F),
    (0x10EC2, 0x10EC4),
    (0x10EFC, 0x10EFC),
    (0x11380, 0x11389),
    (0x1138B, 0x1138B),
    (0x1138E, 0x1138E),
    (0x11390, 0x113B5),
    (0x113B7, 0x113C0),
    (0x113C2, 0x113C2),
    (0x113C5, 0x113C5),
    (0x113C7, 0x113CA),
    (0x113CC, 0x113D5),
    (0x113D7, 0x113D8),
    (0x113E1, 0x113E2),
    (0x116D0, 0x116E3),
    (0x11BC0, 0x11BE1),
    (0x11BF0, 0x11BF9),
    (0x11F5A, 0x11F5A),
    (0x13460, 0x143FA),
    (0x16100, 0x16139),
    (0x16D40, 0x16D79),
    (0x18CFF, 0x18CFF),
    (0x1CC00, 0x1CCF9),
    (0x1CD00, 0x1CEB3),
    (0x1E5D0, 0x1E5FA),
    (0x1E5FF, 0x1E5FF),
    (0x1F8B2, 0x1F8BB),
    (0x1F8C0, 0x1F8C1),
    (0x1FA89, 0x1FA89),
    (0x1FA8F, 0x1FA8F),
    (0x1FABE, 0x1FABE),
    (0x1FAC6, 0x1FAC6),
    (0x1FADC, 0x1FADC),
    (0x1FADF, 0x1FADF),
    (0x1FAE9, 0x1FAE9),
    (0x1FBCB, 0x1FBEF),
];

/// What llama.cpp's flags say about a code point, as far as WordPiece cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CharClass {
    /// llama.cpp's whitespace set (Unicode `White_Space`): ends a word.
    Whitespace,
    /// `\p{C}` other than unassigned (control, format, private use): dropped.
    Control,
    /// `\p{M}`: dropped when accents are stripped.
    Mark,
    /// `\p{P}`: a word of its own.
    Punctuation,
    /// `\p{S}`: a word of its own below U+007F.
    Symbol,
    /// Letters, numbers, separators that are not whitespace, unassigned code points.
    Other,
}

/// Whether llama.cpp's Unicode 15.1 tables know `c`.
fn assigned_in_15_1(c: char) -> bool {
    let cp = c as u32;
    let newer = ASSIGNED_IN_16_0.binary_search_by(|&(first, last)| {
        if last < cp {
            std::cmp::Ordering::Less
        } else if first > cp {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    });
    newer.is_err() && get_general_category(c) != GeneralCategory::Unassigned
}

/// llama.cpp's class of `c` (whitespace first, as its preprocessing tests it first).
pub(crate) fn class(c: char) -> CharClass {
    use GeneralCategory as G;
    if c.is_whitespace() {
        return CharClass::Whitespace;
    }
    if !assigned_in_15_1(c) {
        return CharClass::Other;
    }
    match get_general_category(c) {
        G::Control | G::Format | G::PrivateUse | G::Surrogate => CharClass::Control,
        G::NonspacingMark | G::SpacingMark | G::EnclosingMark => CharClass::Mark,
        G::ConnectorPunctuation
        | G::DashPunctuation
        | G::OpenPunctuation
        | G::ClosePunctuation
        | G::InitialPunctuation
        | G::FinalPunctuation
        | G::OtherPunctuation => CharClass::Punctuation,
        G::MathSymbol | G::CurrencySymbol | G::ModifierSymbol | G::OtherSymbol => CharClass::Symbol,
        _ => CharClass::Other,
    }
}

/// llama.cpp's `unicode_tolower`: the simple lowercase mapping. The standard library's full mapping
/// differs from the simple one only for U+0130 (`i` and a combining dot), whose first character
/// is the simple mapping.
pub(crate) fn to_lower(c: char) -> char {
    if !assigned_in_15_1(c) {
        return c;
    }
    c.to_lowercase().next().unwrap_or(c)
}

/// llama.cpp's `unicode_cpts_normalize_nfd` for one code point: the first code point of its
/// canonical decomposition (the base letter; the combining marks after it are not kept, and a
/// Hangul syllable becomes its leading consonant).
pub(crate) fn nfd_first(c: char) -> char {
    if !assigned_in_15_1(c) {
        return c;
    }
    let mut first = None;
    unicode_normalization::char::decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

/// llama.cpp's `is_chinese_char` ranges (which include Hugging Face's 0x2B920 start for
/// extension E-F, where 0x2B820 would be right).
pub(crate) fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unicode_16_list_is_for_this_category_table() {
        assert_eq!(unicode_general_category::UNICODE_VERSION, CATEGORY_UNICODE_VERSION);
        assert!(ASSIGNED_IN_16_0.windows(2).all(|w| w[0].1 < w[1].0));
    }

    #[test]
    fn classes_as_llama_cpp_has_them() {
        assert_eq!(class(' '), CharClass::Whitespace);
        assert_eq!(class('\u{85}'), CharClass::Whitespace);
        assert_eq!(class('\u{3000}'), CharClass::Whitespace);
        assert_eq!(class('\u{200D}'), CharClass::Control);
        assert_eq!(class('\u{E000}'), CharClass::Control);
        assert_eq!(class('\u{301}'), CharClass::Mark);
        assert_eq!(class('!'), CharClass::Punctuation);
        assert_eq!(class('$'), CharClass::Symbol);
        assert_eq!(class('🎉'), CharClass::Symbol);
        assert_eq!(class('a'), CharClass::Other);
        // Unicode 16.0's Garay and Kirat Rai are unassigned to llama.cpp, marks and punctuation
        // included.
        assert_eq!(class('\u{10D69}'), CharClass::Other);
        assert_eq!(class('\u{16D6E}'), CharClass::Other);
        assert_eq!(class('\u{378}'), CharClass::Other);
    }

    #[test]
    fn case_and_decomposition_as_llama_cpp_has_them() {
        assert_eq!(to_lower('A'), 'a');
        assert_eq!(to_lower('\u{130}'), 'i');
        assert_eq!(to_lower('Σ'), 'σ');
        assert_eq!(to_lower('\u{1C89}'), '\u{1C89}');
        assert_eq!(nfd_first('é'), 'e');
        assert_eq!(nfd_first('ǖ'), 'u');
        assert_eq!(nfd_first('한'), '\u{1112}');
        assert_eq!(nfd_first('ß'), 'ß');
        assert_eq!(nfd_first('\u{105C9}'), '\u{105C9}');
        assert!(is_chinese('日') && !is_chinese('の') && !is_chinese('\u{2B820}'));
    }
}
