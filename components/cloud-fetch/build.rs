//! A small stack for the cloud fetcher. Rust links a wasm module with a
//! 1 MiB stack at the bottom of its linear memory, so what a call touches
//! (the stack's top, the statics, the heap) begins a mebibyte in. The
//! host's pool keeps the first `POOL_KEEP_RESIDENT` bytes of a slot mapped
//! and overwrites them between calls (host/src/runtime/mod.rs) and hands
//! the rest back to the kernel, so with the default stack every call
//! faulted its pages in again. With 128 KiB of stack (the fetcher's
//! deepest use is serde_json's, bounded by its recursion limit of 128),
//! a call's memory lies inside what the pool keeps.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg=-zstack-size={}", 128 << 10);
    }
}
