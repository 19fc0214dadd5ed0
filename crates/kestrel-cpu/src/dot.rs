//! Dot products of one weight row with one activation row: 8-bit activation levels times the
//! weights' integer levels (4-bit in nibbles, or a byte each), a scale per group of 16 or 32
//! weights (plus the offsets times the activations' group sums), and f32 times f32. The
//! instruction set is chosen once per process: AVX2 with FMA where the CPU has them, wasm's
//! simd128 in a wasm build with it, else portable code.

use std::sync::OnceLock;

use kestrel_gguf::quant::INT_GROUP;
use kestrel_ops::{f32_dot_portable, F32_LANES};

use crate::activations::QuantizedRows;
use crate::factored::UnitLayout;
use crate::ACT_BLOCK;

/// How a row's levels are stored.
#[derive(Clone, Copy)]
pub(crate) enum Levels<'a> {
    /// Two unsigned 4-bit levels per byte: in each block of 32 weights, byte j holds weight j in
    /// its low nibble and weight j + 16 in its high one (llama.cpp's Q4 order).
    Nibbles(&'a [u8]),
    /// One signed level per byte.
    Bytes(&'a [i8]),
}

/// A weight row as `Matrix` keeps it: `w = scale[g] · level + offset[g]` for the weights of
/// group g (`group` of 16 or 32 weights).
#[derive(Clone, Copy)]
pub(crate) struct IntRow<'a> {
    pub levels: Levels<'a>,
    pub group: usize,
    pub scale: &'a [f32],
    pub offset: Option<&'a [f32]>,
}

/// Scales or offsets as a matrix keeps them: f16 where every one of its values is exactly an
/// f16 (the 32-weight formats', which ggml stores as f16: half the bytes a step streams), a byte
/// and a super-block unit each for the K-quants (`factored`), else f32.
#[derive(Clone, Copy)]
pub(crate) enum Scales<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    /// Value i is `units[layout.unit_of(i)] · k[i]`.
    Factored {
        units: &'a [f32],
        k: &'a [i8],
        layout: UnitLayout,
    },
}

impl<'a> Scales<'a> {
    pub(crate) fn len(self) -> usize {
        match self {
            Scales::F32(s) => s.len(),
            Scales::F16(h) => h.len(),
            Scales::Factored { k, .. } => k.len(),
        }
    }

    /// Values `start..start + len`: for factored values, whole unit groups of whole lane groups
    /// (a matrix's whole rows, or whole interleaved groups of rows).
    pub(crate) fn part(self, start: usize, len: usize) -> Self {
        match self {
            Scales::F32(s) => Scales::F32(&s[start..][..len]),
            Scales::F16(h) => Scales::F16(&h[start..][..len]),
            Scales::Factored { units, k, layout } => {
                let (per_unit, whole) = (layout.per_unit(), layout.per_unit() * layout.lanes());
                assert!(start.is_multiple_of(whole) && len.is_multiple_of(whole), "factored scales split inside a unit");
                Scales::Factored { units: &units[start / per_unit..][..len / per_unit], k: &k[start..][..len], layout }
            }
        }
    }

    /// Value i as f32.
    #[inline]
    pub(crate) fn get(self, i: usize) -> f32 {
        match self {
            Scales::F32(s) => s[i],
            Scales::F16(h) => f16_to_f32(h[i]),
            Scales::Factored { units, k, layout } => units[layout.unit_of(i)] * f32::from(k[i]),
        }
    }

    /// The values as f32: borrowed, or converted into `buf`.
    fn to_f32<'b>(self, buf: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            Scales::F32(s) => s,
            Scales::F16(h) => {
                buf.clear();
                buf.extend(h.iter().map(|&bits| f16_to_f32(bits)));
                buf
            }
            Scales::Factored { .. } => {
                buf.clear();
                buf.extend((0..self.len()).map(|i| self.get(i)));
                buf
            }
        }
    }
}

/// An f16's value: normal numbers (every scale but the tiniest) by moving the bits, the rest
/// (zeros, subnormals, infinities) through `half`. `half` alone converts in software in a build
/// without F16C (wasm, baseline x86-64), several times slower, and a row converts its scales for
/// every dot product of a decode step.
#[inline]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let exponent = bits & 0x7c00;
    if exponent == 0 || exponent == 0x7c00 {
        return half::f16::from_bits(bits).to_f32();
    }
    let sign = u32::from(bits & 0x8000) << 16;
    // Rebias the exponent from 15 to 127: (127 - 15) << 23 added to the shifted bits.
    f32::from_bits(sign | ((u32::from(bits & 0x7fff) << 13) + 0x3800_0000))
}

/// Consecutive weight rows of `cols` weights (the levels, scales and offsets of all of them).
#[derive(Clone, Copy)]
pub(crate) struct IntRows<'a> {
    pub levels: Levels<'a>,
    pub group: usize,
    pub scale: Scales<'a>,
    pub offset: Option<Scales<'a>>,
    pub cols: usize,
}

impl<'a> IntRows<'a> {
    fn rows(&self) -> usize {
        self.scale.len() * self.group / self.cols
    }

    /// Row r's levels, scales and offsets.
    #[inline]
    fn row_parts(&self, r: usize) -> (Levels<'a>, Scales<'a>, Option<Scales<'a>>) {
        let (cols, groups) = (self.cols, self.cols / self.group);
        let levels = match self.levels {
            Levels::Nibbles(n) => Levels::Nibbles(&n[r * cols / 2..][..cols / 2]),
            Levels::Bytes(q) => Levels::Bytes(&q[r * cols..][..cols]),
        };
        (levels, self.scale.part(r * groups, groups), self.offset.map(|o| o.part(r * groups, groups)))
    }

    /// Row r, its scales and offsets in f32 (converted into `bufs` where they are f16).
    fn row<'b>(&self, r: usize, bufs: &'b mut [Vec<f32>; 2]) -> IntRow<'b>
    where
        'a: 'b,
    {
        let (levels, scale, offset) = self.row_parts(r);
        let [scale_buf, offset_buf] = bufs;
        IntRow { levels, group: self.group, scale: scale.to_f32(scale_buf), offset: offset.map(|o| o.to_f32(offset_buf)) }
    }
}

/// One activation row of `QuantizedRows`.
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub q: &'a [i8],
    /// One scale per 32 values.
    pub d: &'a [f32],
    /// `Σ q` per 16 values.
    #[cfg_attr(not(target_arch = "x86_64"), expect(dead_code, reason = "only the AVX2 tiles read it"))]
    pub level_sums16: &'a [i16],
    /// `d · Σ q` per 16 and per 32 values.
    pub sums16: &'a [f32],
    pub sums32: &'a [f32],
}

impl QuantizedRows {
    /// Rows of `cols` values.
    pub(crate) fn rows(&self, cols: usize) -> usize {
        self.q.len() / cols
    }

    #[inline]
    pub(crate) fn row(&self, t: usize, cols: usize) -> ActRow<'_> {
        ActRow {
            q: &self.q[t * cols..][..cols],
            d: &self.d[t * cols / ACT_BLOCK..][..cols / ACT_BLOCK],
            level_sums16: &self.level_sums16[t * cols / INT_GROUP..][..cols / INT_GROUP],
            sums16: &self.sums16[t * cols / INT_GROUP..][..cols / INT_GROUP],
            sums32: &self.sums32[t * cols / ACT_BLOCK..][..cols / ACT_BLOCK],
        }
    }
}

struct Kernels {
    name: &'static str,
    int: fn(IntRows<'_>, &QuantizedRows, &mut [f32]),
    /// `f32_products`: each result the same bits as the set's f32 dot product of its row and
    /// token.
    f32_products: fn(&[f32], &[f32], usize, &mut [f32]),
}

/// Every kernel set this machine runs, fastest first: the first is the one chosen.
fn available() -> Vec<Kernels> {
    let portable = Kernels {
        name: "portable",
        int: |w, x, out| products_by(w, x, out, int_dot_portable),
        f32_products: |w, x, cols, out| f32_products_by(w, x, cols, out, f32_dot_portable),
    };
    #[cfg(target_arch = "x86_64")]
    {
        let mut sets = Vec::new();
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            if is_x86_feature_detected!("avxvnni") {
                sets.push(Kernels { name: "avx2+vnni", int: avx2::int_products_vnni_checked, f32_products: avx2::f32_products_checked });
            }
            sets.push(Kernels { name: "avx2", int: avx2::int_products_checked, f32_products: avx2::f32_products_checked });
        }
        sets.push(portable);
        sets
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return vec![
        Kernels {
            name: "simd128",
            int: simd128::products,
            // Tiles measured slower than one product at a time in V8 (8 against 18 sentences/s on
            // all-MiniLM): its arrays of v128 do not stay in registers.
            f32_products: |w, x, cols, out| f32_products_by(w, x, cols, out, simd128::f32_dot),
        },
        portable,
    ];
    #[cfg(not(any(target_arch = "x86_64", all(target_arch = "wasm32", target_feature = "simd128"))))]
    vec![portable]
}

fn kernels() -> &'static Kernels {
    static CHOSEN: OnceLock<Kernels> = OnceLock::new();
    CHOSEN.get_or_init(|| available().swap_remove(0))
}

/// The chosen kernel set's name, and `+avx512vnni` where the interleaved K-quant tiles take
/// AVX512-VNNI's `dpbusd` (`interleaved`, `interleaved_bytes`), which they choose on their own.
pub(crate) fn simd_name() -> &'static str {
    let name = kernels().name;
    #[cfg(target_arch = "x86_64")]
    if avx2::has_avx512_vnni() {
        match name {
            "avx2" => return "avx2+avx512vnni",
            "avx2+vnni" => return "avx2+vnni+avx512vnni",
            _ => {}
        }
    }
    name
}

/// `out[r·n + t] = Σ_e w_r[e]·x_t[e]` for the rows r of `w` and the n rows t of `x`, with
/// `w[e] = scale[g]·level[e] + offset[g]` and `x[e] ≈ d[e/32]·qx[e]`.
pub(crate) fn int_products(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
    (kernels().int)(w, x, out)
}

/// `int_products` over one row-and-token dot product at a time.
fn products_by(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32], dot: fn(IntRow<'_>, ActRow<'_>) -> f32) {
    let n = x.rows(w.cols);
    let mut bufs = [Vec::new(), Vec::new()];
    for (r, ys) in out.chunks_exact_mut(n).enumerate().take(w.rows()) {
        let row = w.row(r, &mut bufs);
        for (t, y) in ys.iter_mut().enumerate() {
            *y = dot(row, x.row(t, w.cols));
        }
    }
}

/// `out[r·n + t] = w_r · x_t` for the rows r of `w` and the n rows t of `x` (`cols`
/// values each), every result the same bits as the kernel set's one dot product gives it, whatever n is: a matrix's
/// products then do not depend on how many tokens run together.
///
/// Panics if `w` or `x` is not whole rows of `cols` or `out` is not rows x n (a shape bug).
pub(crate) fn f32_products(w: &[f32], x: &[f32], cols: usize, out: &mut [f32]) {
    assert!(cols > 0 && w.len().is_multiple_of(cols) && x.len().is_multiple_of(cols), "f32_products: rows of {cols}");
    assert_eq!(out.len(), w.len() / cols * (x.len() / cols), "f32_products: out is not rows x tokens");
    (kernels().f32_products)(w, x, cols, out)
}

/// `f32_products` one dot product at a time.
fn f32_products_by(w: &[f32], x: &[f32], cols: usize, out: &mut [f32], dot: fn(&[f32], &[f32]) -> f32) {
    let n = x.len() / cols;
    for (w_row, ys) in w.chunks_exact(cols).zip(out.chunks_exact_mut(n)) {
        for (y, x_row) in ys.iter_mut().zip(x.chunks_exact(cols)) {
            *y = dot(w_row, x_row);
        }
    }
}

impl<'a> ActRow<'a> {
    /// `Σ_{e in g} x[e]` for each group g of `group` (16 or 32) values: what the offsets of a
    /// weight row with that group multiply.
    #[inline]
    fn group_sums(self, group: usize) -> &'a [f32] {
        if group == ACT_BLOCK {
            self.sums32
        } else {
            self.sums16
        }
    }
}

/// `Σ_g offset[g] · Σ_{e in g} x[e]` over groups of `group` weights, one group after another as
/// llama.cpp adds them (a few dozen terms a row: a plain loop).
#[inline]
fn offsets_dot(offset: &[f32], group: usize, x: ActRow<'_>) -> f32 {
    offset.iter().zip(x.group_sums(group)).map(|(o, s)| o * s).sum()
}

/// Level `e` (0..32) of block `b`.
fn level(levels: Levels<'_>, b: usize, e: usize) -> i32 {
    match levels {
        Levels::Nibbles(n) => {
            let byte = n[b * ACT_BLOCK / 2 + e % 16];
            i32::from(if e < 16 { byte & 0x0F } else { byte >> 4 })
        }
        Levels::Bytes(q) => i32::from(q[b * ACT_BLOCK + e]),
    }
}

fn int_dot_portable(w: IntRow<'_>, x: ActRow<'_>) -> f32 {
    let mut sum = 0f32;
    for (b, (xq, &d)) in x.q.chunks_exact(ACT_BLOCK).zip(x.d).enumerate() {
        let part = |range: std::ops::Range<usize>| range.map(|e| level(w.levels, b, e) * i32::from(xq[e])).sum::<i32>() as f32;
        sum += if w.group == ACT_BLOCK {
            w.scale[b] * d * part(0..32)
        } else {
            d * (w.scale[2 * b] * part(0..16) + w.scale[2 * b + 1] * part(16..32))
        };
    }
    sum + w.offset.map_or(0.0, |o| offsets_dot(o, w.group, x))
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use super::{ActRow, IntRows, Levels, Scales, F32_LANES};
    use crate::activations::{ActFormat, QuantizedRows, Q8K_BLOCK};
    use crate::factored::UnitLayout;
    use crate::ACT_BLOCK;

    // Only chosen by `kernels()` after the CPU reported AVX2, FMA and F16C (and AVX-VNNI for the
    // second); the slices' lengths are checked here, so the unchecked loads below stay inside them.
    pub(super) fn int_products_checked(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
        let (rows, n) = checked_shapes(&w, x, out);
        // SAFETY: AVX2, FMA and F16C are present (see above); `IntRows::row_parts` and
        // `QuantizedRows::row` slice whole rows, and every load reads within a row's slices.
        unsafe { plain::products(w, x, out, rows, n) }
    }

    pub(super) fn int_products_vnni_checked(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
        let (rows, n) = checked_shapes(&w, x, out);
        // SAFETY: as above, and AVX-VNNI is present.
        unsafe { vnni::products(w, x, out, rows, n) }
    }

    /// The rows of `w` and of `x`, after checking that the slices hold exactly them.
    fn checked_shapes(w: &IntRows<'_>, x: &QuantizedRows, out: &[f32]) -> (usize, usize) {
        let (rows, n) = (w.rows(), x.rows(w.cols));
        let levels = match w.levels {
            Levels::Nibbles(n) => n.len() * 2,
            Levels::Bytes(q) => q.len(),
        };
        assert!(
            w.cols.is_multiple_of(ACT_BLOCK) && levels == rows * w.cols && out.len() == rows * n && x.d.len() * ACT_BLOCK == x.q.len(),
            "int_products: shapes differ"
        );
        (rows, n)
    }

    /// The tiled products, compiled once per instruction set (`$features`), with AVX-VNNI's
    /// `dpbusd` where `$vnni`.
    macro_rules! tiled_products {
        ($features:literal, $vnni:literal) => {
            use std::arch::x86_64::*;

            use super::super::{ActRow, IntRows, Levels};
            use super::{add_offsets, horizontal_sum, prefetch_ahead, weight_block, weight_scales, RowView, ROWS, TOKENS};
            use crate::activations::QuantizedRows;
            use crate::ACT_BLOCK;

            /// Tiles of up to `ROWS` weight rows times `TOKENS` activation rows: each weight block is
            /// expanded once for all the tile's tokens and each activation block loaded once for its
            /// rows, so a batch (prefill, or several sequences' decode steps) costs fewer instructions per
            /// product than one token at a time.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn products(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize) {
                let act_rows: Vec<ActRow<'_>> = (0..n).map(|t| x.row(t, w.cols)).collect();
                let mut r = 0;
                while r < rows {
                    let tile_rows = (rows - r).min(ROWS);
                    let row0 = RowView::of(&w, r);
                    let row1 = if tile_rows == 2 { Some(RowView::of(&w, r + 1)) } else { None };
                    let mut t = 0;
                    while t < n {
                        let tile_tokens = (n - t).min(TOKENS);
                        // A tile of fewer tokens repeats its last row in the unused places.
                        let acts: [ActRow<'_>; TOKENS] = std::array::from_fn(|i| act_rows[t + i.min(tile_tokens - 1)]);
                        macro_rules! run {
                            ($nibbles:literal, $t:literal) => {
                                match row1 {
                                    Some(row1) => store(tile::<$nibbles, 2, $t>([row0, row1], &acts, w.cols), out, r, t, n),
                                    None => store(tile::<$nibbles, 1, $t>([row0], &acts, w.cols), out, r, t, n),
                                }
                            };
                        }
                        match (matches!(w.levels, Levels::Nibbles(_)), tile_tokens) {
                            (true, 4) => run!(true, 4),
                            (true, 3) => run!(true, 3),
                            (true, 2) => run!(true, 2),
                            (true, _) => run!(true, 1),
                            (false, 4) => run!(false, 4),
                            (false, 3) => run!(false, 3),
                            (false, 2) => run!(false, 2),
                            (false, _) => run!(false, 1),
                        }
                        t += tile_tokens;
                    }
                    r += tile_rows;
                }
            }

            /// A tile's sums into `out` (row-major by weight row, `n` tokens a row).
            #[inline]
            unsafe fn store<const R: usize, const T: usize>(sums: [[f32; T]; R], out: &mut [f32], r: usize, t: usize, n: usize) {
                for (i, row) in sums.iter().enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        *out.get_unchecked_mut((r + i) * n + t + j) = v;
                    }
                }
            }

            /// `R` rows times `T` tokens over every block: per block, each row's levels expanded once,
            /// each token's activations loaded once; then the offsets.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn tile<const NIBBLES: bool, const R: usize, const T: usize>(
                rows: [RowView<'_>; R],
                acts: &[ActRow<'_>; TOKENS],
                cols: usize,
            ) -> [[f32; T]; R] {
                let mut acc = [[_mm256_setzero_ps(); T]; R];
                for b in 0..cols / ACT_BLOCK {
                    for row in &rows {
                        prefetch_ahead(row.levels, b);
                    }
                    let mut weights = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
                    let mut scales = [_mm256_setzero_ps(); R];
                    for i in 0..R {
                        weights[i] = weight_block::<NIBBLES>(rows[i].levels, b);
                        scales[i] = weight_scales(&rows[i], b);
                    }
                    for j in 0..T {
                        let xq = _mm256_loadu_si256(acts[j].q.as_ptr().add(b * ACT_BLOCK).cast());
                        let d = _mm256_set1_ps(*acts[j].d.get_unchecked(b));
                        for i in 0..R {
                            let (u, sign) = weights[i];
                            let x = if NIBBLES { xq } else { _mm256_sign_epi8(xq, sign) };
                            acc[i][j] = _mm256_fmadd_ps(pair_sums(u, x), _mm256_mul_ps(scales[i], d), acc[i][j]);
                        }
                    }
                }
                let mut sums = add_offsets(&rows, acts, &mut acc);
                for i in 0..R {
                    for j in 0..T {
                        sums[i][j] += horizontal_sum(acc[i][j]);
                    }
                }
                sums
            }

            /// The 8 i32 sums of 4 adjacent `u · s` products (u unsigned, s signed): AVX-VNNI's
            /// `dpbusd`, or `maddubs` into i16 pairs (at most 2·255·127 apart from the levels used here,
            /// 2·15·127 or 2·128·127: no saturation) and `madd` of those. Exact either way.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn pair_sums(u: __m256i, s: __m256i) -> __m256 {
                let sums = if $vnni {
                    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
                } else {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
                };
                _mm256_cvtepi32_ps(sums)
            }
        };
    }

    mod plain {
        tiled_products!("avx2,fma,f16c", false);
    }

    mod vnni {
        tiled_products!("avx2,fma,f16c,avxvnni", true);
    }

    /// Weight rows a tile computes.
    const ROWS: usize = 2;
    /// Activation rows a tile computes.
    const TOKENS: usize = 4;

    /// How far ahead of the block being read the levels are fetched into the cache, in bytes. A
    /// decode step streams each weight once, so its speed is the memory's; the hardware
    /// prefetchers stop at every 4 KiB page and ramp up again, which left a decode step waiting
    /// on its loads (a 1B model's step ran at about 5 GB/s a core); a matrix's rows lie one after
    /// another, so this runs on into the next rows.
    const PREFETCH_BYTES: usize = 4096;

    /// Asks for the cache line `PREFETCH_BYTES` past block b of a row's levels (past the matrix's
    /// end it is a no-op: a prefetch never faults).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn prefetch_ahead(levels: Levels<'_>, b: usize) {
        let at = match levels {
            Levels::Nibbles(n) => n.as_ptr().wrapping_add(b * ACT_BLOCK / 2 + PREFETCH_BYTES),
            Levels::Bytes(q) => q.as_ptr().cast::<u8>().wrapping_add(b * ACT_BLOCK + PREFETCH_BYTES),
        };
        _mm_prefetch::<_MM_HINT_T0>(at.cast());
    }

    /// Block b of a row as unsigned levels for `maddubs`, and the signs to give the activations
    /// (signed byte levels: |w|, and w whose sign moves to x; nibbles are unsigned already).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weight_block<const NIBBLES: bool>(levels: Levels<'_>, b: usize) -> (__m256i, __m256i) {
        match levels {
            Levels::Nibbles(n) if NIBBLES => {
                let raw = _mm_loadu_si128(n.as_ptr().add(b * ACT_BLOCK / 2).cast());
                (_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F)), _mm256_setzero_si256())
            }
            Levels::Bytes(q) if !NIBBLES => {
                let wq = _mm256_loadu_si256(q.as_ptr().add(b * ACT_BLOCK).cast());
                (_mm256_sign_epi8(wq, wq), wq)
            }
            _ => unreachable!("the tile's layout is the matrix's"),
        }
    }

    /// A weight row's levels, and its scales and offsets: f16 ones are converted by F16C as the
    /// products read them.
    #[derive(Clone, Copy)]
    struct RowView<'a> {
        levels: Levels<'a>,
        group: usize,
        scale: Scales<'a>,
        offset: Option<Scales<'a>>,
    }

    impl<'a> RowView<'a> {
        #[inline]
        fn of(w: &IntRows<'a>, r: usize) -> Self {
            let (levels, scale, offset) = w.row_parts(r);
            Self { levels, group: w.group, scale, offset }
        }
    }

    /// The tile's offsets terms (`offsets_dot`: each row's offsets times each token's group sums)
    /// added to its accumulators' lanes, 8 groups a step, each row's 8 offsets loaded (and
    /// converted from f16) once for all the tile's tokens; the groups after the last whole 8 in one
    /// more step over the row's last 8 groups, with the lanes already added masked off. A row of
    /// under 8 groups gets its terms as scalars, returned per row and token (0 otherwise); the
    /// lanes' sum plus that scalar is the offsets term. (A scalar loop of dependent additions here
    /// cost as much as the products of a 576-weight row, and converting the offsets again for each
    /// token a sixth of a batched decode step.)
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add_offsets<const R: usize, const T: usize>(
        rows: &[RowView<'_>; R],
        acts: &[ActRow<'_>; TOKENS],
        acc: &mut [[__m256; T]; R],
    ) -> [[f32; T]; R] {
        let mut scalars = [[0f32; T]; R];
        for (row, (acc, scalars)) in rows.iter().zip(acc.iter_mut().zip(&mut scalars)) {
            let Some(offset) = row.offset else { continue };
            let sums: [&[f32]; T] = std::array::from_fn(|j| acts[j].group_sums(row.group));
            let groups = offset.len().min(sums[0].len());
            if groups < 8 {
                for (scalar, sums) in scalars.iter_mut().zip(sums) {
                    *scalar = (0..groups).map(|g| offset.get(g) * sums[g]).sum();
                }
                continue;
            }
            let body = groups / 8 * 8;
            let mut g = 0;
            while g < body {
                let o = eight_scales(offset, g);
                for (acc, sums) in acc.iter_mut().zip(sums) {
                    *acc = _mm256_fmadd_ps(o, _mm256_loadu_ps(sums.as_ptr().add(g)), *acc);
                }
                g += 8;
            }
            if body < groups {
                let last = groups - 8;
                // Lane k is group last + k: added above where last + k < body.
                let added = _mm256_set1_epi32((body - last) as i32 - 1);
                let fresh = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), added));
                let o = _mm256_and_ps(eight_scales(offset, last), fresh);
                for (acc, sums) in acc.iter_mut().zip(sums) {
                    *acc = _mm256_fmadd_ps(o, _mm256_loadu_ps(sums.as_ptr().add(last)), *acc);
                }
            }
        }
        scalars
    }

    /// Values i..i + 8 of `s` (which has them) as f32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn eight_scales(s: Scales<'_>, i: usize) -> __m256 {
        match s {
            Scales::F32(v) => _mm256_loadu_ps(v.as_ptr().add(i)),
            Scales::F16(h) => _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().add(i).cast())),
            // Interleaved rows from an 8-aligned value: lane r's unit is lane r of one unit group.
            Scales::Factored { units, k, layout } if layout.lanes() == 8 && i.is_multiple_of(8) => {
                let k = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(k.as_ptr().add(i).cast())));
                _mm256_mul_ps(_mm256_loadu_ps(units.as_ptr().add(layout.unit_of(i))), k)
            }
            Scales::Factored { .. } => {
                _mm256_setr_ps(s.get(i), s.get(i + 1), s.get(i + 2), s.get(i + 3), s.get(i + 4), s.get(i + 5), s.get(i + 6), s.get(i + 7))
            }
        }
    }

    /// Whether the CPU has AVX512-VNNI's `dpbusd`, on 256-bit vectors (AVX512VL) and 512-bit ones
    /// (with AVX512BW's byte and 16-bit lanes, which every CPU with AVX512-VNNI has): the
    /// interleaved K-quant tiles then sum 4 byte products into i32 in one instruction where AVX2
    /// takes `maddubs` and an add (and a widening `madd` a block).
    pub(crate) fn has_avx512_vnni() -> bool {
        is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
    }

    /// Scales or offsets read 8 interleaved lanes at a time, a type per storage: a tile is
    /// compiled for its matrix's storage, where a `match` per block of weights (`eight_scales`)
    /// cost factored scales a third of a decode step.
    pub(crate) trait EightScales: Copy {
        /// Values i..i + 8 (which the values have, i a multiple of 8) as f32 lanes.
        ///
        /// # Safety
        /// AVX2, FMA and F16C are present, and the values have i..i + 8.
        unsafe fn eight(self, i: usize) -> __m256;
    }

    #[derive(Clone, Copy)]
    pub(crate) struct F32Lanes<'a>(pub &'a [f32]);

    #[derive(Clone, Copy)]
    pub(crate) struct F16Lanes<'a>(pub &'a [u16]);

    /// Factored values of 8 interleaved rows: lane r's unit is lane r of its unit group.
    #[derive(Clone, Copy)]
    pub(crate) struct FactoredLanes<'a> {
        pub units: &'a [f32],
        pub k: &'a [i8],
        pub layout: UnitLayout,
    }

    impl EightScales for F32Lanes<'_> {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn eight(self, i: usize) -> __m256 {
            _mm256_loadu_ps(self.0.as_ptr().add(i))
        }
    }

    impl EightScales for F16Lanes<'_> {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn eight(self, i: usize) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(self.0.as_ptr().add(i).cast()))
        }
    }

    impl EightScales for FactoredLanes<'_> {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn eight(self, i: usize) -> __m256 {
            let k = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(self.k.as_ptr().add(i).cast())));
            _mm256_mul_ps(_mm256_loadu_ps(self.units.as_ptr().add(self.layout.unit_of(i))), k)
        }
    }

    /// Any storage, matched per read: for scales and offsets stored alike in no pair above.
    impl EightScales for Scales<'_> {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn eight(self, i: usize) -> __m256 {
            eight_scales(self, i)
        }
    }

    /// Calls `$run(scale, offset)` (a closure, expanded once per arm so that each arm compiles
    /// it for its own reader types) with the lane readers of a matrix's interleaved scales and
    /// offsets (`Scales`, `Option<Scales>`).
    macro_rules! with_eight_scales {
        ($scale:expr, $offset:expr, $run:expr) => {{
            use crate::dot::avx2::{F16Lanes, F32Lanes, FactoredLanes};
            use crate::dot::Scales;
            match ($scale, $offset) {
                (Scales::F32(s), None) => ($run)(F32Lanes(s), None::<F32Lanes<'_>>),
                (Scales::F32(s), Some(Scales::F32(o))) => ($run)(F32Lanes(s), Some(F32Lanes(o))),
                (Scales::F16(s), None) => ($run)(F16Lanes(s), None::<F16Lanes<'_>>),
                (Scales::F16(s), Some(Scales::F16(o))) => ($run)(F16Lanes(s), Some(F16Lanes(o))),
                (s, o) => match (FactoredLanes::of(s), o.map(FactoredLanes::of)) {
                    (Some(s), None) => ($run)(s, None::<FactoredLanes<'_>>),
                    (Some(s), Some(Some(o))) => ($run)(s, Some(o)),
                    _ => ($run)(s, o),
                },
            }
        }};
    }
    pub(crate) use with_eight_scales;

    /// Ends a super-block of the K-quant tiles (`interleaved`, `interleaved_bytes`): adds to
    /// each token's `acc` the i32 sums of levels times integer scales (`scaled`) times the rows'
    /// units and the token's activation scale (one a super-block: block `first`'s), and the
    /// offsets' sums times their units. `at`: the super-block's first value of the scales.
    ///
    /// # Safety
    /// AVX2 and FMA are present; the scales have value `at`, and each of `acts` block `first`.
    /// Inlined into its callers, which enable them.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn end_super_block<const T: usize>(
        acc: &mut [__m256; T],
        scaled: &[__m256i; T],
        offsets: &[__m256; T],
        scale: FactoredLanes<'_>,
        offset: Option<FactoredLanes<'_>>,
        at: usize,
        acts: &[ActRow<'_>],
        first: usize,
    ) {
        let unit = _mm256_loadu_ps(scale.units.as_ptr().add(scale.layout.unit_of(at)));
        let offset_unit = offset.map(|o| _mm256_loadu_ps(o.units.as_ptr().add(o.layout.unit_of(at))));
        for j in 0..T {
            let d = _mm256_set1_ps(*acts[j].d.get_unchecked(first));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled[j]), _mm256_mul_ps(unit, d), acc[j]);
            if let Some(u) = offset_unit {
                acc[j] = _mm256_fmadd_ps(offsets[j], u, acc[j]);
            }
        }
    }

    impl<'a> FactoredLanes<'a> {
        /// A K-quant's factored scales and offsets of 8 interleaved rows (`group` weights a
        /// value, `cols` a row) with activations of one scale per super-block (Q8_K): the case
        /// of the tiles that sum a super-block's blocks in i32 (None: another case).
        pub(crate) fn super_blocks(
            scale: Scales<'a>,
            offset: Option<Scales<'a>>,
            group: usize,
            cols: usize,
            x: &QuantizedRows,
        ) -> Option<(Self, Option<Self>)> {
            let scale = Self::of(scale)?;
            let offset = match offset {
                Some(o) => Some(Self::of(o)?),
                None => None,
            };
            let super_block = scale.layout.per_unit() * group;
            let fits = x.format == ActFormat::Q8K
                && super_block == Q8K_BLOCK
                && cols.is_multiple_of(super_block)
                // Offsets are per 32 weights, as every format with them has them.
                && offset.is_none_or(|o| o.layout == scale.layout && group == ACT_BLOCK);
            fits.then_some((scale, offset))
        }

        /// Factored values of 8 interleaved rows as lanes (None: another storage or layout).
        pub(crate) fn of(s: Scales<'a>) -> Option<Self> {
            match s {
                Scales::Factored { units, k, layout } if layout.lanes() == 8 => Some(Self { units, k, layout }),
                _ => None,
            }
        }
    }

    /// Value i of `s` in every lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn broadcast(s: Scales<'_>, i: usize) -> __m256 {
        match s {
            Scales::F32(v) => _mm256_set1_ps(*v.get_unchecked(i)),
            Scales::F16(h) => _mm256_cvtph_ps(_mm_set1_epi16(*h.get_unchecked(i) as i16)),
            Scales::Factored { .. } => _mm256_set1_ps(s.get(i)),
        }
    }

    /// Block b's weight scales in the 8 lanes of its pair sums: one scale, or (groups of 16)
    /// lanes 0-3 for the first 16 weights and 4-7 for the second.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weight_scales(row: &RowView<'_>, b: usize) -> __m256 {
        if row.group == ACT_BLOCK {
            broadcast(row.scale, b)
        } else {
            _mm256_set_m128(_mm256_castps256_ps128(broadcast(row.scale, 2 * b + 1)), _mm256_castps256_ps128(broadcast(row.scale, 2 * b)))
        }
    }

    /// Tokens a block of `f32_products_checked` takes: their rows (a few tens of KiB) stay in the
    /// cache while every weight row of the task passes over them.
    const TOKEN_BLOCK: usize = 32;

    /// `super::f32_products` (whose asserts checked the shapes) by tiles of two weight rows and
    /// two tokens (`f32_tile`, each of its four results the bits `f32_dot` gives), over blocks of
    /// `TOKEN_BLOCK` tokens; the rows and tokens left over one dot product at a time.
    pub(super) fn f32_products_checked(w: &[f32], x: &[f32], cols: usize, out: &mut [f32]) {
        let (rows, n) = (w.len() / cols, x.len() / cols);
        let w_row = |r: usize| &w[r * cols..][..cols];
        let x_row = |t: usize| &x[t * cols..][..cols];
        for t0 in (0..n).step_by(TOKEN_BLOCK) {
            let t_end = (t0 + TOKEN_BLOCK).min(n);
            for r in (0..rows).step_by(2) {
                let pair = r + 1 < rows;
                let mut t = t0;
                while pair && t + 1 < t_end {
                    let [[a, b], [c, d]] = f32_tile_checked(w_row(r), w_row(r + 1), x_row(t), x_row(t + 1));
                    out[r * n + t] = a;
                    out[r * n + t + 1] = b;
                    out[(r + 1) * n + t] = c;
                    out[(r + 1) * n + t + 1] = d;
                    t += 2;
                }
                for t in t..t_end {
                    out[r * n + t] = f32_dot_checked(w_row(r), x_row(t));
                    if pair {
                        out[(r + 1) * n + t] = f32_dot_checked(w_row(r + 1), x_row(t));
                    }
                }
            }
        }
    }

    fn f32_tile_checked(w0: &[f32], w1: &[f32], x0: &[f32], x1: &[f32]) -> [[f32; 2]; 2] {
        assert!(w1.len() == w0.len() && x0.len() == w0.len() && x1.len() == w0.len(), "f32_tile: lengths differ");
        // SAFETY: available() offers these kernels only where AVX2 and FMA were detected; the
        // rows have one length, and every load is within it.
        unsafe { f32_tile(w0, w1, x0, x1) }
    }

    fn f32_dot_checked(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "f32_dot: lengths differ");
        // SAFETY: as above.
        unsafe { f32_dot(a, b) }
    }

    /// `[[w0·x0, w0·x1], [w1·x0, w1·x1]]`, each as `f32_dot` computes it: four dot products,
    /// each with `f32_dot`'s two accumulators and order of operations (so the same bits), eight
    /// chains of FMAs in flight where one dot product has two.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn f32_tile(w0: &[f32], w1: &[f32], x0: &[f32], x1: &[f32]) -> [[f32; 2]; 2] {
        let body = w0.len() / (2 * F32_LANES) * (2 * F32_LANES);
        let mut acc = [[[_mm256_setzero_ps(); 2]; 2]; 2];
        let mut i = 0;
        while i < body {
            let xs = [x0, x1].map(|x| [_mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(x.as_ptr().add(i + 8))]);
            for (acc_r, w) in acc.iter_mut().zip([w0, w1]) {
                let wv = [_mm256_loadu_ps(w.as_ptr().add(i)), _mm256_loadu_ps(w.as_ptr().add(i + 8))];
                for (a, xv) in acc_r.iter_mut().zip(&xs) {
                    a[0] = _mm256_fmadd_ps(wv[0], xv[0], a[0]);
                    a[1] = _mm256_fmadd_ps(wv[1], xv[1], a[1]);
                }
            }
            i += 2 * F32_LANES;
        }
        let finish = |a: [__m256; 2], w: &[f32], x: &[f32]| {
            let tail: f32 = w[body..].iter().zip(&x[body..]).map(|(x, y)| x * y).sum();
            horizontal_sum(_mm256_add_ps(a[0], a[1])) + tail
        };
        [[finish(acc[0][0], w0, x0), finish(acc[0][1], w0, x1)], [finish(acc[1][0], w1, x0), finish(acc[1][1], w1, x1)]]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn f32_dot(a: &[f32], b: &[f32]) -> f32 {
        let body = a.len() / (2 * F32_LANES) * (2 * F32_LANES);
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < body {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i + 8)), _mm256_loadu_ps(b.as_ptr().add(i + 8)), acc1);
            i += 2 * F32_LANES;
        }
        let tail: f32 = a[body..].iter().zip(&b[body..]).map(|(x, y)| x * y).sum();
        horizontal_sum(_mm256_add_ps(acc0, acc1)) + tail
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn horizontal_sum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }
}

/// wasm's 128-bit SIMD, which a wasm build compiled with `+simd128` always has (every browser
/// with WebGPU runs it).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use core::arch::wasm32::*;

    use super::{ActRow, IntRow, IntRows, Levels, F32_LANES};
    use crate::activations::QuantizedRows;
    use crate::ACT_BLOCK;

    /// Activation rows a tile computes: each weight block is widened once for all of them (four
    /// sums and a block's weights stay in registers on x86's 16 and ARM's 32).
    const TOKENS: usize = 4;

    /// The first 16 bytes of `values`.
    fn load<T>(values: &[T]) -> v128 {
        assert!(std::mem::size_of_val(values) >= 16, "simd128 load past a slice");
        // SAFETY: at least 16 readable bytes (checked); wasm's loads need no alignment.
        unsafe { v128_load(values.as_ptr().cast()) }
    }

    /// `int_products` in tiles of one weight row times up to `TOKENS` activation rows. The
    /// activations are widened to i16 once per call rather than once per weight row, and each
    /// weight block once per tile, so the products are `i32x4_dot_i16x8` of ready operands.
    pub(super) fn products(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
        let (cols, n) = (w.cols, x.rows(w.cols));
        let wide: Vec<i16> = x.q.iter().map(|&q| i16::from(q)).collect();
        let acts: Vec<(ActRow<'_>, &[i16])> = (0..n).map(|t| (x.row(t, cols), &wide[t * cols..][..cols])).collect();
        let mut bufs = [Vec::new(), Vec::new()];
        for (r, ys) in out.chunks_exact_mut(n).enumerate().take(w.rows()) {
            let row = w.row(r, &mut bufs);
            for (ys, acts) in ys.chunks_mut(TOKENS).zip(acts.chunks(TOKENS)) {
                match ys.len() {
                    4 => ys.copy_from_slice(&tile::<4>(row, acts)),
                    3 => ys.copy_from_slice(&tile::<3>(row, acts)),
                    2 => ys.copy_from_slice(&tile::<2>(row, acts)),
                    _ => ys.copy_from_slice(&tile::<1>(row, acts)),
                }
            }
        }
    }

    /// Weight row `w` times the first `T` of `acts` (each an activation row and its levels as i16).
    #[inline]
    fn tile<const T: usize>(w: IntRow<'_>, acts: &[(ActRow<'_>, &[i16])]) -> [f32; T] {
        let acts: [(ActRow<'_>, &[i16]); T] = std::array::from_fn(|j| acts[j]);
        let mut acc = [f32x4_splat(0.0); T];
        for b in 0..acts[0].1.len() / ACT_BLOCK {
            let levels = widened_block(w.levels, b);
            for (acc, (act, wide)) in acc.iter_mut().zip(&acts) {
                let xs = &wide[b * ACT_BLOCK..][..ACT_BLOCK];
                let dot = |i: usize| i32x4_dot_i16x8(levels[i], load(&xs[8 * i..]));
                let (lo, hi) = (i32x4_add(dot(0), dot(1)), i32x4_add(dot(2), dot(3)));
                let d = act.d[b];
                *acc = if w.group == ACT_BLOCK {
                    f32x4_add(*acc, f32x4_mul(f32x4_convert_i32x4(i32x4_add(lo, hi)), f32x4_splat(w.scale[b] * d)))
                } else {
                    let (s0, s1) = (w.scale[2 * b] * d, w.scale[2 * b + 1] * d);
                    let scaled =
                        f32x4_add(f32x4_mul(f32x4_convert_i32x4(lo), f32x4_splat(s0)), f32x4_mul(f32x4_convert_i32x4(hi), f32x4_splat(s1)));
                    f32x4_add(*acc, scaled)
                };
            }
        }
        // The offsets term in f32 lanes too: a scalar loop is about a tenth of a tile's operations
        // at 576 weights a row.
        std::array::from_fn(|j| horizontal_sum(acc[j]) + w.offset.map_or(0.0, |o| f32_dot(o, acts[j].0.group_sums(w.group))))
    }

    /// Block b's 32 levels as four i16x8 vectors.
    fn widened_block(levels: Levels<'_>, b: usize) -> [v128; 4] {
        let (lo, hi) = match levels {
            Levels::Nibbles(n) => {
                let raw = load(&n[b * ACT_BLOCK / 2..]);
                (v128_and(raw, u8x16_splat(0x0F)), u8x16_shr(raw, 4))
            }
            Levels::Bytes(q) => (load(&q[b * ACT_BLOCK..]), load(&q[b * ACT_BLOCK + 16..])),
        };
        [i16x8_extend_low_i8x16(lo), i16x8_extend_high_i8x16(lo), i16x8_extend_low_i8x16(hi), i16x8_extend_high_i8x16(hi)]
    }

    pub(super) fn f32_dot(a: &[f32], b: &[f32]) -> f32 {
        let (mut acc0, mut acc1) = (f32x4_splat(0.0), f32x4_splat(0.0));
        let (a_body, b_body) = (a.chunks_exact(F32_LANES), b.chunks_exact(F32_LANES));
        let tail: f32 = a_body.remainder().iter().zip(b_body.remainder()).map(|(x, y)| x * y).sum();
        for (a8, b8) in a_body.zip(b_body) {
            acc0 = f32x4_add(acc0, f32x4_mul(load(&a8[..4]), load(&b8[..4])));
            acc1 = f32x4_add(acc1, f32x4_mul(load(&a8[4..]), load(&b8[4..])));
        }
        horizontal_sum(f32x4_add(acc0, acc1)) + tail
    }

    fn horizontal_sum(v: v128) -> f32 {
        f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v) + f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activations::{ActFormat, QuantizedRows};

    /// Every kernel set's tiles give each product the bits of its own dot product, for any count
    /// of rows and tokens (odd ones, and past a token block) and row lengths with and without a
    /// tail.
    #[test]
    fn f32_products_are_each_dot_products_bits() {
        for set in available() {
            for (rows, n, cols) in [(5, 7, 40), (4, 33, 384), (1, 1, 16), (3, 70, 100)] {
                let value = |i: usize| ((i as u64 * 2_654_435_761) % 1000) as f32 / 333.0 - 1.5;
                let w: Vec<f32> = (0..rows * cols).map(value).collect();
                let x: Vec<f32> = (0..n * cols).map(|i| value(i + 17)).collect();
                let mut tiled = vec![0.0; rows * n];
                (set.f32_products)(&w, &x, cols, &mut tiled);
                // One weight row and one token a call: no tile, each product on its own.
                let one_by_one: Vec<f32> = (0..rows * n)
                    .map(|i| {
                        let mut y = [0.0];
                        (set.f32_products)(&w[i / n * cols..][..cols], &x[i % n * cols..][..cols], cols, &mut y);
                        y[0]
                    })
                    .collect();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&tiled), bits(&one_by_one), "{}: {rows} x {n} x {cols}", set.name);
            }
        }
    }

    #[test]
    fn f16_conversion_is_halfs_for_every_value() {
        for bits in 0..=u16::MAX {
            let (got, want) = (f16_to_f32(bits), half::f16::from_bits(bits).to_f32());
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{bits:#06x}: {got} vs {want}");
        }
    }

    /// Every kernel set the machine runs gives the portable code's sums (up to the order of the
    /// f32 additions), for every layout a matrix keeps, with and without offsets, over several
    /// rows and tokens: whole tiles of rows and tokens and the remainders of each.
    #[test]
    fn chosen_kernels_agree_with_the_portable_ones() {
        // 576 weights a row: whole steps of 8 offset groups and a masked last step (18 or 36
        // groups); 160: rows of 5 groups (scalar offsets) and of 10 (one step and a masked one).
        for cols in [576, 160] {
            kernels_agree_with_the_portable_ones(cols);
        }
        let x: Vec<f32> = (0..9 * 576).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0 * (1 + i % 7) as f32).collect();
        let want = f32_dot_portable(&x, &x);
        for set in available() {
            let mut got = [0.0];
            (set.f32_products)(&x, &x, x.len(), &mut got);
            let got = got[0];
            assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{}", set.name);
        }
    }

    fn kernels_agree_with_the_portable_ones(cols: usize) {
        let rows = 5;
        let bytes: Vec<i8> = (0..rows * cols).map(|i| ((i * 37 % 255) as i32 - 127) as i8).collect();
        let nibbles: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 53 % 256) as u8).collect();
        let x: Vec<f32> = (0..9 * cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0 * (1 + i % 7) as f32).collect();
        for (levels, group) in [(Levels::Bytes(&bytes), 16), (Levels::Bytes(&bytes), 32), (Levels::Nibbles(&nibbles), 32)] {
            // Exact in f16, so the f16 storage must give the f32 one's sums.
            let scale: Vec<f32> = (0..rows * cols / group).map(|g| (1 + g % 11) as f32 / 256.0).collect();
            let offset: Vec<f32> = (0..rows * cols / group).map(|g| -((g % 13) as f32) / 64.0).collect();
            let to_f16 = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<u16>>();
            let (scale16, offset16) = (to_f16(&scale), to_f16(&offset));
            let stores = [(Scales::F32(&scale), Scales::F32(&offset)), (Scales::F16(&scale16), Scales::F16(&offset16))];
            for (format, n) in [ActFormat::Q8_0, ActFormat::Q8K].into_iter().flat_map(|f| [1, 3, 9].map(|n| (f, n))) {
                let xq = QuantizedRows::new(&x[..n * cols], format);
                for (offset, (scale, stored_offset)) in [None, Some(())].into_iter().flat_map(|o| stores.map(|s| (o, s))) {
                    let offset = offset.map(|()| stored_offset);
                    let w = IntRows { levels, group, scale, offset, cols };
                    let mut want = vec![0f32; rows * n];
                    products_by(w, &xq, &mut want, int_dot_portable);
                    for set in available() {
                        let mut got = vec![0f32; rows * n];
                        (set.int)(w, &xq, &mut got);
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                                "{} cols {cols} group {group} {format:?} n {n} [{i}]: {g} vs {w}",
                                set.name
                            );
                        }
                    }
                }
            }
        }
    }
}
