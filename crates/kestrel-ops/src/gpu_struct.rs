//! One definition of each parameter block the GPU kernels read: `gpu_struct!` declares the Rust
//! struct that is uploaded and, from the same tokens, the WGSL struct the shaders include, so the
//! two can never disagree on a field's name, order or type, or on the block's size.

/// The field types a parameter block may hold: 4-byte scalars whose names are the same in Rust
/// and WGSL. Field i then sits at byte 4·i in both languages (WGSL aligns vectors and arrays in
/// a uniform to 16 bytes, which `#[repr(C)]` would not), and the struct has no padding.
pub trait GpuScalar: bytemuck::Pod {}

impl GpuScalar for u32 {}
impl GpuScalar for i32 {}
impl GpuScalar for f32 {}

/// Declares a `#[repr(C)]`, `Pod` parameter block and its WGSL declaration:
///
/// ```
/// kestrel_ops::gpu_struct! {
///     /// Docs and derives as on any struct.
///     #[derive(Debug, Default)]
///     pub struct StepParams as Step {
///         pub n_tokens: u32,
///         pub pos: u32,
///     }
/// }
/// assert_eq!(StepParams::WGSL, "struct Step {\n    n_tokens: u32,\n    pos: u32,\n}\n");
/// ```
///
/// gives `StepParams` (with `Clone`, `Copy`, `bytemuck::Pod` and `bytemuck::Zeroable`; the caller
/// depends on bytemuck) and `StepParams::WGSL`, its WGSL declaration, which kestrel-gpu serves
/// to the shaders' `#include "StepParams"`. Fields must be `u32`, `i32` or `f32`
/// (`GpuScalar`); anything else does not compile.
#[macro_export]
macro_rules! gpu_struct {
    (
        $(#[$attr:meta])*
        $vis:vis struct $name:ident as $wgsl:ident {
            $( $(#[$field_attr:meta])* $field_vis:vis $field:ident : $ty:ident ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        #[repr(C)]
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $( $(#[$field_attr])* $field_vis $field: $ty, )*
        }

        impl $name {
            /// The WGSL declaration of this block, generated from the Rust one.
            $vis const WGSL: &'static str =
                concat!("struct ", stringify!($wgsl), " {\n", $("    ", stringify!($field), ": ", stringify!($ty), ",\n",)* "}\n");
        }

        const _: () = {
            const fn gpu_scalar<T: $crate::GpuScalar>() {}
            $( gpu_scalar::<$ty>(); )*
        };
    };
}

#[cfg(test)]
mod tests {
    gpu_struct! {
        #[derive(Debug, Default, PartialEq)]
        struct Example as Block {
            count: u32,
            /// Docs on a field are allowed.
            scale: f32,
            _pad: i32,
        }
    }

    #[test]
    fn wgsl_lists_the_fields_in_order() {
        assert_eq!(Example::WGSL, "struct Block {\n    count: u32,\n    scale: f32,\n    _pad: i32,\n}\n");
        assert_eq!(std::mem::size_of::<Example>(), 12);
        let bytes = bytemuck::bytes_of(&Example { count: 1, scale: 2.0, _pad: 0 });
        assert_eq!(&bytes[..4], &1u32.to_ne_bytes());
    }
}
