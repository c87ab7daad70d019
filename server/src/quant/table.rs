//! The `formats!` macro: from the table in [`super`] (one row per ggml type) it generates
//! [`GgmlType`](super::GgmlType) with its ids, names and type lists, each row's [`Row`] and
//! [`WeightRow`] facts, the `formats` module (one file per row's format), and the two
//! dispatch macros that turn a runtime type into a format type:
//!
//! - `with_format!(ty, F => body)` for every row (`F: Format`),
//! - `with_weight!(ty, W => body)` for weight rows (`W: Kernels`); an activation-only type
//!   there is a caller bug and panics.
//!
//! `body` is an expression in which `F` (or `W`) names the format; it usually calls a generic
//! function, `dequantize_blocks::<F>(..)`. Because every match is generated from the same rows, a
//! type cannot be missing from one of them, and a row whose format lacks a trait item (a kernel,
//! its reference, its activation quantiser) does not compile.
//!
//! [`Row`]: super::format::Row
//! [`WeightRow`]: super::format::WeightRow

macro_rules! formats {
    // The dispatch macros are macro_rules written by this one, so their `$` has to come in as a
    // token: the public rule passes it to this one.
    (@with_dollar ($d:tt)
        weights {
            $( $w:ident = $w_id:literal, $w_name:literal, $w_mod:ident::$w_fmt:ident,
               $act_mod:ident::$act_fmt:ident, [$($order:ident),*]; )*
        }
        activations {
            $( $a:ident = $a_id:literal, $a_name:literal, $a_mod:ident::$a_fmt:ident; )*
        }
    ) => {
        /// A tensor element type, numbered as in ggml's `enum ggml_type` (see [`GgmlType::id`]).
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum GgmlType {
            $( $w, )*
            $(
                /// Activation-only format (never a model tensor's type).
                $a,
            )*
        }

        impl GgmlType {
            /// Every row of the table, in its order (`ty as usize` is the index).
            pub const ALL: [GgmlType; [$(GgmlType::$w,)* $(GgmlType::$a,)*].len()] =
                [$(GgmlType::$w,)* $(GgmlType::$a,)*];

            /// Every type a model tensor may have.
            pub const SUPPORTED: [GgmlType; [$(GgmlType::$w,)*].len()] = [$(GgmlType::$w,)*];

            /// The number ggml gives the type (`ggml.h`), as GGUF files store it.
            pub const fn id(self) -> u32 {
                match self {
                    $( GgmlType::$w => $w_id, )*
                    $( GgmlType::$a => $a_id, )*
                }
            }

            /// ggml's name of the type (`type_traits[..].type_name`).
            pub const fn name(self) -> &'static str {
                match self {
                    $( GgmlType::$w => $w_name, )*
                    $( GgmlType::$a => $a_name, )*
                }
            }
        }

        /// One file per format: its block, scalar reference and AVX2 kernel.
        mod formats {
            $( pub mod $w_mod; )*
            $( pub mod $a_mod; )*
        }

        $(
            impl format::Row for formats::$w_mod::$w_fmt {
                const TYPE: GgmlType = GgmlType::$w;
            }
            impl format::WeightRow for formats::$w_mod::$w_fmt {
                type Act = formats::$act_mod::$act_fmt;
                const ORDERS: &'static [DotOrder] = &[$(DotOrder::$order),*];
            }
        )*
        $(
            impl format::Row for formats::$a_mod::$a_fmt {
                const TYPE: GgmlType = GgmlType::$a;
            }
        )*

        macro_rules! with_format {
            ($d ty:expr, $d F:ident => $d body:expr) => {
                match $d ty {
                    $( $crate::quant::GgmlType::$w => {
                        type $d F = $crate::quant::formats::$w_mod::$w_fmt;
                        $d body
                    } )*
                    $( $crate::quant::GgmlType::$a => {
                        type $d F = $crate::quant::formats::$a_mod::$a_fmt;
                        $d body
                    } )*
                }
            };
        }

        macro_rules! with_weight {
            ($d ty:expr, $d W:ident => $d body:expr) => {
                match $d ty {
                    $( $crate::quant::GgmlType::$w => {
                        type $d W = $crate::quant::formats::$w_mod::$w_fmt;
                        $d body
                    } )*
                    $( $crate::quant::GgmlType::$a => {
                        panic!("{} is an activation format, not a weight format", $a_name)
                    } )*
                }
            };
        }
    };
    ($($table:tt)*) => {
        formats!(@with_dollar ($) $($table)*);
    };
}
