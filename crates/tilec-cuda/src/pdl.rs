//! Programmatic dependent launch (compute capability 9.0 and later).
//!
//! A decode step or a small model runs hundreds of short kernels in a row; between two of them
//! the GPU drains the first grid, then launches and distributes the second. With programmatic
//! dependent launch a kernel tells the driver, once every one of its blocks has started, that
//! the next kernel in the stream may launch (`griddepcontrol.launch_dependents`), and a
//! kernel's blocks wait for the previous grid to complete with its memory visible
//! (`griddepcontrol.wait`) before they touch global memory. The next grid's launch and block
//! distribution then overlap the last wave of the current one.
//!
//! Every module the [`crate::Compiler`] builds gets the wait and the trigger as the first
//! statement of each `extern "C" __global__` function ([`inject`]; the cache key covers the
//! injected source), so a kernel never reads or writes before its predecessor has finished,
//! whatever it does. A kernel whose body opens with [`OWN`] calls `tl_pdl_enter()` itself,
//! later: the GEMV family requests its first constant weights before it (`crate::gemv`). Launches ask for the overlap ([`crate::driver::Function::launch_raw`])
//! on such devices unless `TILEC_CUDA_PDL=off`. Without the launch attribute, or before
//! compute capability 9.0, both instructions do nothing.

use std::borrow::Cow;

/// The device function every kernel calls first.
const DEFINITION: &str = r#"#ifndef TL_PDL_ENTER
#define TL_PDL_ENTER
// Programmatic dependent launch: wait for the previous kernel of the stream (its memory
// visible), then let the next one launch once all of this kernel's blocks got here.
__device__ __forceinline__ void tl_pdl_enter() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#endif
"#;

const CALL: &str = " tl_pdl_enter();";
/// Opens the body of a kernel that calls `tl_pdl_enter()` itself, after work that touches
/// nothing an earlier kernel of the stream writes.
pub const OWN: &str = "/* tl_pdl: own */";
const KERNEL: &str = "extern \"C\" __global__";

/// The source with the definition at its top and a call as the first statement of every
/// kernel (`extern "C" __global__` function); unchanged when it has no kernel or already
/// went through here.
pub fn inject(source: &str) -> Cow<'_, str> {
    if !source.contains(KERNEL) || source.starts_with(DEFINITION) {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len() + DEFINITION.len() + 64);
    out.push_str(DEFINITION);
    let mut rest = source;
    while let Some(i) = rest.find(KERNEL) {
        // The body opens at the first brace after the signature (attributes and parameter
        // lists hold parentheses, never braces).
        let Some(j) = rest[i..].find('{') else { break };
        let body = i + j + 1;
        out.push_str(&rest[..body]);
        if !rest[body..].trim_start().starts_with(OWN) {
            out.push_str(CALL);
        }
        rest = &rest[body..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Whether launches on a device of compute capability `cc` ask for the overlap.
pub fn enabled(cc: (u32, u32)) -> bool {
    cc.0 >= 9 && !matches!(std::env::var("TILEC_CUDA_PDL").as_deref(), Ok("off" | "0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_waits_first() {
        let src = "#define X 1\n__device__ void f() { }\nextern \"C\" __global__ void __launch_bounds__(256, 2) a(float* p) {\n  p[0] = 1.f;\n}\nextern \"C\" __global__ void __cluster_dims__(2, 1, 1) b(int n) { if (n) { return; } }\n";
        let out = inject(src);
        assert!(out.starts_with(DEFINITION));
        assert!(out.contains("a(float* p) { tl_pdl_enter();\n  p[0] = 1.f;"), "{out}");
        assert!(out.contains("b(int n) { tl_pdl_enter(); if (n) { return; } }"), "{out}");
        assert_eq!(out.matches("tl_pdl_enter();").count(), 2);
        // The helper before the kernels is left alone; a second pass changes nothing.
        assert!(out.contains("__device__ void f() { }"));
        assert_eq!(inject(&out), out);
        // A kernel that waits where it says is left alone.
        let own = format!("extern \"C\" __global__ void c(int* p) {{\n  {OWN}\n  int x = 1;\n  tl_pdl_enter();\n  p[0] = x;\n}}\n");
        let out = inject(&own);
        assert!(out.starts_with(DEFINITION));
        assert_eq!(out.matches("tl_pdl_enter();").count(), 1, "{out}");
        // No kernel: nothing to do.
        assert!(matches!(inject("__device__ void g() {}"), Cow::Borrowed(_)));
    }
}
