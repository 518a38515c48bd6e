//! A small stack for the cloud fetcher. Rust links a wasm module with a
//! 1 MiB stack at the bottom of its linear memory, so what a call touches
//! (the stack's top, the statics, the heap) begins a mebibyte in. The
//! host's pool keeps the first `POOL_KEEP_RESIDENT` bytes of a slot mapped
//! and overwrites them between calls (host/src/runtime/mod.rs) and hands
//! the rest back to the kernel, so with the default stack every call
//! faulted its pages in again. With 128 KiB of stack a call's memory lies
//! inside what the pool keeps. The fetcher's deepest use of its stack is
//! serde_json's on the client's body, bounded by its recursion limit (128
//! levels, as the node's own parser): the host test
//! `the_deepest_body_a_client_may_send_fits_the_fetchers_stack` passes
//! with 32 KiB and traps with 8 KiB, so 128 KiB leaves four times the room.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg=-zstack-size={}", 128 << 10);
    }
}
