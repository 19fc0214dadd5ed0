//! What the kernels that read weight matrices (matvec, matmul, embedding) share: the weight-type
//! specialization of shaders/quant.wgsl, the `WeightParams` uniform, the epilogue choice and the
//! checks of their arguments.

use kestrel_gguf::GgmlType;
use kestrel_ops::params::GateActivation;

use super::OutputColumns;
use crate::layout::{self, GpuScales};
use crate::{DType, Defines, GpuError, Tensor, WeightTensor};

/// What a matvec or matmul kernel does with `x·Wᵀ` before storing it. Fixed when the kernel is
/// built (each combination is its own pipeline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Epilogue {
    /// Adds `bias[n]` (an f32 vector of N values), e.g. Qwen2's QKV bias.
    pub bias: bool,
    /// Adds into the output instead of overwriting it, `y += x·Wᵀ`: the in-place residual add
    /// of the attention / FFN output into the hidden state.
    pub accumulate: bool,
}

impl Epilogue {
    pub const NONE: Self = Self { bias: false, accumulate: false };
    pub const BIAS: Self = Self { bias: true, accumulate: false };
    pub const ACCUMULATE: Self = Self { bias: false, accumulate: true };

    pub(crate) fn add_defines(self, defines: &mut Defines) {
        if self.bias {
            defines.insert("BIAS".into(), "1".into());
        }
        if self.accumulate {
            defines.insert("ACCUMULATE".into(), "1".into());
        }
    }
}

kestrel_ops::gpu_struct! {
    /// The weight-reading kernels' uniform (`WeightParams` in shaders/quant.wgsl).
    #[derive(Debug)]
    pub(crate) struct WeightParams as WeightParams {
        /// N: output features (or vocabulary for the embedding table).
        rows: u32,
        /// K: input features, contiguous in a row.
        cols: u32,
        /// Quant-section words per row.
        row_words: u32,
        /// First word of the plane section (bit-plane types).
        plane_offset: u32,
        /// First word of the scale section.
        scale_offset: u32,
        /// Rows the activation buffers hold (matmul, embedding).
        max_tokens: u32,
        /// Output column of row 0 (matvec, matmul): y holds several products' columns.
        out_offset: u32,
        /// Values per token row of y (matmul).
        out_stride: u32,
        /// Row 0's row in the whole table, when it is one shard of several (embedding).
        first_row: u32,
        /// Rows of the whole table (embedding).
        total_rows: u32,
    }
}

impl WeightParams {
    /// Checks that `w` is a well-formed weight tensor of a GPU-supported type whose every word
    /// the kernels address fits in u32 indices, and describes it for the shaders.
    pub(crate) fn new(kernel: &str, w: &WeightTensor, max_tokens: u32) -> Result<Self, GpuError> {
        let invalid = |msg: String| GpuError::InvalidArgs(format!("{kernel}: {msg}"));
        if !layout::is_gpu_supported(w.ty) {
            return Err(GpuError::UnsupportedWeights(format!("{kernel}: {}", w.ty)));
        }
        let (rows, cols) = (w.rows as u64, w.cols as u64);
        if rows == 0 || cols == 0 {
            return Err(invalid(format!("empty weight matrix {rows} x {cols}")));
        }
        // The packer's own section sizes; its errors (row length not whole blocks, too many
        // words for u32 indices) name the type and shape.
        let sections = layout::gpu_sections(w.ty, rows, cols).map_err(|e| invalid(e.to_string()))?;
        if rows * cols > u64::from(u32::MAX) {
            return Err(invalid(format!("weight matrix {rows} x {cols} is too large for 32-bit indexing (shard it)")));
        }
        // The sections in order, none overlapping the one before.
        let (plane, scale) = (u64::from(w.plane_offset), u64::from(w.scale_offset));
        if plane < sections.quant_words || scale < plane + sections.plane_words {
            return Err(invalid(format!(
                "sections at words {plane} (plane) and {scale} (scales) overlap the {} quant and {} plane words",
                sections.quant_words, sections.plane_words
            )));
        }
        // The scale section (possibly empty) is the last.
        let needed_words = scale + sections.scale_words;
        if needed_words > u64::from(u32::MAX) {
            return Err(invalid(format!("weight matrix {rows} x {cols} is too large for 32-bit indexing (shard it)")));
        }
        if 4 * needed_words > w.byte_size() {
            return Err(invalid(format!(
                "{} weight buffer of {} bytes is smaller than the {} bytes a {rows} x {cols} matrix needs",
                w.ty,
                w.byte_size(),
                4 * needed_words
            )));
        }
        Ok(Self {
            rows: rows as u32,
            cols: cols as u32,
            row_words: sections.quant_row_words as u32,
            plane_offset: w.plane_offset,
            scale_offset: w.scale_offset,
            max_tokens,
            out_offset: 0,
            out_stride: rows as u32,
            first_row: 0,
            total_rows: rows as u32,
        })
    }

    /// Marks these weights as rows `first_row ..` of a `total_rows`-row table split into shards
    /// (the embedding gather reads only the ids in its range).
    pub(crate) fn for_shard(mut self, first_row: u32, total_rows: u32) -> Self {
        self.first_row = first_row;
        self.total_rows = total_rows;
        self
    }

    pub(crate) fn with_output(mut self, out: OutputColumns) -> Self {
        self.out_offset = out.offset;
        self.out_stride = out.stride;
        self
    }

    pub(crate) fn rows(&self) -> u32 {
        self.rows
    }

    pub(crate) fn cols(&self) -> u32 {
        self.cols
    }

    pub(crate) fn max_tokens(&self) -> u32 {
        self.max_tokens
    }
}

/// The quant.wgsl defines that name `ty`'s family besides its own `WTYPE_<name>`: DENSE, or
/// its scale layout (SCALES_*) and PLANES for the bit-plane types (`layout::gpu_format`,
/// the one list of GPU types); `None` for the types the kernels cannot read.
fn family_defines(ty: GgmlType) -> Option<Vec<&'static str>> {
    let format = layout::gpu_format(ty)?;
    let scales = match format.scales {
        GpuScales::Dense => "DENSE",
        GpuScales::D => "SCALES_D",
        GpuScales::Dm => "SCALES_DM",
        GpuScales::K => "SCALES_K",
        GpuScales::Q6K => "SCALES_Q6K",
    };
    Some(if format.planes { vec![scales, "PLANES"] } else { vec![scales] })
}

/// The defines of a fused gate/up kernel with activation `act` (shaders/activation.wgsl).
pub(crate) fn add_gate_defines(defines: &mut Defines, act: GateActivation) {
    defines.insert("SWIGLU".into(), "1".into());
    if act == GateActivation::Gelu {
        defines.insert("GELU".into(), "1".into());
    }
}

/// The defines that select `ty`'s decoder in quant.wgsl.
pub(crate) fn weight_defines(kernel: &str, ty: GgmlType) -> Result<Defines, GpuError> {
    let family = family_defines(ty).ok_or_else(|| GpuError::UnsupportedWeights(format!("{kernel}: {ty}")))?;
    let mut defines = Defines::new();
    defines.insert(format!("WTYPE_{}", ty.name()), "1".into());
    for name in family {
        defines.insert(name.into(), "1".into());
    }
    Ok(defines)
}

/// Checks that the kernel built for `ty` is given weights of that type.
pub(crate) fn check_weight_type(kernel: &str, ty: GgmlType, w: &WeightTensor) -> Result<(), GpuError> {
    if w.ty != ty {
        return Err(GpuError::InvalidArgs(format!("{kernel}: kernel built for {ty} weights, given {}", w.ty)));
    }
    Ok(())
}

/// Checks that the SwiGLU up projection matches the gate in type, shape and layout.
pub(crate) fn check_same_layout(kernel: &str, gate: &WeightTensor, up: &WeightTensor) -> Result<(), GpuError> {
    let layout = |w: &WeightTensor| (w.ty, w.rows, w.cols, w.plane_offset, w.scale_offset);
    if layout(gate) != layout(up) {
        return Err(GpuError::InvalidArgs(format!(
            "{kernel}: gate ({} {} x {}) and up ({} {} x {}) weights differ",
            gate.ty, gate.rows, gate.cols, up.ty, up.rows, up.cols
        )));
    }
    Ok(())
}

/// Checks that `t` holds at least `len` values of `dtype` (buffers may be larger: the model
/// allocates them once for its largest chunk).
pub(crate) fn check_tensor(kernel: &str, what: &str, t: &Tensor, dtype: DType, len: u64) -> Result<(), GpuError> {
    if t.dtype != dtype {
        return Err(GpuError::InvalidArgs(format!("{kernel}: {what} must be {dtype:?}, got {:?}", t.dtype)));
    }
    if (t.len() as u64) < len {
        return Err(GpuError::InvalidArgs(format!("{kernel}: {what} has {} values ({:?}), needs at least {len}", t.len(), t.shape)));
    }
    Ok(())
}

/// Checks that no buffer is bound twice: WebGPU forbids a buffer that is written in a dispatch
/// from being bound again (the in-place residual add is the `accumulate` epilogue instead).
pub(crate) fn check_distinct(kernel: &str, buffers: &[(&str, &wgpu::Buffer)]) -> Result<(), GpuError> {
    for (i, (name_a, a)) in buffers.iter().enumerate() {
        if let Some((name_b, _)) = buffers[i + 1..].iter().find(|(_, b)| b == a) {
            return Err(GpuError::InvalidArgs(format!("{kernel}: {name_a} and {name_b} are the same buffer")));
        }
    }
    Ok(())
}

/// Checks that a bias is given exactly when the epilogue adds one, and that it fits.
pub(crate) fn check_bias(kernel: &str, epilogue: Epilogue, bias: Option<&Tensor>, rows: u32, y: &Tensor) -> Result<(), GpuError> {
    match (epilogue.bias, bias) {
        (true, Some(b)) => {
            check_tensor(kernel, "bias", b, DType::F32, rows.into())?;
            check_distinct(kernel, &[("bias", &b.buffer), ("output", &y.buffer)])
        }
        (false, None) => Ok(()),
        (true, None) => Err(GpuError::InvalidArgs(format!("{kernel}: kernel built with a bias, none given"))),
        (false, Some(_)) => Err(GpuError::InvalidArgs(format!("{kernel}: bias given to a kernel built without one"))),
    }
}
